package handlers

import (
	"net/http"

	"hermeshost/templates"
)

// Orgs is GET /orgs: the org table alone, which the index's htmx swaps in every
// RefreshSeconds.
func (h *Launcher) Orgs(w http.ResponseWriter, r *http.Request) {
	v, err := h.orgs(r)
	if err != nil {
		h.Failed(w, r, err)
		return
	}
	h.Render(w, r, http.StatusOK, templates.Orgs(v))
}
