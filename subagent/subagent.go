// Package subagent keeps the handles of the children an agent starts: one Postgres row per
// child (its job, session, parents, goal, role, status and summary) and a mailbox per child.
//
// Hermes' subagent_start and subagent_stop hooks reach Start and Stop through the control
// API. An operator (or the parent) Sends a message, which stays in the mailbox until the
// child acknowledges it: every Drain hands out all unacknowledged messages again, and their
// ids let the child drop the ones it has seen. Cancel marks a running child cancelling; the
// child sees it on its next Drain, stops, and its stop hook ends it as cancelled. When the
// worker of a job dies, FailJob ends the job's live children as failed, since nobody is left
// to report them.
//
// Every call is scoped to one org: handles are keyed by (org, id), so a caller can only name
// its own org's children.
package subagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/orgid"
	"hermeshost/pg"
)

// Statuses. Running and Cancelling are live; the others are ends.
const (
	Running    = "running"
	Cancelling = "cancelling"
	Done       = "done"
	Failed     = "failed"
	Cancelled  = "cancelled"
)

// Limits on what a handle and a message may hold.
const (
	MaxIDLen      = 128
	MaxGoalLen    = 4000
	MaxRoleLen    = 200
	MaxSummaryLen = 16000
	MaxBodyLen    = 16000
	MaxSenderLen  = 200
	MaxReasonLen  = 1000
	// MaxPending is how many unacknowledged messages a mailbox holds; Send is refused past
	// it (sends racing each other may each see one fewer, so a mailbox can briefly hold a
	// few more: it is a bound against a runaway sender, not an exact count).
	MaxPending = 1000
	// MaxListLimit bounds List.
	MaxListLimit = 200
	// MaxWait bounds how long a Drain waits for something to hand out.
	MaxWait = 60 * time.Second
)

var (
	// ErrInvalid: the input is malformed; nothing was written.
	ErrInvalid = errors.New("invalid subagent request")
	// ErrNotFound: the org has no such subagent.
	ErrNotFound = errors.New("no such subagent")
	// ErrEnded: the subagent has ended; it takes no messages and cannot be cancelled.
	ErrEnded = errors.New("subagent has ended")
	// ErrConflict: a start repeated an id with a different job, session or goal.
	ErrConflict = errors.New("subagent id already started with different details")
	// ErrMailboxFull: MaxPending messages wait unacknowledged.
	ErrMailboxFull = errors.New("subagent mailbox is full")
	// ErrNotLive: the subagent is cancelling; it takes no more messages.
	ErrNotLive = errors.New("subagent is being cancelled")
)

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// Handle is one child as the table holds it.
type Handle struct {
	Org            string     `json:"org"`
	ID             string     `json:"id"`
	JobID          string     `json:"job_id,omitempty"`
	Session        string     `json:"session_id,omitempty"`
	ParentSession  string     `json:"parent_session,omitempty"`
	ParentSubagent string     `json:"parent_subagent,omitempty"`
	Goal           string     `json:"goal"`
	Role           string     `json:"role,omitempty"`
	Status         string     `json:"status"`
	Summary        string     `json:"summary,omitempty"`
	CancelledBy    string     `json:"cancelled_by,omitempty"`
	CancelReason   string     `json:"cancel_reason,omitempty"`
	StartedAt      time.Time  `json:"started_at"`
	UpdatedAt      time.Time  `json:"updated_at"`
	EndedAt        *time.Time `json:"ended_at,omitempty"`
	// Pending is how many messages wait unacknowledged.
	Pending int `json:"pending"`
}

// Live reports whether the child is still running (or being cancelled).
func (h Handle) Live() bool { return h.Status == Running || h.Status == Cancelling }

// Start is what the subagent_start hook says of a new child.
type Start struct {
	ID             string `json:"id"`
	JobID          string `json:"job_id,omitempty"`
	Session        string `json:"session_id,omitempty"`
	ParentSession  string `json:"parent_session,omitempty"`
	ParentSubagent string `json:"parent_subagent,omitempty"`
	Goal           string `json:"goal"`
	Role           string `json:"role,omitempty"`
}

// Message is one mailbox entry.
type Message struct {
	ID          int64      `json:"id"`
	Sender      string     `json:"sender"`
	Body        string     `json:"body"`
	SentAt      time.Time  `json:"sent_at"`
	Deliveries  int        `json:"deliveries"`
	DeliveredAt *time.Time `json:"delivered_at,omitempty"`
	AckedAt     *time.Time `json:"acked_at,omitempty"`
}

