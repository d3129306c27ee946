package backend

import (
	"net/http"

	"hermeshost/sartiq"
)

// releaseAgentJob puts a CLAIMED or RUNNING job back in the queue and revokes the token;
// the attempt number stays, and the next claim makes the next attempt.
func (h *Handler) releaseAgentJob(w http.ResponseWriter, r *http.Request, c *call) error {
	var req sartiq.ReleaseRequest
	if err := decodeBody(r, &req, true); err != nil {
		return err
	}
	if err := validateRelease(&req); err != nil {
		return err
	}
	msg := req.Reason
	if msg == "" {
		msg = "released"
	}
	j, err := h.apply(r, c, releaseTransition, sartiq.EventRelease, msg, nil)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sartiq.JobResponse{Job: j})
}
