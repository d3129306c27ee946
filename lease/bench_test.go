package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"hermeshost/internal/latency"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"hermeshost/pg"
	"hermeshost/pg/pgtest"
)

// baselineTables are the bare lease: a row per key that a transition updates in place
// (heap-only, as leases' is) and an event row per transition, with no check, trigger,
// secret or wake-up beyond that.
const baselineTables = `
CREATE TABLE baseline (
    key        text PRIMARY KEY,
    holder     text,
    epoch      bigint NOT NULL,
    expires_at timestamptz
) WITH (fillfactor = 50);
CREATE TABLE baseline_events (
    id     bigserial,
    key    text NOT NULL,
    kind   text NOT NULL,
    holder text NOT NULL,
    epoch  bigint NOT NULL,
    at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key, id)
)`

// baselineNotify adds to the bare lease what the lease store's events trigger does
// (migration 00006): a NOTIFY per event row. A transaction that notifies takes a
// database-wide lock at commit that it holds until its commit is flushed, so such commits
// are made one at a time.
const baselineNotify = `
CREATE FUNCTION baseline_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('hermes_bench_baseline', NEW.key);
    RETURN NULL;
END
$$;
CREATE TRIGGER baseline_events_notify AFTER INSERT ON baseline_events FOR EACH ROW EXECUTE FUNCTION baseline_event_notify()`

// benchPool is a pool on a fresh schema big enough for 32 clients.
func benchPool(b *testing.B) *pgxpool.Pool {
	b.Helper()
	url, _ := pgtest.Schema(b)
	cfg, _, err := pg.Config(url, "")
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// clients runs b.N operations spread over c goroutines and reports operations per second.
func clients(b *testing.B, c int, op func(client, i int) error) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, c)
	b.ResetTimer()
	start := time.Now()
	for g := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := op(g, int(i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
}

// BenchmarkAcquireRelease: one pair is TryAcquire then Release, each client on its own key.
// The baseline is the same two transitions written as bare statements, each committed on
// its own: take a free key (moving its epoch on) and write its acquire event, then free it
// if still held at that epoch and write its release event, one statement each. That is the
// floor of a fenced lease with a committed audit; what the store adds is its secret, its
// takeover of expired holdings and insert of new keys in the same statement, the wake-up
// of waiters, the events' notification to the org's watchers, and its checks. A second
// baseline adds that notification alone (baselineNotify). After each run every pair must
// have left its two events and moved its key's epoch on by one.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, c := range []int{1, 8, 32} {
		for _, variant := range []struct{ name, ddl string }{
			{"baseline-statements", baselineTables},
			{"baseline-statements-notify", baselineTables + ";" + baselineNotify},
		} {
			b.Run(fmt.Sprintf("%s/clients=%d", variant.name, c), func(b *testing.B) {
				benchBaseline(b, c, variant.ddl)
			})
		}
		b.Run(fmt.Sprintf("lease/clients=%d", c), func(b *testing.B) {
			pool := benchPool(b)
			s := New(pool, Options{})
			defer s.Close()
			ctx := context.Background()
			clients(b, c, func(g, _ int) error {
				l, err := s.TryAcquire(ctx, fmt.Sprintf("session:bench-%d", g), fmt.Sprintf("client-%d", g), time.Minute)
				if err != nil {
					return err
				}
				return s.Release(ctx, l)
			})
			checkPairs(b, pool, "leases", "lease_events", b.N)
		})
	}
}

