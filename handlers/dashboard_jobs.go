package handlers

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"

	"github.com/go-chi/chi/v5"

	"hermeshost/control"
	"hermeshost/templates"
)

// jobsPage is how many jobs a page of the jobs list asks the control API for.
const jobsPage = 50

// Jobs is GET <prefix>/jobs (?cursor= the next page): the org's jobs from the control API's
// job mirror, newest first. Live updates come with the SSE stream; the page shows what was
// mirrored when it was loaded.
func (h *Dashboard) Jobs(w http.ResponseWriter, r *http.Request) {
	v := templates.JobListView{Frame: h.frame(r.Context(), templates.NavJobs)}
	cursor := r.URL.Query().Get("cursor")
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
	v := templates.JobDetailView{Frame: h.frame(r.Context(), templates.NavJobs), Job: h.jobRow(d.Job), Truncated: d.Truncated}
	var progress *templates.JobProgress
	for _, e := range d.Events {
		v.Events = append(v.Events, templates.JobEventRow{ID: e.ID, Attempt: e.Attempt, Kind: e.Kind, At: shownTime(e.At), Data: string(e.Data)})
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
	h.Render(w, r, http.StatusOK, templates.DashboardJob(v))
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
