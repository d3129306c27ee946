package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"hermeshost/sartiq"
)

// jobColumns is what every query that answers with a job selects, in scanJob's order.
const jobColumns = `id::text, type, organization_id, status, attempt, created_at, claimed_at,
	last_heartbeat_at, finished_at, progress, result, error`

// scanJob reads jobColumns and fills in what is computed: the manifest URL and staleness.
func (h *Handler) scanJob(r *http.Request, row pgx.Row) (sartiq.Job, error) {
	var j sartiq.Job
	var progress, result []byte
	if err := row.Scan(&j.ID, &j.Type, &j.OrganizationID, &j.Status, &j.Attempt, &j.CreatedAt, &j.ClaimedAt,
		&j.LastHeartbeatAt, &j.FinishedAt, &progress, &result, &j.Error); err != nil {
		return j, err
	}
	j.Progress, j.Result = json.RawMessage(progress), json.RawMessage(result)
	j.Manifest = h.baseURL(r) + "/manifests/" + j.ID
	j.Stale = h.stale(j)
	return j, nil
}

// stale: CLAIMED or RUNNING and silent (no heartbeat, else no claim) for longer than StaleAfter.
func (h *Handler) stale(j sartiq.Job) bool {
	if j.Status != sartiq.StatusClaimed && j.Status != sartiq.StatusRunning {
		return false
	}
	last := j.ClaimedAt
	if j.LastHeartbeatAt != nil {
		last = j.LastHeartbeatAt
	}
	return last != nil && last.Before(h.staleBefore())
}

// staleBefore is the instant before which a job's last sign of life makes it stale.
func (h *Handler) staleBefore() time.Time { return h.now().Add(-h.cfg.StaleAfter) }

func (h *Handler) baseURL(r *http.Request) string {
	if h.cfg.PublicURL != "" {
		return h.cfg.PublicURL
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// refusal explains why a conditional write made with c's job token changed nothing: the
// token was superseded or expired meanwhile, or the job is not in a state that allows
// the operation. It only reads; the write itself was already refused.
func (h *Handler) refusal(ctx context.Context, c *call, what string) error {
	var status string
	var live bool
	var expires *time.Time
	err := h.db.QueryRow(ctx, `SELECT status, token_hash IS NOT DISTINCT FROM $2, token_expires_at FROM agent_jobs WHERE id = $1`,
		c.token.jobID, c.token.hash).Scan(&status, &live, &expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return notFound("no such job")
	}
	if err != nil {
		return fmt.Errorf("%s job %s: read job: %w", c.op, c.token.jobID, err)
	}
	switch {
	case !live:
		return h.deny("token_revoked", "this job token was revoked; stop working on the job")
	case expires != nil && !h.now().Before(*expires):
		return h.deny("token_expired", "this job token has expired")
	}
	return conflict("wrong_status", "cannot %s a job that is %s", what, status)
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode response: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
	return nil
}

// jobByID reads one job.
func (h *Handler) jobByID(r *http.Request, id string) (sartiq.Job, error) {
	j, err := h.scanJob(r, h.db.QueryRow(r.Context(), `SELECT `+jobColumns+` FROM agent_jobs WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return j, notFound("no such job")
	}
	if err != nil {
		return j, fmt.Errorf("read job %s: %w", id, err)
	}
	return j, nil
}
