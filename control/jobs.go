package control

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"hermeshost/mirror"
	"hermeshost/service"
)

// MaxFeedEvents is the most events one GET /v1/jobs/events returns.
const MaxFeedEvents = mirror.MaxPage

// FeedEvent is one event of GET /v1/jobs/events: a job's event with the job it belongs to.
type FeedEvent struct {
	ID      int64           `json:"id"`
	JobID   string          `json:"job_id"`
	Attempt int             `json:"attempt"`
	Kind    string          `json:"kind"`
	Data    json.RawMessage `json:"data"`
	At      time.Time       `json:"at"`
}

// JobEventFeed is one answer of GET /v1/jobs/events: the events, oldest first, and Last,
// the id to pass as after next time (the request's own after when there were none).
type JobEventFeed struct {
	Events []FeedEvent `json:"events"`
	Last   int64       `json:"last"`
}

// jobsCursor is where a page ended: the last row's (updated_at, job_id), the keyset the
// next page continues below. It travels as opaque base64url JSON.
type jobsCursor struct {
	UpdatedAt int64  `json:"u"` // Unix microseconds, Postgres' precision
	JobID     string `json:"j"`
}

func (c jobsCursor) encode() string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (jobsCursor, bool) {
	var c jobsCursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) > 1024 {
		return c, false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if dec.Decode(&c) != nil || c.JobID == "" {
		return c, false
	}
	return c, true
}

// jobsList is GET /v1/jobs?limit=N&cursor=C: the caller's org's jobs, newest updated_at
// first.
func (s *Server) jobsList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := DefaultJobsLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxJobsLimit {
			badRequest(w, "limit must be an integer from 1 to %d", MaxJobsLimit)
			return
		}
		limit = n
	}
	var afterAt *time.Time // nil: the first page
	var afterID string
	if v := q.Get("cursor"); v != "" {
		c, ok := decodeCursor(v)
		if !ok {
			badRequest(w, "cursor is not one this API returned")
			return
		}
		t := time.UnixMicro(c.UpdatedAt)
		afterAt, afterID = &t, c.JobID
	}
	var after *mirror.Cursor // nil: the first page
	if afterAt != nil {
		after = &mirror.Cursor{UpdatedAt: *afterAt, JobID: afterID}
	}
	rows, err := s.mirror.Jobs(r.Context(), orgOf(r), after, limit+1)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	jobs := make([]Job, 0, len(rows))
	for _, j := range rows {
		jobs = append(jobs, jobOf(j))
	}
	page := JobsPage{Jobs: jobs}
	if len(jobs) > limit {
		page.Jobs = jobs[:limit]
		last := page.Jobs[limit-1]
		page.NextCursor = jobsCursor{UpdatedAt: last.UpdatedAt.UnixMicro(), JobID: last.ID}.encode()
	}
	writeJSON(w, http.StatusOK, page)
}

func jobOf(j mirror.Job) Job {
	return Job{ID: j.ID, Type: j.Type, Status: j.Status, Attempt: j.Attempt, Error: j.Error, Result: j.Result, UpdatedAt: j.UpdatedAt}
}

// jobShow is GET /v1/jobs/{id}: one job of the caller's org and its newest events. A job
// of another org is answered exactly like one that does not exist.
func (s *Server) jobShow(w http.ResponseWriter, r *http.Request) {
	id, err := url.PathUnescape(chi.URLParam(r, "id"))
	if err != nil {
		writeNotFound(w, "no such job")
		return
	}
	most := MaxJobEvents
	if v := r.URL.Query().Get("events"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxJobEvents {
			badRequest(w, "events must be an integer from 1 to %d", MaxJobEvents)
			return
		}
		most = n
	}
	job, events, truncated, err := s.mirror.Job(r.Context(), orgOf(r), id, most)
	if errors.Is(err, mirror.ErrNotFound) {
		writeNotFound(w, "no such job")
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}
	d := JobDetail{Job: jobOf(job), Events: make([]JobEvent, 0, len(events)), Truncated: truncated}
	for _, e := range events {
		d.Events = append(d.Events, JobEvent{ID: e.ID, Attempt: e.Attempt, Kind: e.Kind, Data: e.Data, At: e.At})
	}
	writeJSON(w, http.StatusOK, d)
}

// jobEvents is GET /v1/jobs/events?after=ID&wait_ms=N: the caller's org's events with an id
// above after, oldest first, at most MaxFeedEvents; when there are none it waits up to
// wait_ms (at most Config.MaxWait) for one. A caller resumes by passing the last id it saw.
func (s *Server) jobEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var after int64
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			badRequest(w, "after must be an event id (an integer from 0)")
			return
		}
		after = n
	}
	var wait time.Duration
	if v := q.Get("wait_ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		most := min(s.cfg.MaxWait, mirror.MaxWait)
		if err != nil || ms < 0 || millis(ms) > most {
			badRequest(w, "wait_ms must be an integer from 0 to %d", most.Milliseconds())
			return
		}
		wait = millis(ms)
	}
	if wait > 0 {
		service.LongAnswer(w) // the wait may outlast the server's read timeout
	}
	events, err := s.mirror.Since(r.Context(), orgOf(r), after, MaxFeedEvents, wait)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	feed := JobEventFeed{Events: make([]FeedEvent, 0, len(events)), Last: after}
	for _, e := range events {
		feed.Events = append(feed.Events, FeedEvent{ID: e.ID, JobID: e.JobID, Attempt: e.Attempt, Kind: e.Kind, Data: e.Data, At: e.At})
		feed.Last = e.ID
	}
	writeJSON(w, http.StatusOK, feed)
}
