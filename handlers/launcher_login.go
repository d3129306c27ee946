package handlers

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"hermeshost/operator"
	"hermeshost/templates"
)

// maxLoginForm bounds the login form's body.
const maxLoginForm = 8 << 10

// Login is POST /login: check the name and password, start a fresh session (a new token,
// so one planted before the login is worthless), and go where the operator was headed.
func (h *Launcher) Login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginForm)
	if err := r.ParseForm(); err != nil {
		h.Render(w, r, http.StatusBadRequest, templates.LoginPage(templates.LoginView{Error: "The form could not be read; try again."}))
		return
	}
	name, password, next := r.PostForm.Get("name"), r.PostForm.Get("password"), LocalPath(r.PostForm.Get("next"))
	op, err := h.Operators.Authenticate(r.Context(), name, password, r.RemoteAddr)
	var throttled *operator.ThrottledError
	if errors.As(err, &throttled) {
		h.Log.Warn("login throttled", "operator", name, "remote", r.RemoteAddr, "until", throttled.Until)
		wait := max(time.Until(throttled.Until), time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(int(wait.Round(time.Second).Seconds())))
		h.Render(w, r, http.StatusTooManyRequests, templates.LoginPage(templates.LoginView{Name: name, Next: next,
			Error: "Too many failed logins for this name from here. Try again after " + throttled.Until.UTC().Format("15:04:05 UTC") + "."}))
		return
	}
	if errors.Is(err, operator.ErrBadLogin) {
		h.Log.Info("login refused", "operator", name, "remote", r.RemoteAddr)
		h.Render(w, r, http.StatusUnauthorized, templates.LoginPage(templates.LoginView{Name: name, Next: next, Error: "Wrong name or password."}))
		return
	}
	if err != nil {
		h.Failed(w, r, err)
		return
	}
	if err := h.LoginSessions.RenewToken(r.Context()); err != nil {
		h.Failed(w, r, err)
		return
	}
	h.LoginSessions.Put(r.Context(), LoginSessionOperator, op.Name)
	h.LoginSessions.Put(r.Context(), LoginSessionPasswordAt, op.PasswordAt.UnixNano())
	h.Log.Info("operator logged in", "operator", op.Name, "remote", r.RemoteAddr)
	Redirect(w, r, next)
}
