package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/a-h/templ"
	"github.com/go-chi/chi/v5"

	"hermeshost/control"
	"hermeshost/templates"
)

// jobsPage is how many jobs a page of the jobs list asks the control API for.
const jobsPage = 50

// Jobs is GET <prefix>/jobs (?cursor= the next page): the org's jobs from the control API's
// job mirror, newest first. The first page updates from the live stream (its rows as their
// jobs change, a reload for a job it has not listed); older pages show what was mirrored
// when they loaded.
func (h *Dashboard) Jobs(w http.ResponseWriter, r *http.Request) {
	v := templates.JobListView{Frame: h.frame(r.Context(), templates.NavJobs)}
	cursor := r.URL.Query().Get("cursor")
	// Read before the jobs, so the stream replays whatever changed while they were read.
	if after, ok := liveAfter(r.Context()); ok && cursor == "" {
		v.Live = h.Paths().Events(after)
	}
	ctx, cancel := h.source(r.Context())
	defer cancel()
	page, err := h.Control.Jobs(ctx, jobsPage, cursor)
	switch {
	case err != nil && cursor != "" && apiStatus(err) == http.StatusBadRequest:
		h.NotFound(w, r, "That page of jobs is not one this dashboard links to; start again from the newest.")
		return
	case err != nil:
		h.Log.Warn("dashboard: jobs from the control API", "org", h.Org, "err", err)
		v.Error = err.Error()
	}
	for _, j := range page.Jobs {
		v.Jobs = append(v.Jobs, h.jobRow(j))
	}
	if cursor != "" {
		v.First = h.Paths().Page("/jobs")
	}
	if page.NextCursor != "" {
		v.Next = h.Paths().PageWith("/jobs", url.Values{"cursor": {page.NextCursor}})
	}
	h.Render(w, r, http.StatusOK, templates.DashboardJobs(v))
}

func (h *Dashboard) jobRow(j control.Job) templates.JobRow {
	return templates.JobRow{
		ID: j.ID, Type: j.Type, Status: j.Status, Attempt: j.Attempt, Error: j.Error, Updated: shownTime(j.UpdatedAt),
		Link: h.Paths().Page("/jobs/" + url.PathEscape(j.ID)),
	}
}

// Job is GET <prefix>/jobs/{id}: one job, its outcome (with the skills the cap disabled),
// the progress its events state and its newest events as the control API gives them. The
// control API scopes the id to the org, so another org's job is a 404 here.
func (h *Dashboard) Job(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	ctx, cancel := h.source(r.Context())
	defer cancel()
	d, err := h.Control.Job(ctx, id)
	switch {
	case control.IsNotFound(err):
		h.NotFound(w, r, "This organization has no such job; the jobs page lists its jobs.")
		return
	case err != nil:
		h.Log.Warn("dashboard: job from the control API", "org", h.Org, "job", id, "err", err)
		h.Error(w, r, http.StatusBadGateway, "The dispatcher's control API did not answer, so the job cannot be shown; reload the page in a moment.")
		return
	}
	v := h.jobDetail(d)
	v.Frame = h.frame(r.Context(), templates.NavJobs)
	if after, ok := liveAfter(r.Context()); ok {
		// From the newest of the events shown (when the stream is further), so none of
		// them is appended again.
		if n := len(d.Events); n > 0 {
			after = max(after, d.Events[n-1].ID)
		}
		v.Live = h.Paths().Events(after)
	}
	h.Render(w, r, http.StatusOK, templates.DashboardJob(v))
}

// jobDetail is the page's view of d (without its frame): the outcome and the progress its
// events state, and the events.
func (h *Dashboard) jobDetail(d control.JobDetail) templates.JobDetailView {
	v := templates.JobDetailView{Job: h.jobRow(d.Job), Truncated: d.Truncated}
	var progress *templates.JobProgress
	for _, e := range d.Events {
		v.Events = append(v.Events, jobEventRow(e.ID, e.Attempt, e.Kind, e.At, e.Data))
		var data jobEventData
		if json.Unmarshal(e.Data, &data) != nil {
			continue
		}
		if e.Kind == "outcome" {
			v.Outcome, v.Reason, v.SkillsDisabled = data.Status, data.Reason, data.SkillsDisabled
		}
		// The events are oldest first, so the last one that states progress is the current.
		cats := data.Persisted
		if e.Kind == "checkpoint" && cats == nil {
			cats = data.Categories
		}
		if cats != nil || data.Total > 0 {
			if progress == nil {
				progress = &templates.JobProgress{}
			}
			if cats != nil {
				progress.Categories, progress.Persisted = *cats, len(*cats)
			}
			if data.Total > 0 {
				progress.Total = data.Total
			}
		}
	}
	if progress != nil && progress.Total > 0 {
		progress.Percent = min(100, progress.Persisted*100/progress.Total)
	}
	v.Progress = progress
	return v
}

func jobEventRow(id int64, attempt int, kind string, at time.Time, data json.RawMessage) templates.JobEventRow {
	return templates.JobEventRow{ID: id, Attempt: attempt, Kind: kind, At: shownTime(at), Data: string(data)}
}

type liveAfterKey struct{}

// WithLiveAfter says, for a page rendered with ctx, that the live stream is served and
// has seen the org's events up to id: the page connects to it from there.
func WithLiveAfter(ctx context.Context, id int64) context.Context {
	return context.WithValue(ctx, liveAfterKey{}, id)
}

