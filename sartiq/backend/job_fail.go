package backend

import (
	"net/http"

	"hermeshost/sartiq"
)

// failAgentJob ends a CLAIMED or RUNNING job with a reason and revokes the token.
func (h *Handler) failAgentJob(w http.ResponseWriter, r *http.Request, c *call) error {
	var req sartiq.FailRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if err := validateFail(&req); err != nil {
		return err
	}
	j, err := h.apply(r, c, failTransition, sartiq.EventFail, req.Reason, nil)
	if err != nil {
		return err
	}
	h.log.Info("job failed", "job", j.ID, "org", j.OrganizationID, "attempt", j.Attempt)
	return writeJSON(w, http.StatusOK, sartiq.JobResponse{Job: j})
}
