package lease

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/pg"
)

// Store is the lease table of one database.
type Store struct {
	pool *pgxpool.Pool
	// keep runs the statements that keep or give up a holding (Refresh, RefreshAll,
	// Release, and so Keep's refreshes): Options.KeepPool, else pool.
	keep    *pgxpool.Pool
	log     *slog.Logger
	metrics *metrics
	poll    time.Duration
	// channel carries the key of every lease of this schema that became free.
	channel string

	listenOnce sync.Once
	listener   *pg.Listener
	// eventsListener wakes Changes' waiters (eventsChannel).
	eventsOnce     sync.Once
	eventsListener *pg.Listener
}

// Options tune a Store; the zero value is usable.
type Options struct {
	Log *slog.Logger
	// Registerer receives the lease metrics (none when nil).
	Registerer prometheus.Registerer
	// Poll is how often a waiting Acquire retries when no notification arrives (1s).
	Poll time.Duration
	// KeepPool, when set, is a small pool of the same database kept for refreshing and
	// releasing this Store's holdings, so that a holder whose main pool is busy (a
	// dispatcher's steps and mirror writes) never lets a lease lapse while its refresh
	// waits for a connection. Give it to the Store of a holder's own leases only: requests
	// made for others (the control API's, for agents) would queue in it.
	KeepPool *pgxpool.Pool
}

// KeepPoolConns is the size of a dispatcher's KeepPool. Its statements are one short
// UPDATE each, a few per second at 200 orgs running: four connections leave room for a
// round of org: leases, the instance's lease and every run's home: lease at once.
const KeepPoolConns = 4

// New is a Store on pool.
func New(pool *pgxpool.Pool, opts Options) *Store {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	schema := pool.Config().ConnConfig.RuntimeParams["search_path"]
	keep := opts.KeepPool
	if keep == nil {
		keep = pool
	}
	return &Store{
		pool: pool, keep: keep, log: opts.Log, metrics: newMetrics(opts.Registerer), poll: opts.Poll,
		channel: "hermes_lease_free_" + schema[:min(len(schema), 40)],
	}
}

