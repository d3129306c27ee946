package dispatch

import (
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"hermeshost/lease"
	"hermeshost/pg/pgtest"
)

// Ownership holds while each commit is slow: 40 owned orgs, every statement updating
// leases held 50 ms by the database (a commit on a saturated machine; the Docker scale
// run's dispatchers each owned 100 orgs at a load average above 300), and a lease TTL of
// 1.5 s. One refresh after another a round takes 2 s and the last leases expire before
// their turn; in one statement it takes one commit's time.
func TestOwnershipHoldsWhenRefreshesAreSlow(t *testing.T) {
	_, db := pgtest.Schema(t)
	reg := prometheus.NewPedanticRegistry()
	d := New(Config{DB: db, Registerer: reg, Instance: "keep-test", Log: slog.New(slog.DiscardHandler), LeaseTTL: 1500 * time.Millisecond})
	t.Cleanup(d.Close)
	ctx := t.Context()
	const orgs = 40
	for i := range orgs {
		org := fmt.Sprintf("org-%02d", i)
		l, err := d.leases.TryAcquire(ctx, "org:"+org, d.holder, d.cfg.LeaseTTL)
		if err != nil {
			t.Fatal(err)
		}
		d.owned[org] = &ownership{lease: l, lastWork: time.Now()}
	}
	if _, err := db.Exec(ctx, `
		CREATE FUNCTION slow_lease_update() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(0.05); RETURN NULL; END $$;
		CREATE TRIGGER slow_lease_update BEFORE UPDATE ON leases FOR EACH STATEMENT EXECUTE FUNCTION slow_lease_update()`); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		d.keepRound(ctx)
	}
	if owned := d.Owned(); len(owned) != orgs {
		t.Fatalf("%d of %d orgs still owned after three rounds of slow refreshes", len(owned), orgs)
	}
	if n := testutil.CollectAndCount(d.metrics.keepRound); n != 1 {
		t.Fatalf("the round histogram has %d series", n)
	}
	var rounds uint64
	if mfs, err := reg.Gather(); err == nil {
		for _, mf := range mfs {
			if mf.GetName() == "hermes_dispatch_org_lease_refresh_round_seconds" {
				rounds = mf.GetMetric()[0].GetHistogram().GetSampleCount()
			}
		}
	}
	if rounds != 3 {
		t.Fatalf("%d rounds observed, want 3", rounds)
	}
}

// A round disowns exactly the orgs whose lease it lost: one taken over by another holder
// is dropped; one given up and taken again at a new epoch while the round ran (its
// snapshot still has the old holding) stays owned, at its new holding.
func TestARoundDisownsOnlyTheHoldingsItLost(t *testing.T) {
	_, db := pgtest.Schema(t)
	d := New(Config{DB: db, Registerer: prometheus.NewPedanticRegistry(), Instance: "keep-test", Log: slog.New(slog.DiscardHandler), LeaseTTL: time.Minute})
	t.Cleanup(d.Close)
	ctx := t.Context()
	own := func(org string) lease.Lease {
		l, err := d.leases.TryAcquire(ctx, "org:"+org, d.holder, d.cfg.LeaseTTL)
		if err != nil {
			t.Fatal(err)
		}
		d.owned[org] = &ownership{lease: l, lastWork: time.Now()}
		return l
	}
	own("kept")
	taken := own("taken")
	again := own("again")
	if _, err := d.leases.ForceRelease(ctx, taken.Key, "test", "taken over"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.leases.TryAcquire(ctx, taken.Key, "someone-else", time.Minute); err != nil {
		t.Fatal(err)
	}
	// The round refreshes the snapshot's old holding of "again", which was released and
	// taken again meanwhile.
	if err := d.leases.Release(ctx, again); err != nil {
		t.Fatal(err)
	}
	retaken := own("again")
	_, lost, err := d.leases.RefreshAll(ctx, []lease.Lease{taken, again}, time.Minute)
	if err != nil || len(lost) != 2 {
		t.Fatalf("lost %v, %v; want both old holdings", lost, err)
	}
	for _, l := range lost {
		d.disown(l, "the org lease was lost")
	}
	d.keepRound(ctx)
	owned := d.Owned()
	slices.Sort(owned)
	if !slices.Equal(owned, []string{"again", "kept"}) {
		t.Fatalf("owned %v, want again and kept", owned)
	}
	if got := d.owned["again"].lease.Epoch; got != retaken.Epoch {
		t.Errorf("again owned at epoch %d, want %d", got, retaken.Epoch)
	}
}
