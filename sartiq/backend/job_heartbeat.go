package backend

import (
	"net/http"

	"hermeshost/sartiq"
)

// heartbeatAgentJob records a sign of life (with optional progress) and extends the
// token's expiry. A revoked token is 409: the worker must stop.
func (h *Handler) heartbeatAgentJob(w http.ResponseWriter, r *http.Request, c *call) error {
	var req sartiq.HeartbeatRequest
	if err := decodeBody(r, &req, true); err != nil {
		return err
	}
	if err := validateHeartbeat(&req); err != nil {
		return err
	}
	kind := sartiq.EventHeartbeat
	if nullJSON(req.Progress) != nil {
		kind = sartiq.EventProgress
	}
	expires := h.now().Add(h.cfg.TokenTTL)
	j, err := h.apply(r, c, heartbeatTransition, kind, "", req.Progress, expires)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sartiq.Heartbeat{Job: j, TokenExpiresAt: expires})
}