// Close stops the notification listener, if one was started.
func (s *Store) Close() {
	if s.listener != nil {
		s.listener.Close()
	}
	if s.eventsListener != nil {
		s.eventsListener.Close()
	}
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// TryAcquire takes key for holder for ttl, in one statement: it inserts the row, or takes
// over one that is free or expired (bumping the epoch). When someone else holds it, the
// error is a *HeldError (errors.Is(err, ErrHeld)).
func (s *Store) TryAcquire(ctx context.Context, key, holder string, ttl time.Duration) (Lease, error) {
	if err := errors.Join(CheckKey(key), CheckHolder(holder), CheckTTL(ttl)); err != nil {
		return Lease{}, err
	}
	return s.tryAcquire(ctx, key, holder, ttl, 0)
}

// tryAcquire is TryAcquire; with waitFor > 0 a held key is also marked as waited for that
// long, so that its release notifies. The mark and the take are one UPDATE of the row, so
// a release either sees the mark or is seen by the take: no wake-up is lost between them.
func (s *Store) tryAcquire(ctx context.Context, key, holder string, ttl, waitFor time.Duration) (Lease, error) {
	var l Lease
	var won bool
	var takenFrom *string
	secret := rand.Text()
	// Without waitFor the update only touches a row that is free or expired, so a contended
	// attempt takes no row lock and never stalls the holder's fenced writes. With it, the
	// same single UPDATE either takes a free row or marks a held one as waited for: a
	// concurrent release either sees the mark (and notifies) or is seen by the take. The
	// insert covers a key nobody has taken yet; the last branch reports the holder.
	err := s.pool.QueryRow(ctx, `
WITH up AS (
    UPDATE leases l SET
        holder        = CASE WHEN l.holder IS NULL OR l.expires_at <= now() THEN $2 ELSE l.holder END,
        epoch         = CASE WHEN l.holder IS NULL OR l.expires_at <= now() THEN l.epoch + 1 ELSE l.epoch END,
        acquired_at   = CASE WHEN l.holder IS NULL OR l.expires_at <= now() THEN now() ELSE l.acquired_at END,
        expires_at    = CASE WHEN l.holder IS NULL OR l.expires_at <= now() THEN now() + $3 * interval '1 microsecond' ELSE l.expires_at END,
        taken_from    = CASE WHEN l.holder IS NULL OR l.expires_at <= now() THEN l.holder ELSE l.taken_from END,
        waiting_until = CASE WHEN l.holder IS NULL OR l.expires_at <= now() THEN NULL
                             ELSE greatest(l.waiting_until, now() + $4 * interval '1 microsecond') END,
        secret_hash   = CASE WHEN l.holder IS NULL OR l.expires_at <= now() THEN $5 ELSE l.secret_hash END,
        updated_at    = now()
     WHERE l.key = $1 AND ($4 > 0 OR l.holder IS NULL OR l.expires_at <= now())
    RETURNING key, holder, epoch, acquired_at, expires_at, taken_from, (holder = $2 AND acquired_at = now()) AS won
), ins AS (
    INSERT INTO leases (key, holder, epoch, acquired_at, expires_at, secret_hash, updated_at)
    SELECT $1, $2, 1, now(), now() + $3 * interval '1 microsecond', $5, now()
     WHERE NOT EXISTS (SELECT 1 FROM leases WHERE key = $1)
    ON CONFLICT (key) DO NOTHING
    RETURNING key, holder, epoch, acquired_at, expires_at, taken_from, true AS won
), won AS (
    SELECT * FROM up WHERE won UNION ALL SELECT * FROM ins
), ev AS (
    INSERT INTO lease_events (key, kind, holder, epoch, previous_holder)
    SELECT key, CASE WHEN taken_from IS NULL THEN 'acquire' ELSE 'takeover' END, holder, epoch, taken_from FROM won
)
SELECT true, key, holder, epoch, acquired_at, expires_at, taken_from FROM won
UNION ALL
SELECT false, key, holder, epoch, acquired_at, expires_at, NULL FROM up WHERE NOT won
UNION ALL
SELECT false, key, coalesce(holder, ''), epoch, coalesce(acquired_at, 'epoch'::timestamptz), coalesce(expires_at, 'epoch'::timestamptz), NULL
  FROM leases WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM up) AND NOT EXISTS (SELECT 1 FROM ins)`,
		key, holder, micros(ttl), micros(waitFor), secretHash(secret)).Scan(&won, &l.Key, &l.Holder, &l.Epoch, &l.AcquiredAt, &l.ExpiresAt, &takenFrom)
	if errors.Is(err, pgx.ErrNoRows) {
		// A concurrent first insert of the key won; say who on the next try.
		s.metrics.contended.WithLabelValues(Namespace(key)).Inc()
		return Lease{}, &HeldError{Key: key, Holder: "(another caller, just now)"}
	}
	if err != nil {
		return Lease{}, fmt.Errorf("acquire %s: %w", key, err)
	}
	if !won {
		s.metrics.contended.WithLabelValues(Namespace(key)).Inc()
		return Lease{}, &HeldError{Key: key, Holder: l.Holder, Epoch: l.Epoch, ExpiresAt: l.ExpiresAt}
	}
	kind := KindAcquire
	if takenFrom != nil {
		kind = KindTakeover
		s.log.Info("lease taken over after expiry", "key", key, "holder", holder, "epoch", l.Epoch, "previous_holder", *takenFrom)
	}
	s.metrics.event(kind, key)
	l.Secret = secret
	return l, nil
}

// secretHash is what the database keeps of a holding's secret.
func secretHash(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// Refresh extends l by ttl while its holder and epoch still match and it has not expired;
// otherwise ErrLost, and the caller must stop the work it does under the lease. The lease
// it returns has the row's acquired_at, so a caller that knows only key, holder and epoch
// (the control API's) gets the whole holding back.
func (s *Store) Refresh(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	kept, _, err := s.RefreshAll(ctx, []Lease{l}, ttl)
	if err != nil {
		return l, err
	}
	if len(kept) == 0 {
		return l, fmt.Errorf("refresh %s as %s (epoch %d): %w", l.Key, l.Holder, l.Epoch, ErrLost)
	}
	return kept[0], nil
}

// RefreshAll does what Refresh does to each of ls, in one statement and one commit, for a
// holder that keeps many leases (a dispatcher's org: leases): one by one, each refresh is a
// commit of its own, and on a saturated machine a round of them outlasts the leases' TTL.
// kept are the refreshed leases and lost those Refresh would have answered ErrLost, each
// in ls's order; an error refreshed none. A key may appear once.
func (s *Store) RefreshAll(ctx context.Context, ls []Lease, ttl time.Duration) (kept, lost []Lease, err error) {
	if err := CheckTTL(ttl); err != nil {
		return nil, nil, err
	}
	keys := make([]string, len(ls))
	holders := make([]string, len(ls))
	epochs := make([]int64, len(ls))
	hashes := make([][]byte, len(ls))
	seen := make(map[string]bool, len(ls))
	for i, l := range ls {
		if err := errors.Join(CheckKey(l.Key), CheckHolder(l.Holder)); err != nil {
			return nil, nil, err
		}
		if seen[l.Key] {
			return nil, nil, invalid("key %q appears twice in one refresh", l.Key)
		}
		seen[l.Key] = true
		keys[i], holders[i], epochs[i], hashes[i] = l.Key, l.Holder, l.Epoch, secretHash(l.Secret)
	}
	if len(ls) == 0 {
		return nil, nil, nil
	}
	rows, err := s.keep.Query(ctx, `
WITH want AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[]) AS w(key, holder, epoch, secret_hash)
), up AS (
    UPDATE leases l SET expires_at = now() + $5 * interval '1 microsecond', updated_at = now()
      FROM want w
     WHERE l.key = w.key AND l.holder = w.holder AND l.epoch = w.epoch AND l.expires_at > now()
       AND (l.secret_hash IS NULL OR l.secret_hash = w.secret_hash)
    RETURNING l.key, l.holder, l.epoch, l.acquired_at, l.expires_at
), ev AS (
    INSERT INTO lease_events (key, kind, holder, epoch) SELECT key, 'refresh', holder, epoch FROM up
)
SELECT key, acquired_at, expires_at FROM up`, keys, holders, epochs, hashes, micros(ttl))
	if err != nil {
		return nil, nil, fmt.Errorf("refresh %d leases: %w", len(ls), err)
	}
	type times struct{ acquired, expires time.Time }
	got := make(map[string]times, len(ls))
	for rows.Next() {
		var key string
		var t times
		if err := rows.Scan(&key, &t.acquired, &t.expires); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("refresh %d leases: %w", len(ls), err)
		}
		got[key] = t
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("refresh %d leases: %w", len(ls), err)
	}
	for _, l := range ls {
		t, ok := got[l.Key]
		if !ok {
			s.metrics.refused.WithLabelValues("refresh", Namespace(l.Key)).Inc()
			lost = append(lost, l)
			continue
		}
		l.AcquiredAt, l.ExpiresAt = t.acquired, t.expires
		s.metrics.event(KindRefresh, l.Key)
		kept = append(kept, l)
	}
	return kept, lost, nil
}

// Release frees l while its holder and epoch match, and wakes waiters. Releasing twice, or
// after the lease expired and nobody took it, is not an error; releasing a lease that
// someone else has taken since is ErrLost, and one this holder never had ErrNotHolder.
func (s *Store) Release(ctx context.Context, l Lease) error {
	if err := errors.Join(CheckKey(l.Key), CheckHolder(l.Holder)); err != nil {
		return err
	}
	tag, err := s.keep.Exec(ctx, `
WITH up AS (
    UPDATE leases SET holder = NULL, expires_at = NULL, acquired_at = NULL, updated_at = now()
     WHERE key = $1 AND holder = $2 AND epoch = $3 AND (secret_hash IS NULL OR secret_hash = $5)
    RETURNING key, epoch, waiting_until > now() AS waited
), ev AS (
    INSERT INTO lease_events (key, kind, holder, epoch) SELECT key, 'release', $2, epoch FROM up
)
SELECT CASE WHEN waited THEN pg_notify($4, key) END FROM up`, l.Key, l.Holder, l.Epoch, s.channel, secretHash(l.Secret))
	if err != nil {
		return fmt.Errorf("release %s: %w", l.Key, err)
	}
	if tag.RowsAffected() == 1 {
		s.metrics.event(KindRelease, l.Key)
		return nil
	}
	info, err := s.holder(ctx, s.keep, l.Key)
	if err != nil {
		return fmt.Errorf("release %s: %w", l.Key, err)
	}
	switch {
	case info.Epoch == l.Epoch && info.Holder == "":
		return nil // already released, or expired and swept: the key is free of this holding
	case info.Epoch > l.Epoch:
		s.metrics.refused.WithLabelValues("release", Namespace(l.Key)).Inc()
		return fmt.Errorf("release %s as %s (epoch %d, now %d): %w", l.Key, l.Holder, l.Epoch, info.Epoch, ErrLost)
	default:
		s.metrics.refused.WithLabelValues("release", Namespace(l.Key)).Inc()
		return fmt.Errorf("release %s as %s (epoch %d): %w", l.Key, l.Holder, l.Epoch, ErrNotHolder)
	}
}

// ForceRelease frees key whoever holds it and moves the epoch on, so the old holder's
// refreshes and fenced writes are refused. actor and reason are recorded.
func (s *Store) ForceRelease(ctx context.Context, key, actor, reason string) (Lease, error) {
	if err := errors.Join(CheckKey(key), CheckHolder(actor)); err != nil {
		return Lease{}, err
	}
	if len(reason) > 1000 {
		return Lease{}, invalid("reason is longer than 1000 bytes")
	}
	var old Lease
	err := s.pool.QueryRow(ctx, `
WITH old AS (
    SELECT key, holder, epoch, acquired_at, expires_at FROM leases WHERE key = $1 AND holder IS NOT NULL FOR UPDATE
), up AS (
    UPDATE leases l SET holder = NULL, expires_at = NULL, acquired_at = NULL, epoch = l.epoch + 1, updated_at = now()
      FROM old WHERE l.key = old.key
    RETURNING l.key
), ev AS (
    INSERT INTO lease_events (key, kind, holder, epoch, actor, reason)
    SELECT key, 'force_release', holder, epoch, $2, NULLIF($3, '') FROM old
), n AS (
    SELECT pg_notify($4, key) FROM up
)
SELECT key, holder, epoch, acquired_at, expires_at FROM old, (SELECT count(*) FROM n) AS notified`,
		key, actor, reason, s.channel).Scan(&old.Key, &old.Holder, &old.Epoch, &old.AcquiredAt, &old.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, herr := s.Holder(ctx, key); herr != nil {
			return Lease{}, fmt.Errorf("force release %s: %w", key, herr)
		}
		return Lease{}, fmt.Errorf("force release %s: %w", key, ErrNotHeld)
	}
	if err != nil {
		return Lease{}, fmt.Errorf("force release %s: %w", key, err)
	}
	s.metrics.event(KindForceRelease, key)
	s.log.Warn("lease released by force", "key", key, "holder", old.Holder, "epoch", old.Epoch, "actor", actor, "reason", reason)
	return old, nil
}

// Holder says who holds key, since when and until when. A key no one ever took is
// ErrUnknownKey.
func (s *Store) Holder(ctx context.Context, key string) (Info, error) {
	if err := CheckKey(key); err != nil {
		return Info{}, err
	}
	return s.holder(ctx, s.pool, key)
}

func (s *Store) holder(ctx context.Context, pool *pgxpool.Pool, key string) (Info, error) {
	rows, err := pool.Query(ctx, selectInfo+` WHERE key = $1`, key)
	if err != nil {
		return Info{}, fmt.Errorf("read lease %s: %w", key, err)
	}
	infos, err := collectInfo(rows)
	if err != nil {
		return Info{}, fmt.Errorf("read lease %s: %w", key, err)
	}
	if len(infos) == 0 {
		return Info{}, fmt.Errorf("%s: %w", key, ErrUnknownKey)
	}
	return infos[0], nil
}

const selectInfo = `SELECT key, coalesce(holder, ''), epoch, coalesce(acquired_at, 'epoch'::timestamptz), coalesce(expires_at, 'epoch'::timestamptz), updated_at FROM leases`

func collectInfo(rows pgx.Rows) ([]Info, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Info, error) {
		var i Info
		err := r.Scan(&i.Key, &i.Holder, &i.Epoch, &i.AcquiredAt, &i.ExpiresAt, &i.UpdatedAt)
		if i.Holder == "" {
			i.AcquiredAt, i.ExpiresAt = time.Time{}, time.Time{}
		}
		return i, err
	})
}

