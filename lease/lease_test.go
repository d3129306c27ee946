package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"hermeshost/pg/pgtest"
)

func TestMain(m *testing.M) {
	if childMode() {
		runContentionChild()
		return
	}
	pgtest.Main(m)
}

type fixture struct {
	store *Store
	pool  *pgxpool.Pool
	url   string
	reg   *prometheus.Registry
}

func newFixture(t *testing.T, opts Options) fixture {
	t.Helper()
	url, pool := pgtest.Schema(t)
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	s := New(pool, opts)
	t.Cleanup(s.Close)
	return fixture{store: s, pool: pool, url: url, reg: reg}
}

func (f fixture) events(t *testing.T, key string) []string {
	t.Helper()
	evs, err := f.store.Events(context.Background(), key, 100)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for i := len(evs) - 1; i >= 0; i-- {
		kinds = append(kinds, evs[i].Kind)
	}
	return kinds
}

func (f fixture) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// awaitExpiry waits, by asking the database, until l has expired.
func (f fixture) awaitExpiry(t *testing.T, l Lease) {
	t.Helper()
	for range 500 {
		var expired bool
		if err := f.pool.QueryRow(context.Background(), `SELECT expires_at <= now() FROM leases WHERE key = $1`, l.Key).Scan(&expired); err != nil {
			t.Fatal(err)
		}
		if expired {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("lease %s never expired", l.Key)
}

func TestAcquireReleaseAndEpochGrows(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	a, err := f.store.TryAcquire(ctx, "session:s1", "alice", time.Minute)
	if err != nil || a.Epoch != 1 || a.Holder != "alice" || !a.ExpiresAt.After(a.AcquiredAt) {
		t.Fatalf("first acquire: %+v %v", a, err)
	}
	_, err = f.store.TryAcquire(ctx, "session:s1", "bob", time.Minute)
	var held *HeldError
	if !errors.As(err, &held) || !errors.Is(err, ErrHeld) || held.Holder != "alice" || held.Epoch != 1 {
		t.Fatalf("contended acquire: %v", err)
	}
	info, err := f.store.Holder(ctx, "session:s1")
	if err != nil || info.Holder != "alice" || info.Epoch != 1 || !info.Held(time.Now()) {
		t.Fatalf("holder: %+v %v", info, err)
	}
	if err := f.store.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	if info, _ := f.store.Holder(ctx, "session:s1"); info.Holder != "" || info.Epoch != 1 {
		t.Fatalf("after release the row stays with its epoch: %+v", info)
	}
	b, err := f.store.TryAcquire(ctx, "session:s1", "bob", time.Minute)
	if err != nil || b.Epoch != 2 {
		t.Fatalf("second acquire: %+v %v", b, err)
	}
	if got := strings.Join(f.events(t, "session:s1"), ","); got != "acquire,release,acquire" {
		t.Fatalf("events: %s", got)
	}
	if got := testutil.ToFloat64(f.store.metrics.events.WithLabelValues("acquire", "session")); got != 2 {
		t.Fatalf("acquire metric: %v", got)
	}
	if _, err := f.store.Holder(ctx, "home:never"); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("unknown key: %v", err)
	}
}

func TestRefreshReturnsTheWholeHolding(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	a, err := f.store.TryAcquire(ctx, "home:acme", "worker-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// Only what a remote caller knows: key, holder, epoch and the holding's secret.
	r, err := f.store.Refresh(ctx, Lease{Key: a.Key, Holder: a.Holder, Epoch: a.Epoch, Secret: a.Secret}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !r.AcquiredAt.Equal(a.AcquiredAt) || !r.ExpiresAt.After(a.ExpiresAt) || r.Epoch != a.Epoch {
		t.Fatalf("refreshed %+v from %+v", r, a)
	}
}

// RefreshAll refreshes, in one statement, exactly the holdings Refresh would: a holding
// still current is extended and audited; one whose secret is wrong, one that expired and
// was taken over, and one named with another holder are lost, untouched, and counted.
func TestRefreshAllRefreshesExactlyTheCurrentHoldings(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	acquire := func(key, holder string, ttl time.Duration) Lease {
		t.Helper()
		l, err := f.store.TryAcquire(ctx, key, holder, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a := acquire("org:acme", "dispatch-a", time.Minute)
	b := acquire("org:globex", "dispatch-a", time.Minute)
	c := acquire("org:initech", "dispatch-a", 30*time.Millisecond)
	d := acquire("org:umbrella", "dispatch-a", time.Minute)
	e := acquire("org:hooli", "dispatch-a", time.Minute)
	f.awaitExpiry(t, c)
	c2 := acquire("org:initech", "dispatch-b", time.Minute)
	wrongSecret := b
	wrongSecret.Secret = a.Secret
	otherHolder := d
	otherHolder.Holder = "dispatch-b"

	kept, lost, err := f.store.RefreshAll(ctx, []Lease{a, wrongSecret, c, otherHolder, e}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 2 || kept[0].Key != a.Key || kept[1].Key != e.Key {
		t.Fatalf("kept %+v, want acme and hooli", kept)
	}
	for i, was := range []Lease{a, e} {
		k := kept[i]
		if k.Epoch != was.Epoch || k.Secret != was.Secret || !k.AcquiredAt.Equal(was.AcquiredAt) ||
			k.ExpiresAt.Sub(was.ExpiresAt) < 50*time.Minute {
			t.Errorf("refreshed %+v from %+v", k, was)
		}
		info, err := f.store.Holder(ctx, was.Key)
		if err != nil || !info.ExpiresAt.Equal(k.ExpiresAt) {
			t.Errorf("%s in the table: %+v %v, the refresh said %v", was.Key, info, err, k.ExpiresAt)
		}
		if got := f.events(t, was.Key); strings.Join(got, ",") != "acquire,refresh" {
			t.Errorf("%s events %v", was.Key, got)
		}
	}
	if len(lost) != 3 || lost[0].Key != b.Key || lost[1].Key != c.Key || lost[2].Key != d.Key {
		t.Fatalf("lost %+v, want globex, initech and umbrella", lost)
	}
	for _, was := range []Lease{b, c2, d} {
		info, err := f.store.Holder(ctx, was.Key)
		if err != nil || info.Holder != was.Holder || info.Epoch != was.Epoch || !info.ExpiresAt.Equal(was.ExpiresAt) {
			t.Errorf("%s was touched: %+v %v, want %+v", was.Key, info, err, was)
		}
	}
	if got := f.events(t, b.Key); strings.Join(got, ",") != "acquire" {
		t.Errorf("globex events %v", got)
	}
	if n := testutil.ToFloat64(f.store.metrics.refused.WithLabelValues("refresh", "org")); n != 3 {
		t.Errorf("%v refused refreshes counted, want 3", n)
	}
	if n := testutil.ToFloat64(f.store.metrics.events.WithLabelValues(KindRefresh, "org")); n != 2 {
		t.Errorf("%v refresh events counted, want 2", n)
	}

	// What one holding cannot be, a batch cannot be either.
	if _, _, err := f.store.RefreshAll(ctx, []Lease{a, a}, time.Hour); !errors.Is(err, ErrInvalid) {
		t.Errorf("a key twice: %v", err)
	}
	if _, _, err := f.store.RefreshAll(ctx, []Lease{a, {Key: "nope", Holder: "x"}}, time.Hour); !errors.Is(err, ErrInvalid) {
		t.Errorf("a bad key: %v", err)
	}
	if _, _, err := f.store.RefreshAll(ctx, []Lease{a}, 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("no ttl: %v", err)
	}
	if kept, lost, err := f.store.RefreshAll(ctx, nil, time.Hour); err != nil || kept != nil || lost != nil {
		t.Errorf("nothing to refresh: %v %v %v", kept, lost, err)
	}
}

func TestExpiredLeaseIsTakenOver(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	a, err := f.store.TryAcquire(ctx, "home:acme", "worker-a", 30*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	f.awaitExpiry(t, a)
	b, err := f.store.TryAcquire(ctx, "home:acme", "worker-b", time.Minute)
	if err != nil || b.Epoch != a.Epoch+1 {
		t.Fatalf("takeover: %+v %v", b, err)
	}
	evs, _ := f.store.Events(ctx, "home:acme", 1)
	if evs[0].Kind != KindTakeover || evs[0].Holder != "worker-b" || evs[0].PreviousHolder != "worker-a" {
		t.Fatalf("takeover event: %+v", evs[0])
	}
}

// fencedAudit writes one row under l; it is what "a table write made under a lease" is.
func fencedAudit(ctx context.Context, s *Store, l Lease, note string) error {
	return s.WithFence(ctx, l, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO audit (key, holder, epoch, note) VALUES ($1, $2, $3, $4)`, l.Key, l.Holder, l.Epoch, note)
		return err
	})
}

func createAudit(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `CREATE TABLE audit (
		id bigserial PRIMARY KEY, key text NOT NULL, holder text NOT NULL, epoch bigint NOT NULL,
		note text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
}

// assertStaleRefused checks that everything the old holder tries is refused and the new
// holder (if any) is undisturbed.
func assertStaleRefused(t *testing.T, f fixture, stale Lease, current *Lease) {
	t.Helper()
	ctx := context.Background()
	if _, err := f.store.Refresh(ctx, stale, time.Minute); !errors.Is(err, ErrLost) {
		t.Errorf("stale refresh: want ErrLost, got %v", err)
	}
	if err := fencedAudit(ctx, f.store, stale, "stale write"); !errors.Is(err, ErrLost) {
		t.Errorf("stale fenced write: want ErrLost, got %v", err)
	}
	var n int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM audit WHERE note = 'stale write'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("a stale fenced write reached the table: %d %v", n, err)
	}
	if err := f.store.Release(ctx, stale); !errors.Is(err, ErrLost) {
		t.Errorf("stale release: want ErrLost, got %v", err)
	}
	info, err := f.store.Holder(ctx, stale.Key)
	if err != nil {
		t.Fatal(err)
	}
	if current == nil {
		return
	}
	if info.Holder != current.Holder || info.Epoch != current.Epoch {
		t.Errorf("the new holder was disturbed: %+v", info)
	}
	if _, err := f.store.Refresh(ctx, *current, time.Minute); err != nil {
		t.Errorf("the new holder's refresh: %v", err)
	}
	if err := fencedAudit(ctx, f.store, *current, "current write"); err != nil {
		t.Errorf("the new holder's fenced write: %v", err)
	}
}

func TestPausedHolderIsRefusedAfterTakeover(t *testing.T) {
	f := newFixture(t, Options{})
	createAudit(t, f.pool)
	ctx := context.Background()
	old, err := f.store.TryAcquire(ctx, "session:chat-1", "turn-a", 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := fencedAudit(ctx, f.store, old, "before pause"); err != nil {
		t.Fatal(err)
	}
	f.awaitExpiry(t, old) // the holder is "paused" past its TTL
	cur, err := f.store.TryAcquire(ctx, "session:chat-1", "turn-b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	assertStaleRefused(t, f, old, &cur)
}

func TestForcedReleaseRefusesTheOldHolder(t *testing.T) {
	f := newFixture(t, Options{})
	createAudit(t, f.pool)
	ctx := context.Background()
	old, err := f.store.TryAcquire(ctx, "org:acme", "dispatcher-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	forced, err := f.store.ForceRelease(ctx, "org:acme", "ops@console", "wedged after a crash")
	if err != nil || forced.Holder != "dispatcher-1" || forced.Epoch != old.Epoch {
		t.Fatalf("force: %+v %v", forced, err)
	}
	info, _ := f.store.Holder(ctx, "org:acme")
	if info.Holder != "" || info.Epoch != old.Epoch+1 {
		t.Fatalf("after force the key is free and the epoch moved on: %+v", info)
	}
	evs, _ := f.store.Events(ctx, "org:acme", 1)
	if evs[0].Kind != KindForceRelease || evs[0].Actor != "ops@console" || evs[0].Reason != "wedged after a crash" || evs[0].Holder != "dispatcher-1" {
		t.Fatalf("force event: %+v", evs[0])
	}
	assertStaleRefused(t, f, old, nil)
	// Even the same holder name acquiring again gets a new epoch; the old one stays refused.
	again, err := f.store.TryAcquire(ctx, "org:acme", "dispatcher-1", time.Minute)
	if err != nil || again.Epoch != old.Epoch+2 {
		t.Fatalf("re-acquire: %+v %v", again, err)
	}
	assertStaleRefused(t, f, old, &again)
	if _, err := f.store.ForceRelease(ctx, "org:nobody", "ops", ""); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("force of an unknown key: %v", err)
	}
	if err := f.store.Release(ctx, again); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.ForceRelease(ctx, "org:acme", "ops", ""); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("force of a free key: %v", err)
	}
}

func TestReleaseIsIdempotentAndRefusesStrangers(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	a, err := f.store.TryAcquire(ctx, "home:globex", "worker-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stranger := a
	stranger.Holder = "mallory"
	if err := f.store.Release(ctx, stranger); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("stranger release: %v", err)
	}
	if info, _ := f.store.Holder(ctx, a.Key); info.Holder != "worker-a" {
		t.Fatalf("a stranger's release changed the holder: %+v", info)
	}
	for i := range 2 {
		if err := f.store.Release(ctx, a); err != nil {
			t.Fatalf("release #%d: %v", i+1, err)
		}
	}
	if got := strings.Join(f.events(t, a.Key), ","); got != "acquire,release" {
		t.Fatalf("a second release wrote an event: %s", got)
	}
}

func TestWaiterIsWokenByNotifyBeforeThePoll(t *testing.T) {
	const poll = 20 * time.Second
	f := newFixture(t, Options{Poll: poll})
	ctx := context.Background()
	a, err := f.store.TryAcquire(ctx, "session:handoff", "first", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := f.store.Acquire(ctx, "session:handoff", "second", time.Minute)
		if err != nil {
			errc <- err
			return
		}
		got <- l
	}()
	awaitContended(t, f, "session", 1)
	released := time.Now()
	if err := f.store.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-got:
		if l.Holder != "second" || l.Epoch != a.Epoch+1 {
			t.Fatalf("waiter got %+v", l)
		}
		if waited := time.Since(released); waited > poll/4 {
			t.Fatalf("the waiter took %s: it polled instead of being notified", waited)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(poll / 2):
		t.Fatal("the waiter was not woken by the release")
	}
}

// awaitContended waits until n acquire attempts on the namespace have found it held,
// i.e. the waiter is waiting.
func awaitContended(t *testing.T, f fixture, ns string, n float64) {
	t.Helper()
	for range 2000 {
		if testutil.ToFloat64(f.store.metrics.contended.WithLabelValues(ns)) >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("the waiter never tried")
}

func TestAcquireHonoursContext(t *testing.T) {
	f := newFixture(t, Options{Poll: 10 * time.Millisecond})
	ctx := context.Background()
	if _, err := f.store.TryAcquire(ctx, "home:busy", "holder", time.Hour); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err := f.store.Acquire(cctx, "home:busy", "waiter", time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want deadline exceeded, got %v", err)
	}
}

func TestKeepHoldsPastTTLAndCancelsWhenLost(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	// A refresh is due every ttl/3 and the work is cancelled once none has landed within a
	// ttl, so a refresh may take up to 2/3 of it. 600 ms left 400 ms, which a CI run with
	// every package's tests at once exceeded; 2 s leaves 1.3 s.
	const ttl = 2 * time.Second
	l, err := f.store.TryAcquire(ctx, "home:kept", "worker", ttl)
	if err != nil {
		t.Fatal(err)
	}
	k := f.store.Keep(ctx, l, ttl)
	time.Sleep(3 * ttl) // work that outlives the TTL several times
	if k.Context().Err() != nil {
		t.Fatalf("work cancelled while the lease was kept: %v", context.Cause(k.Context()))
	}
	info, _ := f.store.Holder(ctx, l.Key)
	if info.Holder != "worker" || info.Epoch != l.Epoch || !info.ExpiresAt.After(l.ExpiresAt) {
		t.Fatalf("lease not kept: %+v", info)
	}
	forcedAt := time.Now()
	if _, err := f.store.ForceRelease(ctx, l.Key, "ops", "test"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.Context().Done():
		if !errors.Is(context.Cause(k.Context()), ErrLost) {
			t.Fatalf("cause: %v", context.Cause(k.Context()))
		}
		if d := time.Since(forcedAt); d > ttl {
			t.Fatalf("work stopped %s after the forced release, later than a TTL", d)
		}
	case <-time.After(5 * ttl):
		t.Fatal("work was not cancelled after the lease was lost")
	}
	k.Stop()
}

func TestKeepCancelsWhenRefreshIsRefused(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	l, err := f.store.TryAcquire(ctx, "home:taken", "worker", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// Someone moves the epoch on behind the listener's back (no notification).
	if _, err := f.pool.Exec(ctx, `UPDATE leases SET epoch = epoch + 1 WHERE key = $1`, l.Key); err != nil {
		t.Fatal(err)
	}
	k := f.store.Keep(ctx, l, 300*time.Millisecond)
	select {
	case <-k.Context().Done():
		if !errors.Is(context.Cause(k.Context()), ErrLost) {
			t.Fatalf("cause: %v", context.Cause(k.Context()))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("refused refresh did not cancel the work")
	}
	k.Stop()
}

func TestKeepStopFromManyGoroutinesReturnsTheLeaseAndKeepsItHeld(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	l, err := f.store.TryAcquire(ctx, "home:stopped-twice", "worker", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	k := f.store.Keep(ctx, l, time.Minute)
	var wg sync.WaitGroup
	got := make([]Lease, 64)
	start := make(chan struct{})
	for i := range got {
		wg.Go(func() {
			<-start
			got[i] = k.Stop()
		})
	}
	close(start)
	wg.Wait()
	for i, g := range got {
		if g.Key != l.Key || g.Epoch != l.Epoch {
			t.Fatalf("Stop %d returned %+v, want the kept lease %+v", i, g, l)
		}
	}
	// Stopping does not release: the lease is still held by its holder.
	if info, _ := f.store.Holder(ctx, l.Key); info.Holder != "worker" || info.Epoch != l.Epoch {
		t.Fatalf("after Stop: %+v", info)
	}
}

func TestSweepRecordsUnnoticedExpiry(t *testing.T) {
	f := newFixture(t, Options{Poll: 20 * time.Second})
	ctx := context.Background()
	l, err := f.store.TryAcquire(ctx, "home:swept", "crashed-worker", 30*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	f.awaitExpiry(t, l)
	n, err := f.store.Sweep(ctx)
	if err != nil || n != 1 {
		t.Fatalf("sweep: %d %v", n, err)
	}
	evs, _ := f.store.Events(ctx, l.Key, 1)
	if evs[0].Kind != KindExpire || evs[0].Holder != "crashed-worker" || evs[0].Epoch != l.Epoch {
		t.Fatalf("expire event: %+v", evs[0])
	}
	if n, _ := f.store.Sweep(ctx); n != 0 {
		t.Fatalf("second sweep found %d", n)
	}
	if info, _ := f.store.Holder(ctx, l.Key); info.Holder != "" {
		t.Fatalf("swept lease still held: %+v", info)
	}
	if _, err := f.store.Refresh(ctx, l, time.Minute); !errors.Is(err, ErrLost) {
		t.Fatalf("refresh after sweep: %v", err)
	}
}

func TestBadInputWritesNothing(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	huge := strings.Repeat("h", MaxHolderLen+1)
	cases := []struct {
		name, key, holder string
		ttl               time.Duration
		want              string
	}{
		{"empty key", "", "h", time.Second, "empty key"},
		{"unknown namespace", "table:x", "h", time.Second, "not in a known namespace"},
		{"no namespace", "acme", "h", time.Second, "not in a known namespace"},
		{"bad id", "home:../etc", "h", time.Second, "the id must be"},
		{"sql in id", "home:a';drop table leases;--", "h", time.Second, "the id must be"},
		{"empty id", "home:", "h", time.Second, "the id must be"},
		{"zero ttl", "home:a", "h", 0, "not positive"},
		{"negative ttl", "home:a", "h", -time.Second, "not positive"},
		{"huge ttl", "home:a", "h", 48 * time.Hour, "longer than"},
		{"empty holder", "home:a", "", time.Second, "empty holder"},
		{"huge holder", "home:a", huge, time.Second, "more than 200"},
		{"control char holder", "home:a", "a\x00b", time.Second, "non-printable"},
	}
	for _, c := range cases {
		_, err := f.store.TryAcquire(ctx, c.key, c.holder, c.ttl)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want an invalid-input error mentioning %q, got %v", c.name, c.want, err)
		}
		_, err = f.store.Acquire(ctx, c.key, c.holder, c.ttl)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Acquire: %v", c.name, err)
		}
	}
	if _, err := f.store.ForceRelease(ctx, "home:a", "", ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("force without actor: %v", err)
	}
	if n := f.count(t, "leases") + f.count(t, "lease_events"); n != 0 {
		t.Fatalf("bad input wrote %d rows", n)
	}
}

func TestConcurrentTryAcquireHasOneWinner(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	winners := 0
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := f.store.TryAcquire(ctx, "org:race", fmt.Sprintf("g%d", i), time.Minute)
			if err == nil {
				mu.Lock()
				winners++
				mu.Unlock()
			} else if !errors.Is(err, ErrHeld) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if winners != 1 {
		t.Fatalf("%d winners", winners)
	}
}

// Only the holder ends or extends a holding: one who read its key, holder and epoch but
// lacks its secret (or brings another holding's) is refused, and the holding is intact.
func TestRefreshAndReleaseNeedTheHoldingsSecret(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	a, err := f.store.TryAcquire(ctx, "home:acme", "worker-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Secret) < 20 {
		t.Fatalf("the holding's secret %q", a.Secret)
	}
	before, err := f.store.Holder(ctx, "home:acme")
	if err != nil {
		t.Fatal(err)
	}
	other, err := f.store.TryAcquire(ctx, "home:globex", "worker-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"", "guessed", other.Secret} {
		read := Lease{Key: a.Key, Holder: a.Holder, Epoch: a.Epoch, Secret: secret}
		if _, err := f.store.Refresh(ctx, read, time.Hour); !errors.Is(err, ErrLost) {
			t.Errorf("refresh with secret %q: %v", secret, err)
		}
		if err := f.store.Release(ctx, read); !errors.Is(err, ErrNotHolder) {
			t.Errorf("release with secret %q: %v", secret, err)
		}
	}
	after, err := f.store.Holder(ctx, "home:acme")
	if err != nil || after.Holder != "worker-a" || after.Epoch != a.Epoch || !after.ExpiresAt.Equal(before.ExpiresAt) {
		t.Fatalf("the holding after the refused calls: %+v (was %+v), %v", after, before, err)
	}
	if _, err := f.store.Refresh(ctx, a, time.Hour); err != nil {
		t.Fatalf("the holder's own refresh: %v", err)
	}
	if err := f.store.Release(ctx, a); err != nil {
		t.Fatalf("the holder's own release: %v", err)
	}
	// A new holding of the key has a new secret: the old one opens nothing.
	b, err := f.store.TryAcquire(ctx, "home:acme", "worker-a", time.Minute)
	if err != nil || b.Secret == a.Secret {
		t.Fatalf("the next holding %+v, %v", b, err)
	}
	if _, err := f.store.Refresh(ctx, Lease{Key: b.Key, Holder: b.Holder, Epoch: b.Epoch, Secret: a.Secret}, time.Hour); !errors.Is(err, ErrLost) {
		t.Fatalf("the last holding's secret on the next: %v", err)
	}
}
