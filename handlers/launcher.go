// Package handlers holds the operator UIs' HTTP handlers, one file per page or action, each
// a method on the handler struct of its UI: launcher_*.go on Launcher, dashboard_*.go on
// Dashboard. What both share (rendering, the error page, redirects) is in render.go.
//
// Two kinds of session meet here and are never called by the same name: a login session
// is the launcher's record of an operator's login (scs, in Postgres: LoginSessions); a
// Hermes session is a conversation of the agent in an org's state.db (HermesSession...).
package handlers

import (
	"context"

	"github.com/alexedwards/scs/v2"

	"hermeshost/operator"
)

// LoginSessionOperator is the login session's key holding the logged-in operator's name.
const LoginSessionOperator = "operator"

// LoginSessionPasswordAt is the login session's key holding when the operator's password
// was set, as at the login (Unix nanoseconds): a password changed since ends the session.
const LoginSessionPasswordAt = "password_at"

// Launcher is the launcher's pages: login, logout, and the index of the operator's orgs.
type Launcher struct {
	Pages
	Operators     *operator.Store
	LoginSessions *scs.SessionManager
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
