package backend

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"hermeshost/sartiq"
)

// transition is a change to a job made with its live job token. It runs as one
// statement that matches only while the presented token is the job's live, unexpired
// token and the job is in one of the from statuses, and writes the event in the same
// statement. Parameters: $1 job, $2 token hash, $3 now, $4 event kind, $5 message,
// $6 data (JSON or NULL), and $7 where an operation needs a value of its own.
type transition struct {
	verb string
	from string
	set  string
	// ends marks a terminal or releasing transition: the token is cleared and revoked.
	ends bool
}

func (t transition) sql() string {
	revoke := ""
	if t.ends {
		revoke = `, t AS (
		UPDATE job_tokens SET revoked_at = $3, revoked_reason = $4
		WHERE hash = $2 AND job_id IN (SELECT id FROM j))`
	}
	return `
	WITH j AS (
		UPDATE agent_jobs SET ` + t.set + `
		WHERE id = $1 AND token_hash = $2 AND token_expires_at > $3 AND status IN (` + t.from + `)
		RETURNING *
	)` + revoke + `, e AS (
		INSERT INTO agent_job_events (job_id, attempt, kind, message, data, at)
		SELECT id, attempt, $4, $5, $6::jsonb, $3 FROM j
	)
	SELECT ` + jobColumns + ` FROM j`
}

var (
	startTransition = transition{verb: "start", from: `'CLAIMED'`,
		set: `status = 'RUNNING'`}
	heartbeatTransition = transition{verb: "heartbeat", from: `'CLAIMED', 'RUNNING'`,
		set: `last_heartbeat_at = $3, token_expires_at = $7, progress = coalesce($6::jsonb, progress)`}
	completeTransition = transition{verb: "complete", from: `'RUNNING'`, ends: true,
		set: `status = 'COMPLETED', result = $6::jsonb, finished_at = $3, token_hash = NULL, token_expires_at = NULL`}
	failTransition = transition{verb: "fail", from: `'CLAIMED', 'RUNNING'`, ends: true,
		set: `status = 'FAILED', error = $5, finished_at = $3, token_hash = NULL, token_expires_at = NULL`}
	releaseTransition = transition{verb: "release", from: `'CLAIMED', 'RUNNING'`, ends: true,
		set: `status = 'QUEUED', claimed_at = NULL, last_heartbeat_at = NULL, progress = NULL, token_hash = NULL, token_expires_at = NULL`}
)

// apply runs t with c's token. A refused transition is explained by refusal.
func (h *Handler) apply(r *http.Request, c *call, t transition, kind, message string, data json.RawMessage, own ...any) (sartiq.Job, error) {
	args := append([]any{c.token.jobID, c.token.hash, h.now(), kind, message, nullJSON(data)}, own...)
	j, err := h.scanJob(r, h.db.QueryRow(r.Context(), t.sql(), args...))
	if errors.Is(err, pgx.ErrNoRows) {
		return j, h.refusal(r.Context(), c, t.verb)
	}
	if err != nil {
		return j, fmt.Errorf("%s job %s: %w", t.verb, c.token.jobID, err)
	}
	return j, nil
}

// nullJSON is raw as a query argument: SQL NULL when absent or null.
func nullJSON(raw json.RawMessage) any {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return string(raw)
}
