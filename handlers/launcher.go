// Package handlers holds the operator UIs' HTTP handlers, one file per page or action, each
// a method on the handler struct of its UI.
package handlers

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/a-h/templ"
	"github.com/alexedwards/scs/v2"

	"hermeshost/operator"
)

// SessionOperator is the session key holding the logged-in operator's name.
const SessionOperator = "operator"

// Launcher is the launcher's pages: login, logout, and the index of the operator's orgs.
type Launcher struct {
	Operators *operator.Store
	Sessions  *scs.SessionManager
	Log       *slog.Logger
	// RefreshSeconds is how often the index's org table reloads itself.
	RefreshSeconds int
}

type operatorKey struct{}

// WithOperator is ctx carrying the logged-in operator (set by the web layer's login check).
func WithOperator(ctx context.Context, op operator.Operator) context.Context {
	return context.WithValue(ctx, operatorKey{}, op)
}

// OperatorFrom is the logged-in operator of a request that passed the login check.
func OperatorFrom(ctx context.Context) operator.Operator {
	op, _ := ctx.Value(operatorKey{}).(operator.Operator)
	return op
}

// render writes a page or fragment with status; a failure is logged (the status line has
// gone out by then).
func (h *Launcher) render(w http.ResponseWriter, r *http.Request, status int, c templ.Component) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := c.Render(r.Context(), w); err != nil {
		h.Log.Warn("render", "path", r.URL.Path, "err", err)
	}
}

// failed answers a request the launcher could not serve: logged with its cause, a plain
// message to the operator.
func (h *Launcher) failed(w http.ResponseWriter, r *http.Request, err error) {
	h.Log.Error("launcher request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	http.Error(w, "Something went wrong on the host; the error is in its log.", http.StatusInternalServerError)
}
