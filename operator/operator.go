// Package operator keeps the accounts of the people who run the host and their per-org
// grants: an operator logs in to the launcher with a name and a password (kept only as a
// bcrypt hash) and may open the dashboards of the orgs granted to them, no others. Every
// change and every login, refused ones included, is an event row.
package operator

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"regexp"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"hermeshost/orgid"
)

// Password limits: bcrypt reads at most 72 bytes, and a longer password must not pass for
// its first 72.
const (
	MinPasswordLen = 12
	MaxPasswordLen = 72
	// DefaultCost is the bcrypt cost of new hashes (about a quarter of a second here).
	DefaultCost = 12
)

var (
	// ErrInvalid: malformed input; nothing was written.
	ErrInvalid = errors.New("invalid operator request")
	// ErrNotFound: no operator of that name.
	ErrNotFound = errors.New("no such operator")
	// ErrExists: an operator of that name exists already.
	ErrExists = errors.New("operator exists already")
	// ErrBadLogin: the name or password is wrong, or the operator is disabled. Which one is
	// never said.
	ErrBadLogin = errors.New("wrong name or password")
	// ErrThrottled: too many refused logins for the name lately; a *ThrottledError says
	// until when.
	ErrThrottled = errors.New("too many failed logins")
)

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// Operator is one account, without its hash.
type Operator struct {
	Name       string
	Disabled   bool
	CreatedAt  time.Time
	PasswordAt time.Time
	Orgs       []string // granted, sorted
}

// Event is one row of an operator's history.
type Event struct {
	Kind  string
	Org   string
	Actor string
	At    time.Time
}

// Store is the operator tables of one database.
type Store struct {
	pool *pgxpool.Pool
	cost int
	// dummy is compared against when the name is unknown, so that a login for a name that
	// does not exist takes as long as one with a wrong password.
	dummy []byte
	// checks holds a place per bcrypt comparison of a login running (maxChecks).
	checks chan struct{}
	// firstDelay is the delay after MaxLoginFailures tries (firstLoginDelay; a test that
	// counts tries made at once lengthens it, so that none of them comes after it).
	firstDelay time.Duration
}

// New is a Store on pool whose new hashes have bcrypt cost cost (DefaultCost when zero).
func New(pool *pgxpool.Pool, cost int) (*Store, error) {
	if cost == 0 {
		cost = DefaultCost
	}
	if cost < bcrypt.MinCost || cost > bcrypt.MaxCost {
		return nil, fmt.Errorf("operator store: bcrypt cost %d is outside %d..%d", cost, bcrypt.MinCost, bcrypt.MaxCost)
	}
	dummy, err := bcrypt.GenerateFromPassword([]byte(rand.Text()), cost)
	if err != nil {
		return nil, fmt.Errorf("operator store: %w", err)
	}
	return &Store{pool: pool, cost: cost, dummy: dummy, checks: make(chan struct{}, maxChecks), firstDelay: firstLoginDelay}, nil
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

// CheckName reports whether name can be an operator's.
func CheckName(name string) error {
	if !namePattern.MatchString(name) {
		return invalid("operator name %q must be 1 to 64 lower-case letters, digits, dots, underscores or dashes, starting with a letter or digit", clip(name))
	}
	return nil
}

// CheckPassword reports whether password is acceptable: MinPasswordLen characters at least,
// MaxPasswordLen bytes at most, valid UTF-8 without control characters.
func CheckPassword(password string) error {
	switch {
	case !utf8.ValidString(password):
		return invalid("the password is not valid UTF-8")
	case utf8.RuneCountInString(password) < MinPasswordLen:
		return invalid("the password has %d characters; it needs at least %d", utf8.RuneCountInString(password), MinPasswordLen)
	case len(password) > MaxPasswordLen:
		return invalid("the password is %d bytes; bcrypt takes at most %d", len(password), MaxPasswordLen)
	}
	for _, r := range password {
		if r < ' ' || r == 0x7f {
			return invalid("the password holds a control character")
		}
	}
	return nil
}

func checkOrg(org string) error {
	if !orgid.Valid(org) {
		return invalid("organization id %q is not one (lower-case letters, digits and dashes)", clip(org))
	}
	return nil
}

func checkActor(actor string) error {
	if actor == "" || len(actor) > 200 || !utf8.ValidString(actor) {
		return invalid("the actor must be 1 to 200 bytes of UTF-8")
	}
	return nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// GeneratePassword is a random password of 26 characters (130 bits), for an account made
// without one.
func GeneratePassword() string { return rand.Text() }

func (s *Store) event(ctx context.Context, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, name, kind, org, actor string) error {
	var o *string
	if org != "" {
		o = &org
	}
	_, err := q.Exec(ctx, `INSERT INTO operator_events (operator, kind, org, actor) VALUES ($1, $2, $3, $4)`, name, kind, o, actor)
	return err
}

// Add makes an operator with password; actor is who made it.
func (s *Store) Add(ctx context.Context, name, password, actor string) error {
	if err := errors.Join(CheckName(name), CheckPassword(password), checkActor(actor)); err != nil {
		return err
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), s.cost)
	if err != nil {
		return fmt.Errorf("hash the password of %s: %w", name, err)
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO operators (name, password_hash) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, name, string(hash))
		if err != nil {
			return fmt.Errorf("add operator %s: %w", name, err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("%w: %s", ErrExists, name)
		}
		return s.event(ctx, tx, name, "add", "", actor)
	})
}

