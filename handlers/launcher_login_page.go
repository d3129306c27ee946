package handlers

import (
	"net/http"

	"hermeshost/templates"
)

// LoginPage is GET /login: the form, or the index for an operator already logged in.
func (h *Launcher) LoginPage(w http.ResponseWriter, r *http.Request) {
	if h.LoginSessions.GetString(r.Context(), LoginSessionOperator) != "" {
		Redirect(w, r, "/")
		return
	}
	h.Render(w, r, http.StatusOK, templates.LoginPage(templates.LoginView{Next: LocalPath(r.URL.Query().Get("next"))}))
}

// LocalPath is p when it is a path on this host, else "/": a next= parameter never sends
// an operator to another site.
func LocalPath(p string) string {
	if len(p) == 0 || p[0] != '/' || (len(p) > 1 && (p[1] == '/' || p[1] == '\\')) {
		return "/"
	}
	for _, c := range p {
		if c < ' ' || c == 0x7f {
			return "/"
		}
	}
	return p
}