// benchBaseline runs the bare pairs on tables made by ddl, c clients each on its own key.
func benchBaseline(b *testing.B, c int, ddl string) {
	pool := benchPool(b)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, ddl); err != nil {
		b.Fatal(err)
	}
	for g := range c {
		if _, err := pool.Exec(ctx, `INSERT INTO baseline (key, epoch) VALUES ($1, 0)`, fmt.Sprintf("session:bench-%d", g)); err != nil {
			b.Fatal(err)
		}
	}
	clients(b, c, func(g, _ int) error {
		key, holder := fmt.Sprintf("session:bench-%d", g), fmt.Sprintf("client-%d", g)
		var epoch int64
		err := pool.QueryRow(ctx, `
WITH up AS (
    UPDATE baseline SET holder = $2, epoch = epoch + 1, expires_at = now() + interval '1 minute'
     WHERE key = $1 AND holder IS NULL
    RETURNING key, holder, epoch
), ev AS (
    INSERT INTO baseline_events (key, kind, holder, epoch) SELECT key, 'acquire', holder, epoch FROM up
)
SELECT epoch FROM up`, key, holder).Scan(&epoch)
		if err != nil {
			return fmt.Errorf("acquire %s: %w", key, err)
		}
		tag, err := pool.Exec(ctx, `
WITH up AS (
    UPDATE baseline SET holder = NULL, expires_at = NULL
     WHERE key = $1 AND holder = $2 AND epoch = $3
    RETURNING key, epoch
)
INSERT INTO baseline_events (key, kind, holder, epoch) SELECT key, 'release', $2, epoch FROM up`, key, holder, epoch)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("released %d rows, want 1", tag.RowsAffected())
		}
		if err != nil {
			return fmt.Errorf("release %s: %w", key, err)
		}
		return nil
	})
	checkPairs(b, pool, "baseline", "baseline_events", b.N)
}

// checkPairs fails the benchmark unless pairs acquire+release pairs left every key free,
// one acquire and one release event each, and the keys' epochs moved on by pairs in all
// (the baseline's keys start at epoch 0; the store's first take inserts a key at 1).
func checkPairs(b *testing.B, pool *pgxpool.Pool, table, events string, pairs int) {
	b.Helper()
	var held, epochs, acquires, releases int64
	err := pool.QueryRow(context.Background(), fmt.Sprintf(`
		SELECT (SELECT count(*) FILTER (WHERE holder IS NOT NULL) FROM %[1]s),
		       (SELECT coalesce(sum(epoch), 0) FROM %[1]s),
		       (SELECT count(*) FILTER (WHERE kind = 'acquire') FROM %[2]s),
		       (SELECT count(*) FILTER (WHERE kind = 'release') FROM %[2]s)`, table, events)).Scan(&held, &epochs, &acquires, &releases)
	if err != nil {
		b.Fatal(err)
	}
	n := int64(pairs)
	if held != 0 || epochs != n || acquires != n || releases != n {
		b.Fatalf("%s after %d pairs: %d keys held, epochs moved on %d times, %d acquire and %d release events",
			table, pairs, held, epochs, acquires, releases)
	}
}

