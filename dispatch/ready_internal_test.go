package dispatch

import (
	"log/slog"
	"testing"
	"time"

	"hermeshost/pg/pgtest"
	"hermeshost/sartiq"
)

// A ready step that finds a cycle working its org is taken again when the cycle's step
// ends: the cycle polled before the org's run ended, so its step may not see that the org
// is free. Here the cycle's step hangs on the org lease's refresh (the leases table locked
// by the test), the ready step for the org comes and goes, and once the cycle's step ends
// the org is back in the ready queue.
func TestAReadyStepSkippedForACyclesIsTakenAgainWhenTheCyclesEnds(t *testing.T) {
	_, db := pgtest.Schema(t)
	bot, err := sartiq.New("http://127.0.0.1:1", "bot-token") // nothing listens: the claim fails
	if err != nil {
		t.Fatal(err)
	}
	d := New(Config{DB: db, Bot: bot, Instance: "ready-test", Log: slog.New(slog.DiscardHandler), LeaseTTL: time.Minute})
	t.Cleanup(d.Close)
	ctx := t.Context()
	l, err := d.leases.TryAcquire(ctx, "org:acme", d.holder, d.cfg.LeaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	d.owned["acme"] = &ownership{lease: l, lastWork: time.Now()}
	snap := &snapshot{orgs: []string{"acme"}, queued: map[string][]sartiq.Job{"acme": {{ID: "job-1", OrganizationID: "acme"}}},
		active: map[string][]sartiq.Job{}, others: map[string]bool{}}

	lock, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := lock.Exec(ctx, `LOCK TABLE leases IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	cycled := make(chan error, 1)
	go func() {
		_, err := d.work(ctx, "acme", snap, false)
		cycled <- err
	}()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		d.mu.Lock()
		working := d.working["acme"]
		d.mu.Unlock()
		if working {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cycle's step never began")
		}
	}
	if ok, err := d.work(ctx, "acme", snap, true); ok || err != nil {
		t.Fatalf("the ready step beside the cycle's = %v, %v; want it skipped", ok, err)
	}
	if org, queued := d.nextReady(); queued {
		t.Fatalf("%s is ready while the cycle's step is under way", org)
	}
	if err := lock.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-cycled; err == nil {
		t.Fatal("the cycle's claim succeeded with no backend")
	}
	if org, queued := d.nextReady(); !queued || org != "acme" {
		t.Fatalf("after the cycle's step the ready queue gives %q, %v; want acme again", org, queued)
	}
	if org, queued := d.nextReady(); queued {
		t.Fatalf("the ready queue gives %s twice", org)
	}
}
