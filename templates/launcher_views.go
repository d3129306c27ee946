package templates

import "github.com/a-h/templ"

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
	Org string
	// Dashboard is the link to the org's dashboard (DashboardHome); empty for an id that is
	// not a valid one, which has no dashboard.
	Dashboard     templ.SafeURL
	Queued        int
	Running       int
	Completed     int
	Failed        int
	LiveSubagents int
	LastActivity  string // "-" when there was none
}
