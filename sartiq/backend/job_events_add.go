package backend

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"hermeshost/sartiq"
)

// eventColumns is what answers with an event select, in scanEvent's order.
const eventColumns = `id, job_id::text, attempt, kind, message, data, at`

func scanEvent(row pgx.Row) (sartiq.Event, error) {
	var e sartiq.Event
	var data []byte
	err := row.Scan(&e.ID, &e.JobID, &e.Attempt, &e.Kind, &e.Message, &data, &e.At)
	e.Data = data
	return e, err
}

// addAgentJobEvent appends a worker's event to the job's log, under the current attempt.
// The row lock (FOR SHARE) orders it against a concurrent re-claim.
func (h *Handler) addAgentJobEvent(w http.ResponseWriter, r *http.Request, c *call) error {
	var req sartiq.EventRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if err := validateEvent(&req); err != nil {
		return err
	}
	e, err := scanEvent(h.db.QueryRow(r.Context(), `
		WITH j AS (
			SELECT id, attempt FROM agent_jobs
			WHERE id = $1 AND token_hash = $2 AND token_expires_at > $3 AND status IN ('CLAIMED', 'RUNNING')
			FOR SHARE
		)
		INSERT INTO agent_job_events (job_id, attempt, kind, message, data, at)
		SELECT id, attempt, $4, $5, $6::jsonb, $3 FROM j
		RETURNING `+eventColumns,
		c.token.jobID, c.token.hash, h.now(), req.Kind, req.Message, nullJSON(req.Data)))
	if errors.Is(err, pgx.ErrNoRows) {
		return h.refusal(r.Context(), c, "add an event to")
	}
	if err != nil {
		return fmt.Errorf("add event to job %s: %w", c.token.jobID, err)
	}
	return writeJSON(w, http.StatusCreated, e)
}
