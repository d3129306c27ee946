// Package templates holds the templ components and pages of the operator UIs. Pages take
// plain view structs, never database rows; the generated *_templ.go files are committed and
// `make lint` fails when they are stale. `make generate` runs `go tool templ generate` from
// the repository root, so the file names in the generated errors read templates/*.templ.
package templates

// LoginView is the login page: the name typed so far, why the last try failed, and where
// to go after.
type LoginView struct {
	Name  string
	Error string
	Next  string
}

// IndexView is the launcher's index for one operator.
type IndexView struct {
	Operator string
	Orgs     OrgsView
}

// OrgsView is the table of the operator's orgs, refreshed in place every RefreshSeconds.
type OrgsView struct {
	Rows []OrgRow
	// Others is how many orgs the host knows that are not granted to the operator.
	Others         int
	RefreshSeconds int
}

// OrgRow is one org's line.
type OrgRow struct {
	Org           string
	Queued        int
	Running       int
	Completed     int
	Failed        int
	LiveSubagents int
	LastActivity  string // "-" when there was none
}
