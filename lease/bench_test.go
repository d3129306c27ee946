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
	if _, err := pool.Exec(context.Background(), `CREATE TABLE baseline (key text PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
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
// The baseline is a single-row UPDATE ... WHERE key = $1 on the same database: a pair is
// two statements, so half the baseline's rate is the ceiling.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, c := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("baseline-update/clients=%d", c), func(b *testing.B) {
			pool := benchPool(b)
			ctx := context.Background()
			for g := range c {
				if _, err := pool.Exec(ctx, `INSERT INTO baseline VALUES ($1, 0)`, fmt.Sprintf("k%d", g)); err != nil {
					b.Fatal(err)
				}
			}
			clients(b, c, func(g, _ int) error {
				_, err := pool.Exec(ctx, `UPDATE baseline SET n = n + 1 WHERE key = $1`, fmt.Sprintf("k%d", g))
				return err
			})
		})
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
		})
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
