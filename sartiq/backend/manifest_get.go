package backend

import (
	"fmt"
	"net/http"
)

// getAgentJobManifest serves the manifest a job names, to that job's own token only.
func (h *Handler) getAgentJobManifest(w http.ResponseWriter, r *http.Request, c *call) error {
	var doc []byte
	if err := h.db.QueryRow(r.Context(), `SELECT manifest FROM agent_jobs WHERE id = $1`, c.jobID).Scan(&doc); err != nil {
		return fmt.Errorf("read manifest of job %s: %w", c.jobID, err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(append(doc, '\n'))
	return nil
}