// SetPassword replaces name's password.
func (s *Store) SetPassword(ctx context.Context, name, password, actor string) error {
	if err := errors.Join(CheckName(name), CheckPassword(password), checkActor(actor)); err != nil {
		return err
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), s.cost)
	if err != nil {
		return fmt.Errorf("hash the password of %s: %w", name, err)
	}
	return s.change(ctx, name, "password", "", actor, `UPDATE operators SET password_hash = $2, password_at = now() WHERE name = $1`, string(hash))
}

// SetDisabled disables (true) or enables (false) name's logins.
func (s *Store) SetDisabled(ctx context.Context, name string, disabled bool, actor string) error {
	if err := errors.Join(CheckName(name), checkActor(actor)); err != nil {
		return err
	}
	if disabled {
		return s.change(ctx, name, "disable", "", actor, `UPDATE operators SET disabled_at = coalesce(disabled_at, now()) WHERE name = $1`)
	}
	return s.change(ctx, name, "enable", "", actor, `UPDATE operators SET disabled_at = NULL WHERE name = $1`)
}

// Remove deletes name and its grants; its events stay.
func (s *Store) Remove(ctx context.Context, name, actor string) error {
	if err := errors.Join(CheckName(name), checkActor(actor)); err != nil {
		return err
	}
	return s.change(ctx, name, "remove", "", actor, `DELETE FROM operators WHERE name = $1`)
}

// change runs one statement on name's row with its event, or ErrNotFound.
func (s *Store) change(ctx context.Context, name, kind, org, actor, sql string, args ...any) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sql, append([]any{name}, args...)...)
		if err != nil {
			return fmt.Errorf("%s operator %s: %w", kind, name, err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		return s.event(ctx, tx, name, kind, org, actor)
	})
}

// Grant lets name open org's dashboard. Granting again is a no-op.
func (s *Store) Grant(ctx context.Context, name, org, actor string) error {
	if err := errors.Join(CheckName(name), checkOrg(org), checkActor(actor)); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The foreign key both refuses an unknown operator and keeps a concurrent Remove
		// from leaving the grant behind.
		tag, err := tx.Exec(ctx, `INSERT INTO operator_grants (operator, org, granted_by) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, name, org, actor)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23503" {
			return fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		if err != nil {
			return fmt.Errorf("grant %s to %s: %w", org, name, err)
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
		return s.event(ctx, tx, name, "grant", org, actor)
	})
}

// Revoke takes org's grant from name. Revoking what was not granted is a no-op.
func (s *Store) Revoke(ctx context.Context, name, org, actor string) error {
	if err := errors.Join(CheckName(name), checkOrg(org), checkActor(actor)); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := s.get(ctx, tx, name); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM operator_grants WHERE operator = $1 AND org = $2`, name, org)
		if err != nil {
			return fmt.Errorf("revoke %s from %s: %w", org, name, err)
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
		return s.event(ctx, tx, name, "revoke", org, actor)
	})
}

