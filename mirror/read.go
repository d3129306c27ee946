package mirror

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"hermeshost/pg"
)

// Cursor is where a page of jobs ended: the last row's (updated_at, job_id), the keyset the
// next page continues below.
type Cursor struct {
	UpdatedAt time.Time
	JobID     string
}

const jobColumns = `job_id, org, type, status, attempt, coalesce(error, ''), result, updated_at`

func scanJob(row pgx.CollectableRow) (Job, error) {
	var j Job
	err := row.Scan(&j.ID, &j.Org, &j.Type, &j.Status, &j.Attempt, &j.Error, &j.Result, &j.UpdatedAt)
	return j, err
}

func scanEvent(row pgx.CollectableRow) (Event, error) {
	var e Event
	err := row.Scan(&e.ID, &e.JobID, &e.Attempt, &e.Kind, &e.Data, &e.At)
	return e, err
}

// Jobs is up to limit of org's jobs, newest updated_at first (job_id breaking ties), after
// the cursor when there is one.
func (s *Store) Jobs(ctx context.Context, org string, after *Cursor, limit int) ([]Job, error) {
	var afterAt *time.Time
	var afterID string
	if after != nil {
		afterAt, afterID = &after.UpdatedAt, after.JobID
	}
	rows, err := s.pool.Query(ctx, `
SELECT `+jobColumns+`
  FROM mirror_jobs
 WHERE org = $1 AND ($2::timestamptz IS NULL OR (updated_at, job_id) < ($2, $3))
 ORDER BY updated_at DESC, job_id DESC
 LIMIT $4`, org, afterAt, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list the jobs of %s: %w", org, err)
	}
	jobs, err := pgx.CollectRows(rows, scanJob)
	if err != nil {
		return nil, fmt.Errorf("list the jobs of %s: %w", org, err)
	}
	return jobs, nil
}

// Job is org's job id with its newest events (at most maxEvents, oldest first); truncated
// says older ones were left out. A job of another org is ErrNotFound, like a missing one.
func (s *Store) Job(ctx context.Context, org, id string, maxEvents int) (job Job, events []Event, truncated bool, err error) {
	rows, err := s.pool.Query(ctx, `SELECT `+jobColumns+` FROM mirror_jobs WHERE job_id = $1 AND org = $2`, id, org)
	if err != nil {
		return Job{}, nil, false, fmt.Errorf("show job %s: %w", id, err)
	}
	job, err = pgx.CollectExactlyOneRow(rows, scanJob)
	if errors.Is(err, pgx.ErrNoRows) {
		return Job{}, nil, false, ErrNotFound
	}
	if err != nil {
		return Job{}, nil, false, fmt.Errorf("show job %s: %w", id, err)
	}
	rows, err = s.pool.Query(ctx, `
SELECT id, job_id, attempt, kind, data, at FROM (
    SELECT id, job_id, attempt, kind, data, at FROM mirror_job_events WHERE job_id = $1 ORDER BY id DESC LIMIT $2
) newest ORDER BY id`, job.ID, maxEvents+1)
	if err != nil {
		return Job{}, nil, false, fmt.Errorf("show job %s: %w", id, err)
	}
	events, err = pgx.CollectRows(rows, scanEvent)
	if err != nil {
		return Job{}, nil, false, fmt.Errorf("show job %s: %w", id, err)
	}
	if len(events) > maxEvents {
		events, truncated = events[len(events)-maxEvents:], true
	}
	return job, events, truncated, nil
}

// Counts is how many of an org's jobs are in each status, and when one last changed.
type Counts struct {
	Claimed, Running, Completed, Failed int
	LastUpdatedAt                       *time.Time
}

// CountsOf is the Counts of each of orgs that has jobs (an org without is absent).
func (s *Store) CountsOf(ctx context.Context, orgs []string) (map[string]Counts, error) {
	rows, err := s.pool.Query(ctx, `
SELECT org,
       count(*) FILTER (WHERE status = 'CLAIMED'),
       count(*) FILTER (WHERE status = 'RUNNING'),
       count(*) FILTER (WHERE status = 'COMPLETED'),
       count(*) FILTER (WHERE status = 'FAILED'),
       max(updated_at)
  FROM mirror_jobs WHERE org = ANY($1)
 GROUP BY org`, orgs)
	if err != nil {
		return nil, fmt.Errorf("count the jobs of %d orgs: %w", len(orgs), err)
	}
	out := map[string]Counts{}
	var org string
	var c Counts
	_, err = pgx.ForEachRow(rows, []any{&org, &c.Claimed, &c.Running, &c.Completed, &c.Failed, &c.LastUpdatedAt}, func() error {
		out[org] = c
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count the jobs of %d orgs: %w", len(orgs), err)
	}
	return out, nil
}

// Since is org's events with an id above after, oldest first, at most limit (1 to MaxPage).
// When there are none it waits up to wait (at most MaxWait) for one, woken by the
// notification of its insert, and looks again at the poll interval in case one was missed
// (the listener reconnecting). It returns an empty page when the wait ends first.
func (s *Store) Since(ctx context.Context, org string, after int64, limit int, wait time.Duration) ([]Event, error) {
	if limit < 1 || limit > MaxPage {
		return nil, fmt.Errorf("events of %s: limit %d is not from 1 to %d", org, limit, MaxPage)
	}
	if wait < 0 || wait > MaxWait {
		return nil, fmt.Errorf("events of %s: wait %s is not from 0 to %s", org, wait, MaxWait)
	}
	var wakeups <-chan struct{}
	if wait > 0 {
		// Subscribed before the first look, so an event committed between the look and
		// the wait still wakes it.
		ch, unsubscribe := s.ensureListener(ctx).Subscribe(org)
		defer unsubscribe()
		wakeups = ch
	}
	var events []Event
	err := pg.Await(ctx, wakeups, wait, s.poll, func() (bool, error) {
		var err error
		events, err = s.since(ctx, org, after, limit)
		return len(events) > 0, err
	})
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("wait for the events of %s: %w", org, err)
	}
	return events, err
}

func (s *Store) since(ctx context.Context, org string, after int64, limit int) ([]Event, error) {
	rows, err := s.pool.Query(ctx, `
SELECT e.id, e.job_id, e.attempt, e.kind, e.data, e.at
  FROM mirror_job_events e JOIN mirror_jobs j ON j.job_id = e.job_id
 WHERE j.org = $1 AND e.id > $2
 ORDER BY e.id
 LIMIT $3`, org, after, limit)
	if err != nil {
		return nil, fmt.Errorf("events of %s: %w", org, err)
	}
	events, err := pgx.CollectRows(rows, scanEvent)
	if err != nil {
		return nil, fmt.Errorf("events of %s: %w", org, err)
	}
	if events == nil {
		events = []Event{}
	}
	return events, nil
}

// Orgs is every org with a mirrored job.
func (s *Store) Orgs(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT org FROM mirror_jobs ORDER BY org`)
	if err != nil {
		return nil, fmt.Errorf("orgs of the job mirror: %w", err)
	}
	orgs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("orgs of the job mirror: %w", err)
	}
	return orgs, nil
}
