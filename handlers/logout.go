package handlers

import "net/http"

// Logout is POST /logout: the session is destroyed in the database, not only forgotten by
// the browser.
func (h *Launcher) Logout(w http.ResponseWriter, r *http.Request) {
	name := h.Sessions.GetString(r.Context(), SessionOperator)
	if err := h.Sessions.Destroy(r.Context()); err != nil {
		h.failed(w, r, err)
		return
	}
	if name != "" {
		h.Log.Info("operator logged out", "operator", name)
	}
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
