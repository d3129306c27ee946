package lease

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// keepAll acquires and keeps n leases named prefix-0.. for holder.
func keepAll(t *testing.T, f fixture, prefix string, n int, ttl time.Duration) []*Kept {
	t.Helper()
	ctx := context.Background()
	ks := make([]*Kept, n)
	for i := range ks {
		l, err := f.store.TryAcquire(ctx, fmt.Sprintf("home:%s-%d", prefix, i), "worker", ttl)
		if err != nil {
			t.Fatal(err)
		}
		ks[i] = f.store.Keep(ctx, l, ttl)
	}
	return ks
}

// refreshGroups counts the refresh events of the keys with prefix by the commit that wrote
// them (an event's at is its transaction's now()).
func refreshGroups(t *testing.T, f fixture, prefix string) []int {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `
SELECT count(*) FROM lease_events WHERE kind = 'refresh' AND key LIKE 'home:' || $1 || '-%'
 GROUP BY at ORDER BY at`, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var groups []int
	for rows.Next() {
		var n int
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		groups = append(groups, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return groups
}

func TestKeepRefreshesEveryKeptLeaseInOneCommitARound(t *testing.T) {
	f := newFixture(t, Options{})
	const n, ttl = 20, 1500 * time.Millisecond
	ks := keepAll(t, f, "batch", n, ttl)
	if got := testutil.ToFloat64(f.store.metrics.kept); got != n {
		t.Fatalf("hermes_lease_kept = %v, want %d", got, n)
	}
	deadline := time.Now().Add(20 * ttl)
	for len(refreshGroups(t, f, "batch")) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the kept leases were not refreshed twice")
		}
		time.Sleep(ttl / 6)
	}
	for i, k := range ks {
		if err := k.Context().Err(); err != nil {
			t.Fatalf("lease %d: work cancelled while kept: %v", i, context.Cause(k.Context()))
		}
	}
	for _, k := range ks {
		k.Stop()
	}
	groups := refreshGroups(t, f, "batch")
	for i, g := range groups {
		if g != n {
			t.Fatalf("round %d refreshed %d of the %d kept leases in its commit (commits: %v): each round must refresh every lease in one", i, g, n, groups)
		}
	}
	if got := testutil.ToFloat64(f.store.metrics.kept); got != 0 {
		t.Fatalf("hermes_lease_kept = %v after every Stop, want 0", got)
	}
	if testutil.CollectAndCount(f.store.metrics.keepRound) != 1 {
		t.Fatal("hermes_lease_keep_round_seconds not collected")
	}
}

func TestKeepCancelsOnlyTheWorkWhoseLeaseWasLost(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	const ttl = 1500 * time.Millisecond
	ks := keepAll(t, f, "some", 3, ttl)
	defer func() {
		for _, k := range ks {
			k.Stop()
		}
	}()
	// The middle lease is taken from under its keeper without a notification.
	if _, err := f.pool.Exec(ctx, `UPDATE leases SET epoch = epoch + 1 WHERE key = 'home:some-1'`); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ks[1].Context().Done():
		if !errors.Is(context.Cause(ks[1].Context()), ErrLost) {
			t.Fatalf("cause: %v", context.Cause(ks[1].Context()))
		}
	case <-time.After(10 * ttl):
		t.Fatal("the lost lease's work was not cancelled")
	}
	// Its neighbours are refreshed on, past their TTL.
	before := ks[0].Lease().ExpiresAt
	time.Sleep(ttl)
	for _, i := range []int{0, 2} {
		if err := ks[i].Context().Err(); err != nil {
			t.Fatalf("lease %d cancelled with the lost one: %v", i, context.Cause(ks[i].Context()))
		}
	}
	if !ks[0].Lease().ExpiresAt.After(before) {
		t.Fatal("the kept lease beside the lost one was not refreshed after it")
	}
}

func TestKeepRefusesABadLeaseAloneAndKeepsTheSameLeaseTwice(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	const ttl = 1500 * time.Millisecond
	l, err := f.store.TryAcquire(ctx, "home:twice", "worker", ttl)
	if err != nil {
		t.Fatal(err)
	}
	a, b := f.store.Keep(ctx, l, ttl), f.store.Keep(ctx, l, ttl)
	bad := f.store.Keep(ctx, Lease{Key: "no namespace", Holder: "worker", Epoch: 1, ExpiresAt: time.Now().Add(ttl)}, ttl)
	select {
	case <-bad.Context().Done():
		if errors.Is(context.Cause(bad.Context()), ErrLost) || context.Cause(bad.Context()) == nil {
			t.Fatalf("a malformed lease was cancelled with %v, want the reason it is malformed", context.Cause(bad.Context()))
		}
	default:
		t.Fatal("a malformed lease was taken for keeping")
	}
	bad.Stop()
	time.Sleep(2 * ttl)
	for name, k := range map[string]*Kept{"first": a, "second": b} {
		if err := k.Context().Err(); err != nil {
			t.Fatalf("%s keeping of the same lease cancelled: %v", name, context.Cause(k.Context()))
		}
		if got := k.Stop(); !got.ExpiresAt.After(l.ExpiresAt) {
			t.Fatalf("%s keeping of the same lease never refreshed it: %+v", name, got)
		}
	}
}
