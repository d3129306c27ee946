package backend

import (
	"fmt"
	"net/http"
	"strconv"

	"hermeshost/sartiq"
)

// listAgentJobEvents pages through a job's log, oldest first. The cursor is the last
// event's id.
func (h *Handler) listAgentJobEvents(w http.ResponseWriter, r *http.Request, c *call) error {
	limit, err := queryInt(r, "limit", 500, 1000)
	if err != nil {
		return err
	}
	var after int64
	if cur := r.URL.Query().Get("cursor"); cur != "" {
		after, err = strconv.ParseInt(cur, 10, 64)
		if err != nil || after < 0 {
			return badRequest("cursor is not one this server handed out")
		}
	}
	var exists bool
	if err := h.db.QueryRow(r.Context(), `SELECT EXISTS (SELECT 1 FROM agent_jobs WHERE id = $1)`, c.jobID).Scan(&exists); err != nil {
		return fmt.Errorf("list events of job %s: %w", c.jobID, err)
	}
	if !exists {
		return notFound("no such job")
	}
	rows, err := h.db.Query(r.Context(), `
		SELECT `+eventColumns+` FROM agent_job_events
		WHERE job_id = $1 AND id > $2 ORDER BY id LIMIT $3`, c.jobID, after, limit+1)
	if err != nil {
		return fmt.Errorf("list events of job %s: %w", c.jobID, err)
	}
	defer rows.Close()
	page := sartiq.EventPage{Events: []sartiq.Event{}}
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return fmt.Errorf("list events of job %s: %w", c.jobID, err)
		}
		page.Events = append(page.Events, e)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list events of job %s: %w", c.jobID, err)
	}
	if len(page.Events) > limit {
		page.Events = page.Events[:limit]
		page.NextCursor = strconv.FormatInt(page.Events[limit-1].ID, 10)
	}
	return writeJSON(w, http.StatusOK, page)
}