// Get is one operator with their grants.
func (s *Store) Get(ctx context.Context, name string) (Operator, error) {
	if err := CheckName(name); err != nil {
		return Operator{}, err
	}
	return s.get(ctx, s.pool, name)
}

type queryer interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

const operatorColumns = `name, disabled_at IS NOT NULL, created_at, password_at,
       coalesce((SELECT array_agg(org ORDER BY org) FROM operator_grants g WHERE g.operator = o.name), '{}')`

func scanOperator(row pgx.CollectableRow) (Operator, error) {
	var o Operator
	err := row.Scan(&o.Name, &o.Disabled, &o.CreatedAt, &o.PasswordAt, &o.Orgs)
	return o, err
}

func (s *Store) get(ctx context.Context, q queryer, name string) (Operator, error) {
	rows, err := q.Query(ctx, `SELECT `+operatorColumns+` FROM operators o WHERE name = $1`, name)
	if err != nil {
		return Operator{}, fmt.Errorf("read operator %s: %w", name, err)
	}
	o, err := pgx.CollectExactlyOneRow(rows, scanOperator)
	if errors.Is(err, pgx.ErrNoRows) {
		return Operator{}, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return Operator{}, fmt.Errorf("read operator %s: %w", name, err)
	}
	return o, nil
}

// List is every operator, by name.
func (s *Store) List(ctx context.Context) ([]Operator, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+operatorColumns+` FROM operators o ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list operators: %w", err)
	}
	ops, err := pgx.CollectRows(rows, scanOperator)
	if err != nil {
		return nil, fmt.Errorf("list operators: %w", err)
	}
	return ops, nil
}

// Events is name's history, newest first, at most limit rows.
func (s *Store) Events(ctx context.Context, name string, limit int) ([]Event, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT kind, coalesce(org, ''), actor, at FROM operator_events WHERE operator = $1 ORDER BY id DESC LIMIT $2`, name, limit)
	if err != nil {
		return nil, fmt.Errorf("events of operator %s: %w", name, err)
	}
	evs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) {
		var e Event
		err := row.Scan(&e.Kind, &e.Org, &e.Actor, &e.At)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("events of operator %s: %w", name, err)
	}
	return evs, nil
}

// Login throttling, per name and client address: MaxLoginFailures tries that were not a
// good login (within LoginFailureWindow of each other) are checked; past them a try from
// that address is checked only once a delay has passed since its last one, a delay that
// doubles with each further try (from one second, up to LoginFailureWindow). A good login
// from an address clears its count. Another address is counted apart, so strangers slow a
// name down from where they are and never lock its operator out from elsewhere. Names that
// are no operator's count alike, so the throttle does not tell which names exist.
const (
	MaxLoginFailures   = 10
	LoginFailureWindow = 15 * time.Minute
	firstLoginDelay    = time.Second
)

// maxChecks bounds the bcrypt comparisons running at once for logins: each takes tens of
// milliseconds of a core, and unauthenticated requests must not take them all.
const maxChecks = 4

// ThrottledError is ErrThrottled with when the name may try again.
type ThrottledError struct{ Until time.Time }

func (e *ThrottledError) Error() string {
	return fmt.Sprintf("%v: try again after %s", ErrThrottled, e.Until.UTC().Format(time.TimeOnly+" UTC"))
}

func (e *ThrottledError) Unwrap() error { return ErrThrottled }

// reserveTry counts a try of name from client before its password is checked, in the same
// statement that checks the limit: under the limit (or past the delay) it is counted and
// may be checked (zero time); otherwise it is refused unchecked until the time returned.
func (s *Store) reserveTry(ctx context.Context, name, client string) (time.Time, error) {
	var allowed bool
	var until time.Time
	err := s.pool.QueryRow(ctx, `
WITH try AS (
    INSERT INTO login_throttle AS t (name, client, failures) VALUES ($1, $2, 1)
    ON CONFLICT (name, client) DO UPDATE
       SET failures = CASE WHEN t.last_at < now() - $3::interval THEN 1 ELSE t.failures + 1 END, last_at = now()
     WHERE t.failures < $4 OR t.last_at < now() - $3::interval
        OR t.last_at < now() - least($3::interval, $5::interval * power(2, t.failures - $4))
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM try),
       coalesce((SELECT last_at + least($3::interval, $5::interval * power(2, failures - $4))
                   FROM login_throttle WHERE name = $1 AND client = $2), now())`,
		name, client, LoginFailureWindow.String(), MaxLoginFailures, s.firstDelay.String()).Scan(&allowed, &until)
	if err != nil || allowed {
		return time.Time{}, err
	}
	return until, nil
}

