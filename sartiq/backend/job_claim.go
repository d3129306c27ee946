package backend

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"hermeshost/sartiq"
)

// claimSQL claims a QUEUED job in one statement: the status change, the attempt
// increment, the new live token and the claim event commit together or not at all, and
// of concurrent claimants exactly one finds the row still QUEUED.
const claimSQL = `
	WITH j AS (
		UPDATE agent_jobs
		SET status = 'CLAIMED', attempt = attempt + 1, claimed_at = $2, last_heartbeat_at = NULL,
		    progress = NULL, token_hash = $3, token_expires_at = $4
		WHERE id = $1 AND status = 'QUEUED'
		RETURNING *
	), t AS (
		INSERT INTO job_tokens (hash, job_id, organization_id, capability, attempt, issued_at)
		SELECT $3, id, organization_id, type, attempt, $2 FROM j
	), e AS (
		INSERT INTO agent_job_events (job_id, attempt, kind, message, at)
		SELECT id, attempt, 'claim', 'claimed', $2 FROM j
	)
	SELECT ` + jobColumns + ` FROM j`

// reclaimSQL re-claims a stale job in one statement: only a CLAIMED or RUNNING job whose
// last heartbeat (or claim) is older than $5; the old token is superseded by the new one
// and marked revoked, the attempt grows, and the reclaim event is written.
const reclaimSQL = `
	WITH j AS (
		UPDATE agent_jobs
		SET status = 'CLAIMED', attempt = attempt + 1, claimed_at = $2, last_heartbeat_at = NULL,
		    progress = NULL, token_hash = $3, token_expires_at = $4
		WHERE id = $1 AND status IN ('CLAIMED', 'RUNNING') AND coalesce(last_heartbeat_at, claimed_at) < $5
		RETURNING *
	), old AS (
		UPDATE job_tokens SET revoked_at = $2, revoked_reason = 'reclaim'
		WHERE job_id IN (SELECT id FROM j) AND revoked_at IS NULL
	), t AS (
		INSERT INTO job_tokens (hash, job_id, organization_id, capability, attempt, issued_at)
		SELECT $3, id, organization_id, type, attempt, $2 FROM j
	), e AS (
		INSERT INTO agent_job_events (job_id, attempt, kind, message, at)
		SELECT id, attempt, 'reclaim', 're-claimed: the previous attempt stopped heartbeating', $2 FROM j
	)
	SELECT ` + jobColumns + ` FROM j`

// claimAgentJob: exactly one of concurrent claimants wins; the others get 409.
func (h *Handler) claimAgentJob(w http.ResponseWriter, r *http.Request, c *call) error {
	return h.claim(w, r, c, "claim", claimSQL)
}

// reclaimAgentJob: only a job that stopped heartbeating; 409 otherwise.
func (h *Handler) reclaimAgentJob(w http.ResponseWriter, r *http.Request, c *call) error {
	return h.claim(w, r, c, "reclaim", reclaimSQL, h.staleBefore())
}

func (h *Handler) claim(w http.ResponseWriter, r *http.Request, c *call, kind, query string, args ...any) error {
	token, hash, err := newSecret()
	if err != nil {
		return err
	}
	now := h.now()
	expires := now.Add(h.cfg.TokenTTL)
	j, err := h.scanJob(r, h.db.QueryRow(r.Context(), query, append([]any{c.jobID, now, hash, expires}, args...)...))
	if errors.Is(err, pgx.ErrNoRows) {
		h.metrics.conflicts.WithLabelValues(kind).Inc()
		return h.claimRefusal(r.Context(), c.jobID, kind)
	}
	if err != nil {
		return fmt.Errorf("%s job %s: %w", kind, c.jobID, err)
	}
	h.metrics.claims.WithLabelValues(kind).Inc()
	h.log.Info("job claimed", "kind", kind, "job", j.ID, "org", j.OrganizationID, "type", j.Type, "attempt", j.Attempt)
	return writeJSON(w, http.StatusOK, sartiq.Claim{
		Job: j, OrganizationID: j.OrganizationID, JobToken: token, TokenExpiresAt: expires, ManifestURL: j.Manifest,
	})
}

func (h *Handler) claimRefusal(ctx context.Context, id, kind string) error {
	var status string
	err := h.db.QueryRow(ctx, `SELECT status FROM agent_jobs WHERE id = $1`, id).Scan(&status)
	if errors.Is(err, pgx.ErrNoRows) {
		return notFound("no such job")
	}
	if err != nil {
		return fmt.Errorf("%s job %s: read job: %w", kind, id, err)
	}
	if kind == "claim" {
		return conflict("not_queued", "the job is %s, not QUEUED", status)
	}
	if status == sartiq.StatusClaimed || status == sartiq.StatusRunning {
		return conflict("not_stale", "the job is %s and its claimant heartbeated within %s", status, h.cfg.StaleAfter)
	}
	return conflict("not_claimed", "the job is %s; only a stale CLAIMED or RUNNING job can be re-claimed", status)
}
