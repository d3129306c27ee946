// Package dashboards records each organization's dashboard in Postgres, so that the launcher,
// which holds no container runtime, can ask for one and find where it answers, and the
// dispatcher that owns the org can start it, record it and stop it.
//
// One row per org. The launcher makes it requested (Request, or Unreachable when the
// recorded address stopped answering), which notifies hermes_dashboards in the same
// statement; a dispatcher hears it through Wake, takes the row (Start: one statement, so of
// two dispatchers only one wins), and records it Running with its URL, Failed with a reason
// for the operator, or Stopped. The dispatcher's transitions name its instance and change
// only a row that instance holds in the expected state; any other row is left alone and
// the call returns ErrNotHeld.
package dashboards

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/internal/unitnet"
	"hermeshost/orgid"
)

// State is where an org's dashboard is in its life.
type State string

// The states of a dashboard row. Requested waits for a dispatcher; Starting and Running are
// held by one dispatcher instance; Failed and Stopped wait for the next request.
const (
	Requested State = "requested"
	Starting  State = "starting"
	Running   State = "running"
	Failed    State = "failed"
	Stopped   State = "stopped"
)

// Dashboard is one org's row.
type Dashboard struct {
	Org, URL, Instance, Error, RequestedBy string
	State                                  State
	RequestedAt, UpdatedAt                 time.Time
	StartedAt, LastSeenAt                  *time.Time
}

// Channel is where a row that became requested is announced, with the org as payload.
const Channel = "hermes_dashboards"

// Limits on what a row may hold.
const (
	MaxReasonLen   = 2000 // a longer failure reason is cut
	maxByLen       = 200
	maxURLLen      = 2048
	seenResolution = time.Second // Seen writes at most once per this, however busy the proxy
)

var (
	// ErrNotFound: Get found no row for the org.
	ErrNotFound = errors.New("no dashboard recorded for this organization")
	// ErrInvalid: an org id, instance, URL or name is malformed; nothing was read or written.
	ErrInvalid = errors.New("invalid dashboard request")
	// ErrNotHeld: a dispatcher's transition found the row not held by its instance in the
	// state the transition starts from (another instance took it, or it moved on); nothing
	// was changed.
	ErrNotHeld = errors.New("dashboard not held by this instance in that state")
)

var (
	instancePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)
)

// Options tune a Store; the zero value is usable.
type Options struct {
	Log *slog.Logger
	// Registerer receives hermes_dashboards_transitions_total (none when nil).
	Registerer prometheus.Registerer
	// Channel overrides the notification channel (default Channel), for tests that must
	// not hear other schemas' requests. The launcher's and the dispatcher's stores must
	// agree on it.
	Channel string
}

// Store is the dashboards table of one database.
type Store struct {
	pool    *pgxpool.Pool
	log     *slog.Logger
	channel string
	metrics *metrics

	wake chan struct{} // one slot: notifications coalesce

	mu           sync.Mutex
	listening    bool
	stopListen   context.CancelFunc
	listenerDone chan struct{}
}

// New is a Store on pool.
func New(pool *pgxpool.Pool, opts Options) *Store {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Channel == "" {
		opts.Channel = Channel
	}
	return &Store{
		pool: pool, log: opts.Log, channel: opts.Channel, metrics: newMetrics(opts.Registerer),
		wake: make(chan struct{}, 1),
	}
}

// Close stops the listener, if Wake started one, and waits for it.
func (s *Store) Close() {
	s.mu.Lock()
	stop, done := s.stopListen, s.listenerDone
	s.stopListen = nil
	s.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

// clip keeps an echoed bad value short.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func checkOrg(org string) error {
	if !orgid.Valid(org) {
		return invalid("organization id %q must match %s", clip(org), orgid.Rule)
	}
	return nil
}

func checkInstance(instance string) error {
	if !instancePattern.MatchString(instance) {
		return invalid("instance %q must match %s", clip(instance), instancePattern)
	}
	return nil
}

