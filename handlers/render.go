package handlers

import (
	"bytes"
	"log/slog"
	"net/http"

	"github.com/a-h/templ"

	"hermeshost/templates"
)

// Pages is what the page handlers of both UIs share: their log and the path prefix their
// pages and static files are served under ("" for the launcher, "/orgs/<org>" for a
// dashboard), which every page, the error page too, builds its URLs from.
type Pages struct {
	Log    *slog.Logger
	Prefix string
}

// Paths is the prefix as the templates build URLs from it.
func (p Pages) Paths() templates.Paths { return templates.Paths{Prefix: p.Prefix} }

// Render writes a page or fragment with status. It is rendered whole before anything is
// sent, so a component that fails (or panics) leaves room for the error page rather than
// half a page under a 200.
func (p Pages) Render(w http.ResponseWriter, r *http.Request, status int, c templ.Component) {
	var buf bytes.Buffer
	if err := c.Render(r.Context(), &buf); err != nil {
		if r.Context().Err() != nil {
			return // the browser went away
		}
		p.Failed(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if _, err := buf.WriteTo(w); err != nil {
		p.Log.Debug("write page", "path", r.URL.Path, "err", err)
	}
}

// Error answers with the HTML error page: status, and message, which says what went wrong
// in the operator's words (never a stack trace or an internal error's text).
func (p Pages) Error(w http.ResponseWriter, r *http.Request, status int, message string) {
	v := templates.ErrorView{Paths: p.Paths(), Status: status, Title: http.StatusText(status), Message: message}
	var buf bytes.Buffer
	if err := templates.ErrorPage(v).Render(r.Context(), &buf); err != nil {
		// The error page itself failed: plain text says the same.
		p.Log.Error("render the error page", "path", r.URL.Path, "err", err)
		http.Error(w, message, status)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

// FailedMessage is what the operator reads of a failure the host cannot explain on the page.
const FailedMessage = "Something went wrong on the host; the error is in its log."

// Failed answers a request that could not be served: the cause logged, the operator told
// only that it happened, on the error page.
func (p Pages) Failed(w http.ResponseWriter, r *http.Request, err error) {
	p.Log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	p.Error(w, r, http.StatusInternalServerError, FailedMessage)
}

// NotFound answers with the error page's 404, saying what was not found.
func (p Pages) NotFound(w http.ResponseWriter, r *http.Request, message string) {
	p.Error(w, r, http.StatusNotFound, message)
}

// IsHTMX reports whether htmx made the request (it swaps the answer into a page).
func IsHTMX(r *http.Request) bool { return r.Header.Get("HX-Request") == "true" }

// Redirect sends the browser on to target after a request: 303 See Other, or, for an htmx
// request, which would swap the page a redirect leads to into its target, HX-Redirect, on
// which htmx loads target as a whole page.
func Redirect(w http.ResponseWriter, r *http.Request, target string) {
	if IsHTMX(r) {
		w.Header().Set("HX-Redirect", target)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}