func liveAfter(ctx context.Context) (int64, bool) {
	id, ok := ctx.Value(liveAfterKey{}).(int64)
	return id, ok
}

// LiveFragment is one piece of HTML the live stream sends: the SSE event it is swapped in
// by (templates.LiveJob*) and the id of the org's job event it is current with.
type LiveFragment struct {
	ID    int64
	Event string
	HTML  string
}

// liveJobEvents is how many of a job's newest events a live render reads: enough for its
// newest progress and its outcome (every progress event states all that was persisted and
// the total), not its history, which grows with the job.
const liveJobEvents = 20

// LiveJobs renders what the live stream sends for a page of the org's job events (oldest
// first): each event's row for its job's page, and after a job's last event in the page
// its list row and its page's head (status, outcome, progress), read once from the control
// API however many tabs are open, so every fragment is in id order. A claim or re-claim
// also sends templates.LiveJobs (the list has a job to add or move up). A job or subagent
// the control API does not answer for keeps its event rows, and the failure is logged; the
// page's reload (templates.LiveReload, once a page of events) then reads the rest anew,
// where the row would otherwise show its old state until the operator reloaded.
func (h *Dashboard) LiveJobs(ctx context.Context, events []control.FeedEvent) []LiveFragment {
	lastOf := map[string]int{}
	for i, e := range events {
		lastOf[e.JobID] = i
	}
	var out []LiveFragment
	unread := false
	for i, e := range events {
		out = append(out, LiveFragment{ID: e.ID, Event: templates.LiveJobEvents(e.JobID),
			HTML: renderString(ctx, templates.JobEventTableRow(jobEventRow(e.ID, e.Attempt, e.Kind, e.At, e.Data)))})
		if e.Kind == "claim" || e.Kind == "reclaim" {
			out = append(out, LiveFragment{ID: e.ID, Event: templates.LiveJobs, HTML: "claimed"})
		}
		sub, ok := h.liveSubagent(ctx, e)
		out, unread = append(out, sub...), unread || !ok
		if lastOf[e.JobID] != i {
			continue
		}
		sctx, cancel := h.source(ctx)
		d, err := h.Control.JobNewest(sctx, e.JobID, liveJobEvents)
		cancel()
		if err != nil {
			h.Log.Warn("dashboard: live job from the control API", "org", h.Org, "job", e.JobID, "err", err)
			unread = true
			continue
		}
		v := h.jobDetail(d)
		out = append(out,
			LiveFragment{ID: e.ID, Event: templates.LiveJobRow(e.JobID), HTML: renderString(ctx, templates.JobListCells(v.Job))},
			LiveFragment{ID: e.ID, Event: templates.LiveJobHead(e.JobID), HTML: renderString(ctx, templates.JobHeadBody(v))})
	}
	if unread {
		out = append(out, LiveFragment{ID: events[len(events)-1].ID, Event: templates.LiveReload, HTML: "unread"})
	}
	return out
}

// Kinds of job events that change one of its subagents: its start and stop (the worker's,
// from Hermes' hooks) and an operator's cancel or message (the control API's). Their data
// names the subagent's id.
var subagentKinds = map[string]bool{"subagent_start": true, "subagent_stop": true, "subagent_cancel": true, "subagent_message": true}

// liveSubagent is what event e changes on the subagents page: the subagent's row as the
// control API has it now, and for a start the page's reload (a row it has not listed); ok
// is false when the control API did not answer for the row.
func (h *Dashboard) liveSubagent(ctx context.Context, e control.FeedEvent) (_ []LiveFragment, ok bool) {
	if !subagentKinds[e.Kind] {
		return nil, true
	}
	var data struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(e.Data, &data) != nil || data.ID == "" {
		return nil, true
	}
	var out []LiveFragment
	if e.Kind == "subagent_start" {
		out = append(out, LiveFragment{ID: e.ID, Event: templates.LiveSubagents, HTML: "started"})
	}
	sctx, cancel := h.source(ctx)
	d, err := h.Control.Subagent(sctx, data.ID)
	cancel()
	if err != nil {
		h.Log.Warn("dashboard: live subagent from the control API", "org", h.Org, "subagent", data.ID, "err", err)
		return out, false
	}
	return append(out, LiveFragment{ID: e.ID, Event: templates.LiveSubagentRow(data.ID),
		HTML: renderString(ctx, templates.SubagentCells(h.Paths(), subagentRow(d.Subagent)))}), true
}

func renderString(ctx context.Context, c templ.Component) string {
	var b bytes.Buffer
	_ = c.Render(ctx, &b) // into memory: it fails only as the component does, never here
	return b.String()
}

// jobEventData is what the dashboard reads of a worker's event (worker.Run's start,
// progress, checkpoint, resume and outcome): persisted categories, a checkpoint's
// categories, a total when an event states one, and an outcome's status, reason and the
// skills the cap disabled.
type jobEventData struct {
	Persisted      *[]string `json:"persisted"`
	Categories     *[]string `json:"categories"`
	Total          int       `json:"total"`
	Status         string    `json:"status"`
	Reason         string    `json:"reason"`
	SkillsDisabled []string  `json:"skills_disabled"`
}

func apiStatus(err error) int {
	var e *control.APIError
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}