// List is every lease whose key starts with prefix, ordered by key.
func (s *Store) List(ctx context.Context, prefix string) ([]Info, error) {
	if len(prefix) > 210 {
		return nil, invalid("prefix is longer than a key")
	}
	rows, err := s.pool.Query(ctx, selectInfo+` WHERE starts_with(key, $1) ORDER BY key`, prefix)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	infos, err := collectInfo(rows)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	return infos, nil
}

// Events is key's history, newest first, at most limit rows.
func (s *Store) Events(ctx context.Context, key string, limit int) ([]Event, error) {
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	if limit <= 0 || limit > 10000 {
		return nil, invalid("limit %d is not between 1 and 10000", limit)
	}
	rows, err := s.pool.Query(ctx, `
SELECT id, key, kind, holder, epoch, coalesce(previous_holder, ''), coalesce(actor, ''), coalesce(reason, ''), at
  FROM lease_events WHERE key = $1 ORDER BY id DESC LIMIT $2`, key, limit)
	if err != nil {
		return nil, fmt.Errorf("lease events of %s: %w", key, err)
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.ID, &e.Key, &e.Kind, &e.Holder, &e.Epoch, &e.PreviousHolder, &e.Actor, &e.Reason, &e.At)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("lease events of %s: %w", key, err)
	}
	return evs, nil
}

