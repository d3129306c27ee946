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
	"github.com/jackc/pgx/v5"
)

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
	rows, err := s.cfg.DB.Query(r.Context(), `
SELECT job_id, type, status, attempt, coalesce(error, ''), result, updated_at
  FROM mirror_jobs
 WHERE org = $1 AND ($2::timestamptz IS NULL OR (updated_at, job_id) < ($2, $3))
 ORDER BY updated_at DESC, job_id DESC
 LIMIT $4`, orgOf(r), afterAt, afterID, limit+1)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	jobs, err := pgx.CollectRows(rows, scanJob)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if jobs == nil {
		jobs = []Job{}
	}
	page := JobsPage{Jobs: jobs}
	if len(jobs) > limit {
		page.Jobs = jobs[:limit]
		last := page.Jobs[limit-1]
		page.NextCursor = jobsCursor{UpdatedAt: last.UpdatedAt.UnixMicro(), JobID: last.ID}.encode()
	}
	writeJSON(w, http.StatusOK, page)
}

func scanJob(row pgx.CollectableRow) (Job, error) {
	var j Job
	err := row.Scan(&j.ID, &j.Type, &j.Status, &j.Attempt, &j.Error, &j.Result, &j.UpdatedAt)
	return j, err
}

// jobShow is GET /v1/jobs/{id}: one job of the caller's org and its newest events. A job
// of another org is answered exactly like one that does not exist.
func (s *Server) jobShow(w http.ResponseWriter, r *http.Request) {
	id, err := url.PathUnescape(chi.URLParam(r, "id"))
	if err != nil {
		writeNotFound(w, "no such job")
		return
	}
	rows, err := s.cfg.DB.Query(r.Context(), `
SELECT job_id, type, status, attempt, coalesce(error, ''), result, updated_at
  FROM mirror_jobs WHERE job_id = $1 AND org = $2`, id, orgOf(r))
	if err != nil {
		s.internal(w, r, err)
		return
	}
	job, err := pgx.CollectExactlyOneRow(rows, scanJob)
	if errors.Is(err, pgx.ErrNoRows) {
		writeNotFound(w, "no such job")
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}
	rows, err = s.cfg.DB.Query(r.Context(), `
SELECT id, attempt, kind, data, at FROM (
    SELECT id, attempt, kind, data, at FROM mirror_job_events WHERE job_id = $1 ORDER BY id DESC LIMIT $2
) newest ORDER BY id`, job.ID, MaxJobEvents+1)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	events, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (JobEvent, error) {
		var e JobEvent
		err := row.Scan(&e.ID, &e.Attempt, &e.Kind, &e.Data, &e.At)
		return e, err
	})
	if err != nil {
		s.internal(w, r, err)
		return
	}
	d := JobDetail{Job: job, Events: events}
	if len(events) > MaxJobEvents {
		d.Events, d.Truncated = events[len(events)-MaxJobEvents:], true
	}
	if d.Events == nil {
		d.Events = []JobEvent{}
	}
	writeJSON(w, http.StatusOK, d)
}
