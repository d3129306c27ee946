package web

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"

	"hermeshost/handlers"
	"hermeshost/static"
)

// ContentSecurityPolicy keeps both UIs' pages to their origin's own scripts and styles
// (htmx is served from the static files, configured without eval or inline styles), out of
// frames, and their forms posting only to it.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// SecurityHeaders sets the headers every answer of both UIs carries (setSecurityHeaders).
func SecurityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		setSecurityHeaders(w.Header(), r.URL.Path)
		next.ServeHTTP(w, r)
	})
}

// setSecurityHeaders sets the policy, no sniffing, the referrer policy and no caching:
// pages hold an org's data. Only a static file keeps a cache lifetime of its own (the
// static handler replaces no-store with it). The launcher's proxy sets the same on what it
// passes on from a dashboard, after the fact.
func setSecurityHeaders(h http.Header, path string) {
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	if !isStaticPath(path) || h.Get("Cache-Control") == "" {
		h.Set("Cache-Control", "no-store")
	}
}

// isStaticPath says whether path is under a UI's static files: /static/ for the launcher,
// /orgs/<org>/static/ for a dashboard.
func isStaticPath(path string) bool {
	if strings.HasPrefix(path, "/static/") {
		return true
	}
	rest, ok := strings.CutPrefix(path, "/orgs/")
	if !ok {
		return false
	}
	_, rest, _ = strings.Cut(rest, "/")
	return strings.HasPrefix(rest, "static/")
}

// MountStatic serves the embedded static files (static.Handler) at prefix/static/ on r.
func MountStatic(r chi.Router, prefix string) {
	r.Handle(prefix+"/static/*", http.StripPrefix(prefix+"/static", static.Handler()))
}

// Recoverer answers a handler's panic with the HTML error page of pages (never a stack
// trace), and logs what panicked. http.ErrAbortHandler goes on up, as net/http means it to.
func Recoverer(pages handlers.Pages) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				v := recover()
				if v == nil {
					return
				}
				if v == http.ErrAbortHandler {
					panic(v)
				}
				pages.Log.Error("handler panic", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v))
				pages.Error(w, r, http.StatusInternalServerError, handlers.FailedMessage)
			}()
			next.ServeHTTP(w, r)
		})
	}
}

// notFound is the UI's 404 for routes it does not have, on its error page with the same
// headers as every other page.
func notFound(pages handlers.Pages) http.HandlerFunc {
	return SecurityHeaders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pages.NotFound(w, r, "There is no page at this address.")
	})).ServeHTTP
}
