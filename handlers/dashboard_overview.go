package handlers

import (
	"context"
	"net/http"
	"slices"
	"sync"

	"hermeshost/control"
	"hermeshost/orghome"
	"hermeshost/sartiq"
	"hermeshost/templates"
)

// overviewJobs is how many of the newest jobs the overview asks the control API for.
const overviewJobs = 20

// Overview is GET <prefix>/: identity, jobs, lease holders and the gateway. The control
// API and the gateway are asked at the same time, each within SourceTimeout; one that does
// not answer is said so in its place and the rest of the page is shown.
func (h *Dashboard) Overview(w http.ResponseWriter, r *http.Request) {
	v := templates.OverviewView{Frame: h.frame(r.Context(), templates.NavOverview)}
	var wg sync.WaitGroup
	wg.Go(func() { v.Jobs = h.overviewJobs(r.Context()) })
	wg.Go(func() { v.Leases = h.overviewLeases(r.Context()) })
	wg.Go(func() { v.Gateway = h.overviewGateway(r.Context()) })
	v.Identity = h.identity()
	wg.Wait()
	h.Render(w, r, http.StatusOK, templates.DashboardOverview(v))
}

func (h *Dashboard) source(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, h.SourceTimeout)
}

func (h *Dashboard) identity() templates.IdentityView {
	s, err := h.Home.ReadSoul()
	if err != nil {
		h.Log.Error("dashboard: read SOUL.md", "org", h.Org, "err", err)
		return templates.IdentityView{Error: err.Error()}
	}
	return templates.IdentityView{
		Exists: s.Exists, Version: s.BlockVersion, CurrentVersion: orghome.SoulBlockVersion, Intact: s.Intact,
		Problem: s.Problem, Block: s.Block, Free: s.Free,
	}
}

func (h *Dashboard) overviewJobs(ctx context.Context) templates.JobsView {
	ctx, cancel := h.source(ctx)
	defer cancel()
	page, err := h.Control.Jobs(ctx, overviewJobs, "")
	if err != nil {
		h.Log.Warn("dashboard: jobs from the control API", "org", h.Org, "err", err)
		return templates.JobsView{Error: err.Error()}
	}
	var v templates.JobsView
	for _, j := range page.Jobs {
		row := h.jobRow(j)
		if slices.Contains([]string{sartiq.StatusQueued, sartiq.StatusClaimed, sartiq.StatusRunning}, j.Status) {
			v.Current = append(v.Current, row)
		} else {
			v.Recent = append(v.Recent, row)
		}
	}
	return v
}

func (h *Dashboard) overviewLeases(ctx context.Context) templates.LeasesView {
	ctx, cancel := h.source(ctx)
	defer cancel()
	list, err := h.Control.Leases(ctx, control.LeaseQuery{Held: true})
	if err != nil {
		h.Log.Warn("dashboard: leases from the control API", "org", h.Org, "err", err)
		return templates.LeasesView{Error: err.Error()}
	}
	v := templates.LeasesView{Truncated: list.Truncated}
	for _, l := range list.Leases {
		v.Rows = append(v.Rows, templates.LeaseRow{Key: l.Key, Holder: l.Holder, Epoch: l.Epoch, Since: shownTime(l.AcquiredAt), Until: shownTime(l.ExpiresAt)})
	}
	return v
}

func (h *Dashboard) overviewGateway(ctx context.Context) templates.GatewayView {
	ctx, cancel := h.source(ctx)
	defer cancel()
	models, err := h.GatewayModels(ctx)
	if err != nil {
		h.Log.Warn("dashboard: the gateway's models", "org", h.Org, "err", err)
		return templates.GatewayView{Error: err.Error()}
	}
	return templates.GatewayView{Models: models}
}