// Mailbox is what a Drain hands the child: its status, whether it must stop (it is no
// longer running: cancelled, or ended by the host), and every unacknowledged message,
// oldest first.
type Mailbox struct {
	Status       string    `json:"status"`
	Stop         bool      `json:"stop"`
	CancelReason string    `json:"cancel_reason,omitempty"`
	Messages     []Message `json:"messages"`
}

// Options tune a Store; the zero value is usable.
type Options struct {
	Log *slog.Logger
	// Registerer receives hermes_subagent_* metrics (none when nil).
	Registerer prometheus.Registerer
	// Poll is how often a waiting Drain looks again when no notification arrives (1s).
	Poll time.Duration
}

// Store is the subagent tables of one database.
type Store struct {
	pool    *pgxpool.Pool
	log     *slog.Logger
	poll    time.Duration
	channel string // carries "<org>/<id>" of every mailbox that changed
	metrics *metrics

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
	schema := pool.Config().ConnConfig.RuntimeParams["search_path"]
	return &Store{
		pool: pool, log: opts.Log, poll: opts.Poll, metrics: newMetrics(opts.Registerer),
		channel: "hermes_subagent_" + schema[:min(len(schema), 40)],
	}
}

// Close stops the notification listener, if a Drain started one.
func (s *Store) Close() {
	if s.listener != nil {
		s.listener.Close()
	}
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

func checkOrg(org string) error {
	if !orgid.Valid(org) {
		return invalid("organization id %q is not one (lower-case letters, digits and dashes)", clip(org))
	}
	return nil
}

// CheckID reports whether id can name a subagent (or a job, a session).
func CheckID(what, id string) error {
	if !idPattern.MatchString(id) {
		return invalid("%s %q must be 1 to %d letters, digits, dots, colons, underscores or dashes", what, clip(id), MaxIDLen)
	}
	return nil
}

func optionalID(what, id string) error {
	if id == "" {
		return nil
	}
	return CheckID(what, id)
}

// checkText bounds a free-text field: valid UTF-8, no NUL (Postgres refuses it), at most
// max characters, and present when required.
func checkText(what, v string, max int, required bool) error {
	switch {
	case required && v == "":
		return invalid("%s is empty", what)
	case !utf8.ValidString(v):
		return invalid("%s is not valid UTF-8", what)
	case utf8.RuneCountInString(v) > max:
		return invalid("%s is %d characters; at most %d", what, utf8.RuneCountInString(v), max)
	}
	for _, r := range v {
		if r == 0 {
			return invalid("%s holds a NUL character", what)
		}
	}
	return nil
}

// clip keeps an echoed bad value short.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func (st Start) check() error {
	return errors.Join(
		CheckID("subagent id", st.ID),
		optionalID("job id", st.JobID),
		optionalID("session id", st.Session),
		optionalID("parent session", st.ParentSession),
		optionalID("parent subagent", st.ParentSubagent),
		checkText("goal", st.Goal, MaxGoalLen, true),
		checkText("role", st.Role, MaxRoleLen, false),
	)
}

const handleColumns = `org, id, coalesce(job_id, ''), coalesce(session_id, ''), coalesce(parent_session, ''),
       coalesce(parent_subagent, ''), goal, role, status, summary, coalesce(cancelled_by, ''),
       coalesce(cancel_reason, ''), started_at, updated_at, ended_at,
       (SELECT count(*) FROM subagent_messages m WHERE m.org = s.org AND m.subagent_id = s.id AND m.acked_at IS NULL)`