// checkURL accepts where a dashboard is reached: an absolute http(s) URL, or the unix:
// socket it serves on (unitnet.URL).
func checkURL(raw string) error {
	if _, ok := unitnet.SocketPath(raw); ok && len(raw) <= maxURLLen {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(raw) > maxURLLen {
		return invalid("dashboard URL %q is not an absolute http(s) URL or unix:/socket of at most %d bytes", clip(raw), maxURLLen)
	}
	return nil
}

func checkBy(by string) error {
	if by == "" || len(by) > maxByLen || !utf8.ValidString(by) || strings.ContainsFunc(by, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return invalid("requester %q must be 1 to %d printable bytes", clip(by), maxByLen)
	}
	return nil
}

// cleanReason makes a failure reason storable: valid UTF-8, no NUL (Postgres refuses it),
// at most MaxReasonLen characters. A reason is not refused for its content: the operator
// must see why.
func cleanReason(reason string) (string, error) {
	reason = strings.ReplaceAll(strings.ToValidUTF8(reason, "?"), "\x00", "")
	if strings.TrimSpace(reason) == "" {
		return "", invalid("a failure needs a reason")
	}
	if utf8.RuneCountInString(reason) > MaxReasonLen {
		reason = string([]rune(reason)[:MaxReasonLen-3]) + "..."
	}
	return reason, nil
}

const columns = `org, state, coalesce(url, ''), coalesce(instance, ''), coalesce(error, ''), coalesce(requested_by, ''),
       requested_at, updated_at, started_at, last_seen_at`

func scan(row pgx.CollectableRow) (Dashboard, error) {
	var d Dashboard
	err := row.Scan(&d.Org, &d.State, &d.URL, &d.Instance, &d.Error, &d.RequestedBy,
		&d.RequestedAt, &d.UpdatedAt, &d.StartedAt, &d.LastSeenAt)
	return d, err
}

func (s *Store) list(ctx context.Context, what, query string, args ...any) ([]Dashboard, error) {
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	ds, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return ds, nil
}

// Get is org's row; ErrNotFound when none was ever requested.
func (s *Store) Get(ctx context.Context, org string) (Dashboard, error) {
	if err := checkOrg(org); err != nil {
		return Dashboard{}, err
	}
	ds, err := s.list(ctx, "read the dashboard of "+org, `SELECT `+columns+` FROM dashboards WHERE org = $1`, org)
	if err != nil {
		return Dashboard{}, err
	}
	if len(ds) == 0 {
		return Dashboard{}, fmt.Errorf("%w: %s", ErrNotFound, org)
	}
	return ds[0], nil
}

// Request asks for org's dashboard on behalf of by (an operator's name): no row, stopped or
// failed become requested (and notify); requested, starting and running are left as they
// are. It returns the row as it now is.
func (s *Store) Request(ctx context.Context, org, by string) (Dashboard, error) {
	if err := errors.Join(checkOrg(org), checkBy(by)); err != nil {
		return Dashboard{}, err
	}
	// The notification goes out at commit, when a woken dispatcher can see the row.
	ds, err := s.list(ctx, "request the dashboard of "+org, `
WITH up AS (
    INSERT INTO dashboards AS d (org, state, requested_by) VALUES ($1, 'requested', $2)
    ON CONFLICT (org) DO UPDATE SET state = 'requested', requested_by = EXCLUDED.requested_by,
           requested_at = now(), updated_at = now(), url = NULL, instance = NULL, error = NULL,
           started_at = NULL, last_seen_at = NULL
     WHERE d.state IN ('stopped', 'failed')
    RETURNING *
), n AS (
    SELECT pg_notify($3, org) FROM up
)
SELECT `+columns+` FROM up CROSS JOIN (SELECT count(*) FROM n) AS sent`, org, by, s.channel)
	if err != nil {
		return Dashboard{}, err
	}
	if len(ds) == 1 {
		s.metrics.transitions.WithLabelValues(string(Requested)).Inc()
		s.log.Info("dashboard requested", "org", org, "by", by)
		return ds[0], nil
	}
	return s.Get(ctx, org)
}

// Unreachable says the launcher could not reach url: a running row with that url becomes
// requested again (and notifies), so its owner starts it anew; any other state, or another
// url (the dashboard was restarted meanwhile), is left alone.
func (s *Store) Unreachable(ctx context.Context, org, url string) error {
	if err := errors.Join(checkOrg(org), checkURL(url)); err != nil {
		return err
	}
	var n int
	err := s.pool.QueryRow(ctx, `
WITH up AS (
    UPDATE dashboards SET state = 'requested', url = NULL, instance = NULL, error = NULL,
           started_at = NULL, last_seen_at = NULL, requested_at = now(), updated_at = now()
     WHERE org = $1 AND state = 'running' AND url = $2
    RETURNING org
), n AS (
    SELECT pg_notify($3, org) FROM up
)
SELECT count(*) FROM n`, org, url, s.channel).Scan(&n)
	if err != nil {
		return fmt.Errorf("report the dashboard of %s unreachable: %w", org, err)
	}
	if n > 0 {
		s.metrics.transitions.WithLabelValues(string(Requested)).Inc()
		s.log.Warn("dashboard unreachable: requested again", "org", org, "url", url)
	}
	return nil
}

// Seen marks org's running dashboard used now; the idle timeout counts from it. It writes
// at most once a second per org, however many requests the proxy passes, and leaves a
// dashboard that is not running alone.
func (s *Store) Seen(ctx context.Context, org string) error {
	if err := checkOrg(org); err != nil {
		return err
	}
	_, err := s.pool.Exec(ctx, `
UPDATE dashboards SET last_seen_at = now()
 WHERE org = $1 AND state = 'running' AND (last_seen_at IS NULL OR last_seen_at < now() - $2 * interval '1 microsecond')`,
		org, seenResolution.Microseconds())
	if err != nil {
		return fmt.Errorf("mark the dashboard of %s seen: %w", org, err)
	}
	return nil
}

// Pending is every requested row, oldest request first.
func (s *Store) Pending(ctx context.Context) ([]Dashboard, error) {
	return s.list(ctx, "list requested dashboards",
		`SELECT `+columns+` FROM dashboards WHERE state = 'requested' ORDER BY requested_at, org`)
}

// OfInstance is every starting or running row held by instance.
func (s *Store) OfInstance(ctx context.Context, instance string) ([]Dashboard, error) {
	if err := checkInstance(instance); err != nil {
		return nil, err
	}
	return s.list(ctx, "list the dashboards of instance "+instance,
		`SELECT `+columns+` FROM dashboards WHERE instance = $1 AND state IN ('starting', 'running') ORDER BY org`, instance)
}

// Start takes org's requested row for instance (requested -> starting), in one statement:
// false when the row is not requested (another instance took it first, or nobody asked).
func (s *Store) Start(ctx context.Context, org, instance string) (bool, error) {
	if err := errors.Join(checkOrg(org), checkInstance(instance)); err != nil {
		return false, err
	}
	tag, err := s.pool.Exec(ctx, `
UPDATE dashboards SET state = 'starting', instance = $2, error = NULL, updated_at = now()
 WHERE org = $1 AND state = 'requested'`, org, instance)
	if err != nil {
		return false, fmt.Errorf("take the dashboard of %s: %w", org, err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	s.metrics.transitions.WithLabelValues(string(Starting)).Inc()
	return true, nil
}

// Running records org's dashboard answering at url (starting -> running); started_at and
// last_seen_at are now.
func (s *Store) Running(ctx context.Context, org, instance, url string) error {
	if err := errors.Join(checkOrg(org), checkInstance(instance), checkURL(url)); err != nil {
		return err
	}
	return s.move(ctx, org, instance, Running, []State{Starting},
		`state = 'running', url = $3, started_at = now(), last_seen_at = now()`, url)
}

// Fail records why org's dashboard could not start or run (starting or running -> failed).
// reason is shown to the operator: it must never hold a secret. A reason longer than
// MaxReasonLen is cut.
func (s *Store) Fail(ctx context.Context, org, instance, reason string) error {
	if err := errors.Join(checkOrg(org), checkInstance(instance)); err != nil {
		return err
	}
	reason, err := cleanReason(reason)
	if err != nil {
		return err
	}
	return s.move(ctx, org, instance, Failed, []State{Starting, Running}, `state = 'failed', url = NULL, error = $3`, reason)
}

// Stopped records org's dashboard gone (starting or running -> stopped); the next request
// starts it again.
func (s *Store) Stopped(ctx context.Context, org, instance string) error {
	if err := errors.Join(checkOrg(org), checkInstance(instance)); err != nil {
		return err
	}
	return s.move(ctx, org, instance, Stopped, []State{Starting, Running}, `state = 'stopped', url = NULL`)
}

// StopIfIdle records org's running dashboard stopped when it has not been seen for idle
// (by the database's clock, which also stamped Seen), in one statement, so that a use the
// launcher records meanwhile keeps it. It reports whether the row was stopped; the caller
// then stops the unit.
func (s *Store) StopIfIdle(ctx context.Context, org, instance string, idle time.Duration) (bool, error) {
	if err := errors.Join(checkOrg(org), checkInstance(instance)); err != nil {
		return false, err
	}
	if idle <= 0 {
		return false, invalid("idle timeout %s is not positive", idle)
	}
	tag, err := s.pool.Exec(ctx, `
UPDATE dashboards SET state = 'stopped', url = NULL, updated_at = now()
 WHERE org = $1 AND instance = $2 AND state = 'running' AND last_seen_at <= now() - $3 * interval '1 microsecond'`,
		org, instance, idle.Microseconds())
	if err != nil {
		return false, fmt.Errorf("stop the idle dashboard of %s: %w", org, err)
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	s.metrics.transitions.WithLabelValues(string(Stopped)).Inc()
	return true, nil
}

// Requeue gives back a start that instance could not finish for a reason of its own (it is
// shutting down): starting -> requested (and notify), so another dispatcher takes it at
// once and the operator sees no failure.
func (s *Store) Requeue(ctx context.Context, org, instance string) error {
	if err := errors.Join(checkOrg(org), checkInstance(instance)); err != nil {
		return err
	}
	var n int
	err := s.pool.QueryRow(ctx, `
WITH up AS (
    UPDATE dashboards SET state = 'requested', instance = NULL, updated_at = now()
     WHERE org = $1 AND instance = $2 AND state = 'starting'
    RETURNING org
), n AS (
    SELECT pg_notify($3, org) FROM up
)
SELECT count(*) FROM n`, org, instance, s.channel).Scan(&n)
	if err != nil {
		return fmt.Errorf("give back the dashboard start of %s: %w", org, err)
	}
	if n == 0 {
		return s.notHeld(ctx, org, instance, []State{Starting})
	}
	s.metrics.transitions.WithLabelValues(string(Requested)).Inc()
	return nil
}

// move sets the row of org held by instance in one of from with set (whose arguments
// start at $3).
func (s *Store) move(ctx context.Context, org, instance string, to State, from []State, set string, args ...any) error {
	states := make([]string, len(from))
	for i, st := range from {
		states[i] = string(st)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE dashboards SET `+set+`, updated_at = now()
 WHERE org = $1 AND instance = $2 AND state = ANY ($`+fmt.Sprint(3+len(args))+`)`,
		append(append([]any{org, instance}, args...), states)...)
	if err != nil {
		return fmt.Errorf("record the dashboard of %s %s: %w", org, to, err)
	}
	if tag.RowsAffected() == 0 {
		return s.notHeld(ctx, org, instance, from)
	}
	s.metrics.transitions.WithLabelValues(string(to)).Inc()
	return nil
}

// notHeld is ErrNotHeld, saying what the row is instead.
func (s *Store) notHeld(ctx context.Context, org, instance string, from []State) error {
	want := fmt.Sprintf("%v for %s", from, instance)
	d, err := s.Get(ctx, org)
	switch {
	case errors.Is(err, ErrNotFound):
		return fmt.Errorf("%w: %s has no row (want %s)", ErrNotHeld, org, want)
	case err != nil:
		return fmt.Errorf("%w: %s (want %s; reading it failed: %v)", ErrNotHeld, org, want, err)
	case d.Instance == "":
		return fmt.Errorf("%w: %s is %s (want %s)", ErrNotHeld, org, d.State, want)
	}
	return fmt.Errorf("%w: %s is %s for %s (want %s)", ErrNotHeld, org, d.State, d.Instance, want)
}
