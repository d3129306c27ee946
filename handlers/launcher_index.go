package handlers

import (
	"net/http"
	"time"

	"hermeshost/orghome"
	"hermeshost/templates"
)

// Index is GET /: the operator's orgs.
func (h *Launcher) Index(w http.ResponseWriter, r *http.Request) {
	op := OperatorFrom(r.Context())
	orgs, err := h.orgs(r)
	if err != nil {
		h.Failed(w, r, err)
		return
	}
	h.Render(w, r, http.StatusOK, templates.IndexPage(templates.IndexView{Operator: op.Name, Orgs: orgs}))
}

func (h *Launcher) orgs(r *http.Request) (templates.OrgsView, error) {
	entries, others, err := h.Operators.Index(r.Context(), OperatorFrom(r.Context()).Name)
	if err != nil {
		return templates.OrgsView{}, err
	}
	v := templates.OrgsView{Others: others, RefreshSeconds: h.RefreshSeconds}
	for _, e := range entries {
		last := "-"
		if e.LastActivityAt != nil {
			last = e.LastActivityAt.UTC().Format(time.DateTime) + " UTC"
		}
		row := templates.OrgRow{
			Org: e.Org, Queued: e.Queued, Running: e.Running, Completed: e.Completed, Failed: e.Failed,
			LiveSubagents: e.LiveSubagents, LastActivity: last,
		}
		// Only an id that can be an org's has a dashboard to link to.
		if orghome.ValidID(e.Org) == nil {
			row.Dashboard = templates.DashboardHome(e.Org)
		}
		v.Rows = append(v.Rows, row)
	}
	return v, nil
}