func scanHandle(row pgx.CollectableRow) (Handle, error) {
	var h Handle
	err := row.Scan(&h.Org, &h.ID, &h.JobID, &h.Session, &h.ParentSession, &h.ParentSubagent, &h.Goal, &h.Role,
		&h.Status, &h.Summary, &h.CancelledBy, &h.CancelReason, &h.StartedAt, &h.UpdatedAt, &h.EndedAt, &h.Pending)
	return h, err
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Start records a new running child. A hook that fires twice for the same child (same id,
// job, session, parents and goal) gets the existing handle back with created false; the
// same id with other details is ErrConflict.
func (s *Store) Start(ctx context.Context, org string, st Start) (h Handle, created bool, err error) {
	if err := errors.Join(checkOrg(org), st.check()); err != nil {
		return Handle{}, false, err
	}
	tag, err := s.pool.Exec(ctx, `
INSERT INTO subagents (org, id, job_id, session_id, parent_session, parent_subagent, goal, role, status)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'running')
ON CONFLICT (org, id) DO NOTHING`,
		org, st.ID, nullable(st.JobID), nullable(st.Session), nullable(st.ParentSession), nullable(st.ParentSubagent), st.Goal, st.Role)
	if err != nil {
		return Handle{}, false, fmt.Errorf("start subagent %s: %w", st.ID, err)
	}
	h, err = s.Get(ctx, org, st.ID)
	if err != nil {
		return Handle{}, false, err
	}
	if tag.RowsAffected() == 1 {
		s.metrics.transitions.WithLabelValues(Running).Inc()
		return h, true, nil
	}
	if h.JobID != st.JobID || h.Session != st.Session || h.ParentSession != st.ParentSession ||
		h.ParentSubagent != st.ParentSubagent || h.Goal != st.Goal || h.Role != st.Role {
		return h, false, fmt.Errorf("%w: %s", ErrConflict, st.ID)
	}
	return h, false, nil
}

// Get is one of org's children.
func (s *Store) Get(ctx context.Context, org, id string) (Handle, error) {
	if err := errors.Join(checkOrg(org), CheckID("subagent id", id)); err != nil {
		return Handle{}, err
	}
	rows, err := s.pool.Query(ctx, `SELECT `+handleColumns+` FROM subagents s WHERE org = $1 AND id = $2`, org, id)
	if err != nil {
		return Handle{}, fmt.Errorf("read subagent %s: %w", id, err)
	}
	h, err := pgx.CollectExactlyOneRow(rows, scanHandle)
	if errors.Is(err, pgx.ErrNoRows) {
		return Handle{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return Handle{}, fmt.Errorf("read subagent %s: %w", id, err)
	}
	return h, nil
}

// ListParams filter List. The zero value lists the newest children of every status.
type ListParams struct {
	Status string // one status, or "live" for running and cancelling
	JobID  string
	Limit  int // 1 to MaxListLimit; 50 when zero
}

// List is org's children, newest started first.
func (s *Store) List(ctx context.Context, org string, p ListParams) ([]Handle, error) {
	if err := errors.Join(checkOrg(org), optionalID("job id", p.JobID)); err != nil {
		return nil, err
	}
	var statuses []string
	switch p.Status {
	case "":
	case "live":
		statuses = []string{Running, Cancelling}
	case Running, Cancelling, Done, Failed, Cancelled:
		statuses = []string{p.Status}
	default:
		return nil, invalid("status %q is not one of live, running, cancelling, done, failed, cancelled", clip(p.Status))
	}
	if p.Limit == 0 {
		p.Limit = 50
	}
	if p.Limit < 1 || p.Limit > MaxListLimit {
		return nil, invalid("limit %d is not from 1 to %d", p.Limit, MaxListLimit)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+handleColumns+` FROM subagents s
 WHERE org = $1 AND ($2::text[] IS NULL OR status = ANY ($2)) AND ($3 = '' OR job_id = $3)
 ORDER BY started_at DESC, id DESC LIMIT $4`, org, statuses, p.JobID, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("list subagents: %w", err)
	}
	hs, err := pgx.CollectRows(rows, scanHandle)
	if err != nil {
		return nil, fmt.Errorf("list subagents: %w", err)
	}
	return hs, nil
}

// Stop is the subagent_stop hook: a running child ends as done or failed with its summary; a
// cancelling one ends as cancelled whatever it reports. Stopping an ended child again with
// the status it ended with is a no-op that returns it; otherwise it is ErrEnded.
func (s *Store) Stop(ctx context.Context, org, id, status, summary string) (Handle, error) {
	if err := errors.Join(checkOrg(org), CheckID("subagent id", id), checkText("summary", summary, MaxSummaryLen, false)); err != nil {
		return Handle{}, err
	}
	if status != Done && status != Failed {
		return Handle{}, invalid("a stop's status is done or failed, not %q", clip(status))
	}
	var ended string
	err := s.pool.QueryRow(ctx, `
UPDATE subagents SET status = CASE WHEN status = 'cancelling' THEN 'cancelled' ELSE $3 END,
       summary = $4, ended_at = now(), updated_at = now()
 WHERE org = $1 AND id = $2 AND status IN ('running', 'cancelling')
RETURNING status`, org, id, status, summary).Scan(&ended)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Handle{}, fmt.Errorf("stop subagent %s: %w", id, err)
	}
	h, gerr := s.Get(ctx, org, id)
	if gerr != nil {
		return Handle{}, gerr
	}
	if errors.Is(err, pgx.ErrNoRows) {
		if h.Status == status || (h.Status == Cancelled && h.Summary == summary) {
			return h, nil
		}
		return h, fmt.Errorf("%w: %s is %s", ErrEnded, id, h.Status)
	}
	s.metrics.transitions.WithLabelValues(ended).Inc()
	s.notify(ctx, org, id)
	return h, nil
}

// Send puts body in a running child's mailbox. A cancelling child takes no more messages
// (ErrNotLive), an ended one neither (ErrEnded).
func (s *Store) Send(ctx context.Context, org, id, sender, body string) (Message, error) {
	if err := errors.Join(checkOrg(org), CheckID("subagent id", id),
		checkText("sender", sender, MaxSenderLen, true), checkText("message", body, MaxBodyLen, true)); err != nil {
		return Message{}, err
	}
	m := Message{Sender: sender, Body: body}
	var status string
	var pending int
	var msgID *int64
	var sentAt *time.Time
	// One statement: the row lock on the handle orders the send with a stop or a cancel (a
	// send that waited for one sees the status it left), so a message is never added to the
	// mailbox of a child that has ended. The notification goes out at commit, when a woken
	// Drain can see the message.
	err := s.pool.QueryRow(ctx, `
WITH h AS (
    SELECT status, (SELECT count(*) FROM subagent_messages m
                     WHERE m.org = s.org AND m.subagent_id = s.id AND m.acked_at IS NULL) AS pending
      FROM subagents s WHERE org = $1 AND id = $2 FOR UPDATE
), ins AS (
    INSERT INTO subagent_messages (org, subagent_id, sender, body)
    SELECT $1, $2, $3, $4 FROM h WHERE status = 'running' AND pending < $5
    RETURNING id, sent_at
), n AS (
    SELECT pg_notify($6, $1 || '/' || $2) FROM ins
)
SELECT h.status, h.pending, ins.id, ins.sent_at, (SELECT count(*) FROM n) FROM h LEFT JOIN ins ON true`,
		org, id, sender, body, MaxPending, s.channel).Scan(&status, &pending, &msgID, &sentAt, new(int))
	if msgID != nil {
		m.ID, m.SentAt = *msgID, *sentAt
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Message{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	case err != nil:
		return Message{}, fmt.Errorf("send to subagent %s: %w", id, err)
	case status == Cancelling:
		return Message{}, fmt.Errorf("%w: %s", ErrNotLive, id)
	case status != Running:
		return Message{}, fmt.Errorf("%w: %s is %s", ErrEnded, id, status)
	case pending >= MaxPending:
		return Message{}, fmt.Errorf("%w: %s has %d unacknowledged messages", ErrMailboxFull, id, pending)
	}
	s.metrics.messages.Inc()
	return m, nil
}

// Messages is a child's mailbox, acknowledged messages included, oldest first (at most the
// newest limit of them).
func (s *Store) Messages(ctx context.Context, org, id string, limit int) ([]Message, error) {
	if err := errors.Join(checkOrg(org), CheckID("subagent id", id)); err != nil {
		return nil, err
	}
	if limit < 1 || limit > MaxPending {
		return nil, invalid("limit %d is not from 1 to %d", limit, MaxPending)
	}
	rows, err := s.pool.Query(ctx, `
SELECT id, sender, body, sent_at, deliveries, delivered_at, acked_at FROM (
  SELECT * FROM subagent_messages WHERE org = $1 AND subagent_id = $2 ORDER BY id DESC LIMIT $3) m
 ORDER BY id`, org, id, limit)
	if err != nil {
		return nil, fmt.Errorf("read mailbox of %s: %w", id, err)
	}
	ms, err := pgx.CollectRows(rows, scanMessage)
	if err != nil {
		return nil, fmt.Errorf("read mailbox of %s: %w", id, err)
	}
	if len(ms) == 0 {
		// An empty mailbox, or no such child: only then is the handle looked up.
		if _, err := s.Get(ctx, org, id); err != nil {
			return nil, err
		}
	}
	return ms, nil
}

func scanMessage(row pgx.CollectableRow) (Message, error) {
	var m Message
	err := row.Scan(&m.ID, &m.Sender, &m.Body, &m.SentAt, &m.Deliveries, &m.DeliveredAt, &m.AckedAt)
	return m, err
}

// Cancel asks a running child to stop: it becomes cancelling, with who asked and why, and
// sees it on its next Drain. Cancelling a child that is cancelling already is a no-op; an
// ended one is ErrEnded.
func (s *Store) Cancel(ctx context.Context, org, id, actor, reason string) (Handle, error) {
	if err := errors.Join(checkOrg(org), CheckID("subagent id", id),
		checkText("actor", actor, MaxSenderLen, true), checkText("reason", reason, MaxReasonLen, false)); err != nil {
		return Handle{}, err
	}
	tag, err := s.pool.Exec(ctx, `
UPDATE subagents SET status = 'cancelling', cancelled_by = $3, cancel_reason = $4, updated_at = now()
 WHERE org = $1 AND id = $2 AND status = 'running'`, org, id, actor, nullable(reason))
	if err != nil {
		return Handle{}, fmt.Errorf("cancel subagent %s: %w", id, err)
	}
	h, err := s.Get(ctx, org, id)
	if err != nil {
		return Handle{}, err
	}
	if tag.RowsAffected() == 1 {
		s.metrics.transitions.WithLabelValues(Cancelling).Inc()
		s.notify(ctx, org, id)
		return h, nil
	}
	if h.Status == Cancelling {
		return h, nil
	}
	return h, fmt.Errorf("%w: %s is %s", ErrEnded, id, h.Status)
}

// Drain hands the child its mailbox: every unacknowledged message (each counted as one more
// delivery) and whether it must stop. When there is neither, it waits up to wait (at most
// MaxWait) for a message or a cancel, woken by a notification, and looks again at the poll
// interval in case one was missed.
func (s *Store) Drain(ctx context.Context, org, id string, wait time.Duration) (Mailbox, error) {
	if err := errors.Join(checkOrg(org), CheckID("subagent id", id)); err != nil {
		return Mailbox{}, err
	}
	if wait < 0 || wait > MaxWait {
		return Mailbox{}, invalid("wait %s is not from 0 to %s", wait, MaxWait)
	}
	var wakeups <-chan struct{}
	if wait > 0 {
		l := s.ensureListener(ctx)
		ch, unsubscribe := l.Subscribe(org + "/" + id)
		defer unsubscribe()
		wakeups = ch
	}
	var box Mailbox
	err := pg.Await(ctx, wakeups, wait, s.poll, func() (bool, error) {
		var err error
		box, err = s.drainOnce(ctx, org, id)
		return box.Stop || len(box.Messages) > 0, err
	})
	if err != nil && ctx.Err() != nil {
		return Mailbox{}, fmt.Errorf("wait for the mailbox of %s: %w", id, err)
	}
	return box, err
}

func (s *Store) drainOnce(ctx context.Context, org, id string) (Mailbox, error) {
	rows, err := s.pool.Query(ctx, `
WITH h AS (
    SELECT status, coalesce(cancel_reason, '') AS reason FROM subagents WHERE org = $1 AND id = $2
), up AS (
    UPDATE subagent_messages SET deliveries = deliveries + 1, delivered_at = now()
     WHERE org = $1 AND subagent_id = $2 AND acked_at IS NULL AND EXISTS (SELECT 1 FROM h)
    RETURNING id, sender, body, sent_at, deliveries, delivered_at
)
SELECT h.status, h.reason, up.id, up.sender, up.body, up.sent_at, up.deliveries, up.delivered_at
  FROM h LEFT JOIN up ON true ORDER BY up.id`, org, id)
	if err != nil {
		return Mailbox{}, fmt.Errorf("drain the mailbox of %s: %w", id, err)
	}
	defer rows.Close()
	box := Mailbox{Messages: []Message{}}
	found := false
	for rows.Next() {
		found = true
		var mid *int64
		var sender, body *string
		var sentAt, deliveredAt *time.Time
		var deliveries *int
		if err := rows.Scan(&box.Status, &box.CancelReason, &mid, &sender, &body, &sentAt, &deliveries, &deliveredAt); err != nil {
			return Mailbox{}, fmt.Errorf("drain the mailbox of %s: %w", id, err)
		}
		if mid == nil {
			continue // the handle's row, with an empty mailbox
		}
		box.Messages = append(box.Messages, Message{ID: *mid, Sender: *sender, Body: *body, SentAt: *sentAt, Deliveries: *deliveries, DeliveredAt: deliveredAt})
		if *deliveries > 1 {
			s.metrics.redeliveries.Inc()
		}
	}
	if err := rows.Err(); err != nil {
		return Mailbox{}, fmt.Errorf("drain the mailbox of %s: %w", id, err)
	}
	if !found {
		return Mailbox{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	box.Stop = box.Status != Running
	return box, nil
}

// Ack marks messages of a child's mailbox acknowledged, so no Drain hands them out again.
// Ids already acknowledged, or not the child's, are ignored (an ack may be repeated); it
// returns how many were newly acknowledged.
func (s *Store) Ack(ctx context.Context, org, id string, ids []int64) (int, error) {
	if err := errors.Join(checkOrg(org), CheckID("subagent id", id)); err != nil {
		return 0, err
	}
	if len(ids) == 0 || len(ids) > MaxPending {
		return 0, invalid("an ack names 1 to %d message ids, not %d", MaxPending, len(ids))
	}
	var known, acked int
	err := s.pool.QueryRow(ctx, `
WITH up AS (
    UPDATE subagent_messages SET acked_at = now()
     WHERE org = $1 AND subagent_id = $2 AND id = ANY ($3) AND acked_at IS NULL
    RETURNING 1
)
SELECT (SELECT count(*) FROM subagents WHERE org = $1 AND id = $2), (SELECT count(*) FROM up)`, org, id, ids).Scan(&known, &acked)
	if err != nil {
		return 0, fmt.Errorf("acknowledge messages of %s: %w", id, err)
	}
	if known == 0 {
		return 0, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return acked, nil
}

// FailJob ends every live child of org's job as failed with reason: its worker is gone, so
// no hook will report them. It returns how many it ended.
func (s *Store) FailJob(ctx context.Context, org, jobID, reason string) (int, error) {
	return s.failJob(ctx, s.pool, org, jobID, reason)
}

// FailJobTx is FailJob inside tx, for a caller that fences it (the dispatcher does, by the
// home lease of the run that ended, so that a run which lost its lease never fails the
// children of the attempt that took over).
func (s *Store) FailJobTx(ctx context.Context, tx pgx.Tx, org, jobID, reason string) (int, error) {
	return s.failJob(ctx, tx, org, jobID, reason)
}

// querier is what a pool and a transaction share.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func (s *Store) failJob(ctx context.Context, q querier, org, jobID, reason string) (int, error) {
	if err := errors.Join(checkOrg(org), CheckID("job id", jobID), checkText("reason", reason, MaxSummaryLen, true)); err != nil {
		return 0, err
	}
	rows, err := q.Query(ctx, `
UPDATE subagents SET status = 'failed', summary = $3, ended_at = now(), updated_at = now()
 WHERE org = $1 AND job_id = $2 AND status IN ('running', 'cancelling')
RETURNING id`, org, jobID, reason)
	if err != nil {
		return 0, fmt.Errorf("fail subagents of job %s: %w", jobID, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("fail subagents of job %s: %w", jobID, err)
	}
	for _, id := range ids {
		// In a transaction the notification goes out at commit, when the drain can see it.
		if _, err := q.Exec(ctx, `SELECT pg_notify($1, $2)`, s.channel, org+"/"+id); err != nil {
			return 0, fmt.Errorf("fail subagents of job %s: %w", jobID, err)
		}
	}
	if len(ids) > 0 {
		s.metrics.transitions.WithLabelValues(Failed).Add(float64(len(ids)))
		s.log.Info("subagents of an ended job failed", "org", org, "job", jobID, "count", len(ids))
	}
	return len(ids), nil
}

// notify wakes a waiting Drain of org's id. A lost notification costs the waiter one poll
// interval, no more, so a failure is only logged.
func (s *Store) notify(ctx context.Context, org, id string) {
	if _, err := s.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, s.channel, org+"/"+id); err != nil {
		s.log.Warn("subagent notification not sent; a waiting child polls instead", "org", org, "subagent", id, "err", err)
	}
}

func (s *Store) ensureListener(ctx context.Context) *pg.Listener {
	s.listenOnce.Do(func() {
		s.listener = pg.Listen(s.pool.Config().ConnConfig, s.channel, s.log)
	})
	s.listener.Started(ctx)
	return s.listener
}
