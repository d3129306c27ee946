package backend

import (
	"net/http"

	"hermeshost/sartiq"
)

// completeAgentJob ends a RUNNING job with its result and revokes the token.
func (h *Handler) completeAgentJob(w http.ResponseWriter, r *http.Request, c *call) error {
	var req sartiq.CompleteRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if err := validateComplete(&req); err != nil {
		return err
	}
	j, err := h.apply(r, c, completeTransition, sartiq.EventComplete, "completed", req.Result)
	if err != nil {
		return err
	}
	h.log.Info("job completed", "job", j.ID, "org", j.OrganizationID, "attempt", j.Attempt)
	return writeJSON(w, http.StatusOK, sartiq.JobResponse{Job: j})
}
