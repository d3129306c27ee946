package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/pg"
	"hermeshost/pg/pgtest"
)

// A holder's leases are kept on its KeepPool while every connection of its main pool is
// taken (a dispatcher's steps and mirror writes): refreshed past their TTL, and released.
// A Store without one, on the same exhausted pool, loses its lease at its deadline, and its
// work is stopped then, not whenever the waiting refresh returns.
func TestLeasesAreKeptOnTheKeepPoolWhileTheMainPoolIsExhausted(t *testing.T) {
	ctx := context.Background()
	url, db := pgtest.Schema(t)
	main, _, err := pg.OpenWith(ctx, url, "", pg.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer main.Close()
	keepPool, _, err := pg.OpenWith(ctx, url, "", pg.Options{MaxConns: 1, Name: pg.LeasePool})
	if err != nil {
		t.Fatal(err)
	}
	defer keepPool.Close()
	reg := prometheus.NewRegistry()
	own := New(main, Options{Registerer: reg, KeepPool: keepPool})
	defer own.Close()
	other := New(main, Options{Registerer: reg}) // shares own's metrics
	defer other.Close()

	const ttl = 2 * time.Second
	kept, err := own.TryAcquire(ctx, "home:kept", "dispatcher-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	queued, err := other.TryAcquire(ctx, "home:queued", "dispatcher-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	k := own.Keep(ctx, kept, ttl)
	q := other.Keep(ctx, queued, ttl)
	// Their listeners are connections of their own (pg.Listen), outside both pools.
	held, err := main.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	heldAt := time.Now()

	select {
	case <-q.Context().Done():
		if !errors.Is(context.Cause(q.Context()), ErrLost) {
			t.Fatalf("the main pool's Keep stopped with %v, want ErrLost", context.Cause(q.Context()))
		}
		// Its last refresh landed before the hold; the deadline is a TTL after it.
		if d := time.Since(heldAt); d > ttl+ttl/2 {
			t.Errorf("the main pool's Keep stopped %s after the pool was exhausted, want at most %s", d, ttl+ttl/2)
		}
	case <-time.After(5 * ttl):
		t.Fatal("a Keep whose refresh waits for an exhausted pool never stopped its work")
	}
	time.Sleep(2 * ttl) // the kept lease outlives its TTL again, the pool still exhausted
	if err := k.Context().Err(); err != nil {
		t.Fatalf("the KeepPool's lease was lost while the main pool was exhausted: %v", context.Cause(k.Context()))
	}
	var holder string
	var epoch int64
	var live bool
	if err := db.QueryRow(ctx, `SELECT holder, epoch, expires_at > now() FROM leases WHERE key = $1`, kept.Key).Scan(&holder, &epoch, &live); err != nil {
		t.Fatal(err)
	}
	if holder != kept.Holder || epoch != kept.Epoch || !live {
		t.Fatalf("home:kept in the table: holder %q epoch %d live %v, want %q %d true", holder, epoch, live, kept.Holder, kept.Epoch)
	}
	var refreshes int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM lease_events WHERE key = $1 AND kind = 'refresh' AND at > $2`, kept.Key, heldAt).Scan(&refreshes); err != nil {
		t.Fatal(err)
	}
	if refreshes < 3 {
		t.Errorf("%d refreshes of home:kept during the hold, want one every ttl/3 (3 or more)", refreshes)
	}

	// Stopped and released on the KeepPool too, the main pool still exhausted.
	rctx, cancel := context.WithTimeout(ctx, ttl)
	defer cancel()
	if err := own.Release(rctx, k.Stop()); err != nil {
		t.Fatalf("release while the main pool is exhausted: %v", err)
	}
	if err := db.QueryRow(ctx, `SELECT coalesce(holder, '') FROM leases WHERE key = $1`, kept.Key).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	if holder != "" {
		t.Fatalf("home:kept still held by %q after its release", holder)
	}
	q.Stop()
}
