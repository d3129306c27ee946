// Package templates holds the templ components and pages of the operator UIs. Pages take
// plain view structs, never database rows; the generated *_templ.go files are committed and
// `make lint` fails when they are stale. `make generate` runs `go tool templ generate` from
// the repository root, so the file names in the generated errors read templates/*.templ.
//
// Files are named by the UI they belong to (launcher_*, dashboard_*); layout and error are
// both UIs'. Every URL a page holds is built by Paths from its UI's prefix, so a dashboard
// served under /orgs/<org> links, fetches and loads its styles under it.
package templates

import (
	"net/url"

	"github.com/a-h/templ"
)

// Paths builds a UI's URLs under its prefix: "" for the launcher, "/orgs/<org>" for a
// dashboard. The prefix is checked where it is configured (a path of plain segments), so
// what Paths adds to it decides what a URL is.
type Paths struct {
	Prefix string
}

// Static is the URL of one of the embedded static files, e.g. "app.css".
func (p Paths) Static(file string) templ.SafeURL { return templ.URL(p.Prefix + "/static/" + file) }

// Page is the URL of a page of the UI, path starting with "/".
func (p Paths) Page(path string) templ.SafeURL { return templ.URL(p.Prefix + path) }

// PageWith is Page with a query, encoded (so no value can end it or add another).
func (p Paths) PageWith(path string, q url.Values) templ.SafeURL {
	if len(q) == 0 {
		return p.Page(path)
	}
	return templ.URL(p.Prefix + path + "?" + q.Encode())
}

// HX is a page's URL for an hx-get or hx-post attribute: only the prefix and a fixed path,
// never text from outside (DESIGN: nothing untrusted in hx-* attributes).
func (p Paths) HX(path string) string { return string(p.Page(path)) }

// DashboardHome is the launcher's link to an org's dashboard, for an org id already checked
// as one (orghome.ValidID); the id is escaped all the same.
func DashboardHome(org string) templ.SafeURL {
	return templ.URL("/orgs/" + url.PathEscape(org) + "/")
}

// ErrorView is the error page of either UI.
type ErrorView struct {
	Paths   Paths
	Status  int
	Title   string // the status's text, e.g. "Not Found"
	Message string // what went wrong, in the operator's words
}