// clientOf is the address part of from (host:port, as a request's RemoteAddr).
func clientOf(from string) string {
	if host, _, err := net.SplitHostPort(from); err == nil {
		return host
	}
	return from
}

// PruneThrottle forgets the counts of addresses that have not tried within the window.
func (s *Store) PruneThrottle(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM login_throttle WHERE last_at < now() - $1::interval`, LoginFailureWindow.String())
	if err != nil {
		return fmt.Errorf("prune login throttle: %w", err)
	}
	return nil
}

// Authenticate checks a login: the operator with their grants, or ErrBadLogin for a wrong
// name, a wrong password or a disabled account alike, taking about as long for each; a
// *ThrottledError once the name has failed too often. from (an address, say) is recorded
// with the event.
func (s *Store) Authenticate(ctx context.Context, name, password, from string) (Operator, error) {
	if from == "" {
		from = "unknown"
	}
	client := clientOf(from)
	if CheckName(name) == nil {
		until, err := s.reserveTry(ctx, name, client)
		if err != nil {
			return Operator{}, fmt.Errorf("log in %s: %w", name, err)
		}
		if !until.IsZero() {
			return Operator{}, &ThrottledError{Until: until}
		}
	}
	select {
	case s.checks <- struct{}{}:
		defer func() { <-s.checks }()
	case <-ctx.Done():
		return Operator{}, fmt.Errorf("log in %s: %w", name, context.Cause(ctx))
	}
	var hash string
	var disabled bool
	known := CheckName(name) == nil
	if known {
		err := s.pool.QueryRow(ctx, `SELECT password_hash, disabled_at IS NOT NULL FROM operators WHERE name = $1`, name).Scan(&hash, &disabled)
		if errors.Is(err, pgx.ErrNoRows) {
			known = false
		} else if err != nil {
			return Operator{}, fmt.Errorf("log in %s: %w", name, err)
		}
	}
	// An unknown name, or a password longer than bcrypt reads (which must not pass for its
	// first 72 bytes), is compared against the dummy hash: the same work as any other
	// wrong password, and never a match.
	stored, pw := s.dummy, []byte(password)
	if known && len(pw) <= MaxPasswordLen {
		stored = []byte(hash)
	}
	if len(pw) > MaxPasswordLen {
		pw = pw[:MaxPasswordLen]
	}
	match := bcrypt.CompareHashAndPassword(stored, pw) == nil && known && len(password) <= MaxPasswordLen
	if !known || !match || disabled {
		if CheckName(name) == nil {
			if err := s.event(ctx, s.pool, name, "login_refused", "", from); err != nil {
				return Operator{}, fmt.Errorf("log in %s: %w", name, err)
			}
		}
		return Operator{}, ErrBadLogin
	}
	if err := s.event(ctx, s.pool, name, "login", "", from); err != nil {
		return Operator{}, fmt.Errorf("log in %s: %w", name, err)
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM login_throttle WHERE name = $1 AND client = $2`, name, client); err != nil {
		return Operator{}, fmt.Errorf("log in %s: %w", name, err)
	}
	return s.get(ctx, s.pool, name)
}

// Allowed reports whether name (enabled) holds a grant for org. It is asked on every
// request that reaches an org, so a revoke or a disable takes effect at once.
func (s *Store) Allowed(ctx context.Context, name, org string) (bool, error) {
	if CheckName(name) != nil || checkOrg(org) != nil {
		return false, nil
	}
	var ok bool
	err := s.pool.QueryRow(ctx, `
SELECT EXISTS (SELECT 1 FROM operator_grants g JOIN operators o ON o.name = g.operator
                WHERE g.operator = $1 AND g.org = $2 AND o.disabled_at IS NULL)`, name, org).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("check %s's grant for %s: %w", name, org, err)
	}
	return ok, nil
}
