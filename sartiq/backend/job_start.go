package backend

import (
	"errors"
	"net/http"

	"hermeshost/sartiq"
)

// startAgentJob moves CLAIMED to RUNNING. Starting a job that this token already started
// answers the job again, so a start whose response was lost can be retried.
func (h *Handler) startAgentJob(w http.ResponseWriter, r *http.Request, c *call) error {
	j, err := h.apply(r, c, startTransition, sartiq.EventStart, "started", nil)
	var ae *apiError
	if errors.As(err, &ae) && ae.code == "wrong_status" {
		cur, rerr := h.jobByID(r, c.token.jobID)
		if rerr == nil && cur.Status == sartiq.StatusRunning {
			return writeJSON(w, http.StatusOK, sartiq.JobResponse{Job: cur})
		}
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sartiq.JobResponse{Job: j})
}