// BenchmarkHandoff measures Release to a waiting Acquire returning, beside a waiter that
// polls every 250 ms (as Hermes' SQLite lease does).
func BenchmarkHandoff(b *testing.B) {
	run := func(b *testing.B, wait func(ctx context.Context, s *Store, key string) error) {
		pool := benchPool(b)
		s := New(pool, Options{Poll: time.Second})
		defer s.Close()
		ctx := context.Background()
		lat := make([]time.Duration, 0, b.N)
		for i := range b.N {
			key := fmt.Sprintf("session:handoff-%d", i)
			held, err := s.TryAcquire(ctx, key, "holder", time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			before := testutil.ToFloat64(s.metrics.contended.WithLabelValues("session"))
			done := make(chan time.Time, 1)
			errc := make(chan error, 1)
			go func() {
				if err := wait(ctx, s, key); err != nil {
					errc <- err
					return
				}
				done <- time.Now()
			}()
			// The waiter has found the key held once: it is waiting now.
			for testutil.ToFloat64(s.metrics.contended.WithLabelValues("session")) == before {
				time.Sleep(100 * time.Microsecond)
			}
			released := time.Now()
			if err := s.Release(ctx, held); err != nil {
				b.Fatal(err)
			}
			select {
			case at := <-done:
				lat = append(lat, at.Sub(released))
			case err := <-errc:
				b.Fatal(err)
			}
		}
		b.StopTimer()
		latency.Report(b, lat)
	}
	b.Run("notify", func(b *testing.B) {
		run(b, func(ctx context.Context, s *Store, key string) error {
			_, err := s.Acquire(ctx, key, "waiter", time.Minute)
			return err
		})
	})
	b.Run("poll-250ms", func(b *testing.B) {
		run(b, func(ctx context.Context, s *Store, key string) error {
			for {
				_, err := s.TryAcquire(ctx, key, "waiter", time.Minute)
				if !errors.Is(err, ErrHeld) {
					return err
				}
				time.Sleep(250 * time.Millisecond)
			}
		})
	})
}

// BenchmarkRefreshRound: one round refreshes a dispatcher's 100 org: leases. The baseline
// is what a round did before RefreshAll: each lease's Refresh on its own, 8 at a time
// through a pool of 40 connections. After each run every lease must still be
// held at its epoch with one refresh event per round.
func BenchmarkRefreshRound(b *testing.B) {
	const orgs, parallel = 100, 8
	setup := func(b *testing.B) (*pgxpool.Pool, *Store, []Lease) {
		pool := benchPool(b)
		s := New(pool, Options{})
		b.Cleanup(s.Close)
		ls := make([]Lease, orgs)
		for i := range ls {
			l, err := s.TryAcquire(context.Background(), fmt.Sprintf("org:bench-%03d", i), "dispatch-bench", time.Hour)
			if err != nil {
				b.Fatal(err)
			}
			ls[i] = l
		}
		return pool, s, ls
	}
	check := func(b *testing.B, pool *pgxpool.Pool, rounds int) {
		b.Helper()
		var held, refreshes int
		if err := pool.QueryRow(context.Background(), `SELECT
			(SELECT count(*) FROM leases WHERE holder = 'dispatch-bench' AND epoch = 1 AND expires_at > now()),
			(SELECT count(*) FROM lease_events WHERE kind = 'refresh')`).Scan(&held, &refreshes); err != nil {
			b.Fatal(err)
		}
		if held != orgs || refreshes != orgs*rounds {
			b.Fatalf("after %d rounds: %d of %d leases held, %d refresh events (want %d)", rounds, held, orgs, refreshes, orgs*rounds)
		}
	}
	report := func(b *testing.B, elapsed time.Duration) {
		b.ReportMetric(float64(elapsed.Milliseconds())/float64(b.N), "ms/round")
	}
	b.Run("baseline-refresh-each-8-at-a-time", func(b *testing.B) {
		pool, s, ls := setup(b)
		ctx := context.Background()
		start := time.Now()
		for b.Loop() {
			slots := make(chan struct{}, parallel)
			var wg sync.WaitGroup
			var failed atomic.Pointer[error]
			for i := range ls {
				slots <- struct{}{}
				wg.Go(func() {
					defer func() { <-slots }()
					if _, err := s.Refresh(ctx, ls[i], time.Hour); err != nil {
						failed.Store(&err)
					}
				})
			}
			wg.Wait()
			if err := failed.Load(); err != nil {
				b.Fatal(*err)
			}
		}
		report(b, time.Since(start))
		check(b, pool, b.N)
	})
	b.Run("refresh-all", func(b *testing.B) {
		pool, s, ls := setup(b)
		ctx := context.Background()
		start := time.Now()
		for b.Loop() {
			kept, lost, err := s.RefreshAll(ctx, ls, time.Hour)
			if err != nil || len(kept) != orgs || len(lost) != 0 {
				b.Fatalf("refreshed %d, lost %d: %v", len(kept), len(lost), err)
			}
		}
		report(b, time.Since(start))
		check(b, pool, b.N)
	})
}
