package handlers

import "net/http"

// Logout is POST /logout: the session is destroyed in the database, not only forgotten by
// the browser.
func (h *Launcher) Logout(w http.ResponseWriter, r *http.Request) {
	name := h.LoginSessions.GetString(r.Context(), LoginSessionOperator)
	if err := h.LoginSessions.Destroy(r.Context()); err != nil {
		h.Failed(w, r, err)
		return
	}
	if name != "" {
		h.Log.Info("operator logged out", "operator", name)
	}
	Redirect(w, r, "/login")
}
