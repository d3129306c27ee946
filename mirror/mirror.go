// Package mirror is the job mirror, the host's own record of jobs and their events as the
// dispatcher saw them (claims, worker progress, outcomes), which the control API and the
// launcher read instead of the backend. It is the only code that writes mirror_jobs and
// mirror_job_events, so every event insert also notifies, in its transaction, and a waiter
// (the control API's event feed) wakes on commit.
package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"hermeshost/pg"
)

const (
	// MaxWait bounds how long Since waits for an event.
	MaxWait = 60 * time.Second
	// MaxPage is the most events Since returns at once.
	MaxPage = 200
)

// ErrNotFound is a job the org does not have (or nobody has).
var ErrNotFound = errors.New("no such job")

// Querier is where a write runs: the pool, or the caller's transaction (a lease fence's),
// so the write commits or is refused with it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Job is one mirrored job.
type Job struct {
	ID        string
	Org       string
	Type      string
	Status    string
	Attempt   int
	Error     string
	Result    json.RawMessage
	UpdatedAt time.Time
}

// Event is one mirrored event of a job.
type Event struct {
	ID      int64
	JobID   string
	Attempt int
	Kind    string
	Data    json.RawMessage
	At      time.Time
}

// Options tune a Store; the zero value is usable.
type Options struct {
	Log *slog.Logger
	// Poll is how often a waiting Since looks again when no notification arrives (1s).
	Poll time.Duration
}

// Store is the job mirror of one database.
type Store struct {
	pool    *pgxpool.Pool
	log     *slog.Logger
	poll    time.Duration
	channel string // carries the org of every event inserted

	listenOnce sync.Once
	listener   *pg.Listener
}

// New is a Store on pool.
func New(pool *pgxpool.Pool, opts Options) *Store {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	// One channel per schema, so parallel tests (and hosts sharing a server) do not wake
	// each other.
	schema := pool.Config().ConnConfig.RuntimeParams["search_path"]
	return &Store{pool: pool, log: opts.Log, poll: opts.Poll, channel: "hermes_mirror_" + schema[:min(len(schema), 40)]}
}

// Close stops the notification listener, if a waiting Since started one.
func (s *Store) Close() {
	if s.listener != nil {
		s.listener.Close()
	}
}

func (s *Store) ensureListener(ctx context.Context) *pg.Listener {
	s.listenOnce.Do(func() {
		s.listener = pg.Listen(s.pool.Config().ConnConfig, s.channel, s.log)
	})
	s.listener.Started(ctx)
	return s.listener
}

func (s *Store) on(q Querier) Querier {
	if q == nil {
		return s.pool
	}
	return q
}

// Claim is one claim or re-claim of a job, as the dispatcher recorded it.
type Claim struct {
	JobID, Org, Type string
	Attempt          int
	Kind             string // the event's kind: claim or reclaim
	Data             any    // the event's data
}

// Claimed mirrors c: the job (re)set to CLAIMED at its attempt, and c's event.
func (s *Store) Claimed(ctx context.Context, q Querier, c Claim) (int64, error) {
	var id int64
	// In q's transaction when there is one (as a savepoint), so the job and its event
	// commit together.
	err := pgx.BeginFunc(ctx, s.on(q), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
INSERT INTO mirror_jobs (job_id, org, type, status, attempt) VALUES ($1, $2, $3, 'CLAIMED', $4)
ON CONFLICT (job_id) DO UPDATE SET status = 'CLAIMED', attempt = EXCLUDED.attempt, error = NULL, updated_at = now()`,
			c.JobID, c.Org, c.Type, c.Attempt); err != nil {
			return err
		}
		var err error
		id, err = s.Event(ctx, tx, c.Org, c.JobID, c.Attempt, c.Kind, c.Data)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("mirror the %s of job %s: %w", c.Kind, c.JobID, err)
	}
	return id, nil
}

// Event records one event of org's job and notifies the org's waiters when it commits.
// data is JSON-encoded unless it is already a json.RawMessage; none is {}.
func (s *Store) Event(ctx context.Context, q Querier, org, job string, attempt int, kind string, data any) (int64, error) {
	raw, ok := data.(json.RawMessage)
	if !ok {
		var err error
		if raw, err = json.Marshal(data); err != nil {
			return 0, fmt.Errorf("mirror event of job %s: %w", job, err)
		}
	}
	if len(raw) == 0 || string(raw) == "null" {
		raw = json.RawMessage(`{}`)
	}
	// The payload is the org alone: waiters subscribe by org and read on from their own
	// last id, so the event's id would tell them nothing more.
	var id int64
	err := s.on(q).QueryRow(ctx, `
WITH ins AS (
    INSERT INTO mirror_job_events (job_id, attempt, kind, data) VALUES ($1, $2, $3, $4) RETURNING id
)
SELECT id FROM ins, pg_notify($5, $6)`, job, attempt, kind, raw, s.channel, org).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("mirror event of job %s: %w", job, err)
	}
	return id, nil
}

// Note records an event of org's job at its current attempt that its worker did not write
// (an operator's action on it, through the control API), and notifies as Event does.
// ErrNotFound: the mirror holds no such job of org.
func (s *Store) Note(ctx context.Context, org, job, kind string, data any) (int64, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		return 0, fmt.Errorf("note on job %s: %w", job, err)
	}
	var id int64
	err = s.pool.QueryRow(ctx, `
WITH j AS (SELECT job_id, attempt FROM mirror_jobs WHERE job_id = $1 AND org = $2),
ins AS (
    INSERT INTO mirror_job_events (job_id, attempt, kind, data) SELECT job_id, attempt, $3, $4 FROM j RETURNING id
)
SELECT id FROM ins, pg_notify($5, $2)`, job, org, kind, raw, s.channel).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrNotFound
	}
	if err != nil {
		return 0, fmt.Errorf("note on job %s: %w", job, err)
	}
	return id, nil
}

// Running marks job RUNNING (its worker has started).
func (s *Store) Running(ctx context.Context, q Querier, job string) error {
	if _, err := s.on(q).Exec(ctx, `UPDATE mirror_jobs SET status = 'RUNNING', updated_at = now() WHERE job_id = $1`, job); err != nil {
		return fmt.Errorf("mirror job %s running: %w", job, err)
	}
	return nil
}

// Finished records job's outcome: its status, its error (none when reason is empty) and its
// result (the previous one kept when result is nil).
func (s *Store) Finished(ctx context.Context, q Querier, job, status, reason string, result []byte) error {
	if _, err := s.on(q).Exec(ctx, `
UPDATE mirror_jobs SET status = $2, error = NULLIF($3, ''), result = coalesce($4, result), updated_at = now() WHERE job_id = $1`,
		job, status, reason, result); err != nil {
		return fmt.Errorf("mirror the outcome of job %s: %w", job, err)
	}
	return nil
}

// Reconciled sets job's status as the backend's log shows it, only while attempt is still
// the job's latest (a later claim's status is not overwritten) and status is not empty.
func (s *Store) Reconciled(ctx context.Context, q Querier, job string, attempt int, status string) error {
	if _, err := s.on(q).Exec(ctx, `
UPDATE mirror_jobs SET status = $3, updated_at = now() WHERE job_id = $1 AND attempt = $2 AND $3 <> ''`,
		job, attempt, status); err != nil {
		return fmt.Errorf("reconcile the mirror of job %s: %w", job, err)
	}
	return nil
}