// Sweep turns leases that expired without anyone noticing into expiry events, frees them
// and wakes their waiters. It returns how many it swept.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	rows, err := s.pool.Query(ctx, `
WITH old AS (
    SELECT key, holder, epoch FROM leases WHERE holder IS NOT NULL AND expires_at <= now() FOR UPDATE SKIP LOCKED
), up AS (
    UPDATE leases l SET holder = NULL, expires_at = NULL, acquired_at = NULL, updated_at = now()
      FROM old WHERE l.key = old.key AND l.epoch = old.epoch
    RETURNING l.key
), ev AS (
    INSERT INTO lease_events (key, kind, holder, epoch) SELECT key, 'expire', holder, epoch FROM old
)
SELECT key, pg_notify($1, key) FROM up`, s.channel)
	if err != nil {
		return 0, fmt.Errorf("sweep expired leases: %w", err)
	}
	var keys []string
	for rows.Next() {
		var key string
		var discard any
		if err := rows.Scan(&key, &discard); err != nil {
			rows.Close()
			return 0, fmt.Errorf("sweep expired leases: %w", err)
		}
		keys = append(keys, key)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("sweep expired leases: %w", err)
	}
	for _, k := range keys {
		s.metrics.event(KindExpire, k)
		s.log.Info("lease expired unnoticed", "key", k)
	}
	return len(keys), nil
}

// RunSweeper sweeps every interval until ctx ends.
func (s *Store) RunSweeper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("lease sweep failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
