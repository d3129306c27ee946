package dispatch_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"hermeshost/dispatch"
	"hermeshost/dispatch/runtime"
	"hermeshost/lease"
	"hermeshost/sartiq"
	"hermeshost/scriptedagent"
)

func (f *fixture) leases(t *testing.T) *lease.Store {
	s := lease.New(f.db, lease.Options{})
	t.Cleanup(s.Close)
	return s
}

// A chat turn (or any agent) holding home:acme keeps acme's jobs queued; the moment it is
// released, the next cycle claims.
func TestAHeldHomeLeaseHoldsTheOrgsJobsBack(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	ctx := context.Background()
	chat, err := f.leases(t).TryAcquire(ctx, "home:acme", "dashboard/acme/chat", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	d := f.dispatcher(t)
	for range 3 {
		if _, err := d.Cycle(ctx); err != nil {
			t.Fatal(err)
		}
		d.Wait()
	}
	if st := f.jobsOf(t, "acme"); st[sartiq.StatusQueued] != 2 {
		t.Fatalf("acme's jobs while its home is held: %v", st)
	}
	if st := f.jobsOf(t, "globex"); st[sartiq.StatusCompleted] != 2 {
		t.Fatalf("globex's jobs: %v", st)
	}
	if err := f.leases(t).Release(ctx, chat); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := d.Cycle(ctx); err != nil {
			t.Fatal(err)
		}
		d.Wait()
	}
	if st := f.jobsOf(t, "acme"); st[sartiq.StatusCompleted] != 2 {
		t.Fatalf("acme's jobs after the home was released: %v", st)
	}
	// Each run held the home under its own epoch, and gave it back.
	var epochs int
	if err := f.db.QueryRow(ctx, `SELECT count(DISTINCT epoch) FROM lease_events WHERE key = 'home:acme' AND kind IN ('acquire', 'takeover')`).Scan(&epochs); err != nil || epochs != 3 {
		t.Fatalf("home:acme was taken under %d epochs (%v), want 3: the chat turn's and one per job", epochs, err)
	}
	if info, err := f.leases(t).Holder(ctx, "home:acme"); err != nil || info.Holder != "" {
		t.Fatalf("home:acme after the jobs: %+v %v", info, err)
	}
}

// A new owner of an org first asks the backend: while a previous owner's job of the org is
// still CLAIMED (and not stale), it claims nothing for the org; once that job goes stale it
// re-claims it before anything queued.
func TestANewOwnerWaitsForThePreviousOwnersJob(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	ctx := context.Background()
	// A replica that died holding org:acme, with one of acme's jobs claimed.
	if _, err := f.leases(t).TryAcquire(ctx, "org:acme", "dispatcher/dead/1-x", 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	orphan := f.backend.DemoJob(t, "acme", sartiq.TypeProductIngest)
	if _, err := f.cfg.Bot.Claim(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	d := f.dispatcher(t)
	if _, err := d.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	d.Wait()
	if owned := d.Owned(); len(owned) != 1 || owned[0] != "globex" {
		t.Fatalf("owned while org:acme is another's: %v", owned)
	}
	time.Sleep(400 * time.Millisecond) // the dead replica's lease expires
	for range 3 {
		if _, err := d.Cycle(ctx); err != nil {
			t.Fatal(err)
		}
		d.Wait()
	}
	if st := f.jobsOf(t, "acme"); st[sartiq.StatusQueued] != 1 || st[sartiq.StatusClaimed] != 1 {
		t.Fatalf("acme while the previous owner's job is fresh: %v (want one queued, one claimed, nothing new claimed)", st)
	}
	if !strings.Contains(strings.Join(d.Owned(), ","), "acme") {
		t.Fatalf("acme not owned after the dead replica's lease expired: %v", d.Owned())
	}
	f.backend.Clock.Advance(2 * time.Minute)
	if _, err := d.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	d.Wait()
	var first string
	if err := f.db.QueryRow(ctx, `SELECT job_id FROM claim_attempts WHERE org = 'acme' ORDER BY id LIMIT 1`).Scan(&first); err != nil || first != orphan {
		t.Fatalf("the new owner's first acme run was %q (%v), want the re-claim of %s", first, err, orphan)
	}
	for range 2 {
		if _, err := d.Cycle(ctx); err != nil {
			t.Fatal(err)
		}
		d.Wait()
	}
	if st := f.jobsOf(t, "acme"); st[sartiq.StatusCompleted] != 2 {
		t.Fatalf("acme's jobs: %v", st)
	}
}

// A delivery whose home lease is taken away (forced, as an operator would) stops its agent
// at once instead of running on beside whoever holds the home now.
func TestLosingTheHomeLeaseStopsTheAgent(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	knobs, _ := json.Marshal(scriptedagent.Knobs{StallAtWrite: 1})
	if err := os.WriteFile(filepath.Join(f.cfg.OrgsRoot, "acme", scriptedagent.KnobsFile), knobs, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d := f.dispatcher(t)
	if _, err := d.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "acme's agent to start", func() bool {
		var n int
		_ = f.db.QueryRow(ctx, `SELECT count(*) FROM mirror_job_events e JOIN mirror_jobs m USING (job_id) WHERE m.org = 'acme' AND e.kind = 'agent_start'`).Scan(&n)
		return n == 1
	})
	if _, err := f.leases(t).ForceRelease(ctx, "home:acme", "operator", "test: take the home away"); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { d.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the delivery ran on after its home lease was forced away")
	}
	var outcome, reason string
	if err := f.db.QueryRow(ctx, `SELECT outcome, coalesce(reason, '') FROM claim_attempts WHERE org = 'acme'`).Scan(&outcome, &reason); err != nil {
		t.Fatal(err)
	}
	if outcome == "completed" || !strings.Contains(reason, "lease") {
		t.Fatalf("acme's run after losing its home: %s (%s)", outcome, reason)
	}
}

// A host that cannot start an org's worker releases the claimed job (the host's trouble is
// not the job's attempt) and leaves the org alone for a while instead of claiming and
// releasing in a loop.
func TestAWorkerThatCannotStartReleasesTheJobAndBacksOff(t *testing.T) {
	f := newFixture(t, true)
	d := f.releasesUnrun(t, runtime.Config{
		Instance: "dispatch-test-broken", WorkerIdle: []string{"no-such-worker-program"}, BinDir: binDir,
	}, "the host could not start the worker: %")
	ctx := context.Background()
	var reclaims int
	if err := f.backend.DB.QueryRow(ctx, `SELECT count(*) FROM agent_job_events WHERE kind = 'reclaim'`).Scan(&reclaims); err != nil || reclaims != 0 {
		t.Fatalf("%d re-claims (%v)", reclaims, err)
	}
	if n, err := d.Cycle(ctx); err != nil || n != 0 {
		t.Fatalf("the next cycle started %d jobs (%v); the orgs should be backing off", n, err)
	}
	if !strings.Contains(f.logs.String(), "the org backs off") {
		t.Fatalf("no back-off logged:\n%s", f.logs.String())
	}
}

// A run-job that never started in a running worker (the engine failed the exec) is the
// host's trouble too: the job is released, not counted as a crashed attempt.
func TestARunJobThatNeverStartedReleasesTheJob(t *testing.T) {
	f := newFixture(t, true)
	// The worker's main process runs (the host's binary under another name, in BinDir, which
	// a sandbox mounts), but run-job ("hermes-host") is not in BinDir and cannot start.
	bin := t.TempDir()
	host, err := os.ReadFile(filepath.Join(binDir, "hermes-host"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "worker-only"), host, 0o755); err != nil {
		t.Fatal(err)
	}
	f.releasesUnrun(t, runtime.Config{
		Instance: "dispatch-test-unstarted", WorkerIdle: []string{"worker-only", "worker", "idle"},
		BinDir: bin, Services: f.services(t),
	}, "%program not started%")
}

// releasesUnrun runs a cycle of a claiming dispatcher on a process runtime of rc (given the
// fixture's roots) and checks that both jobs it claimed were released with a reason like
// reason, no attempt ending otherwise, and all four jobs are queued again. It returns the
// dispatcher.
func (f *fixture) releasesUnrun(t *testing.T, rc runtime.Config, reason string) *dispatch.Dispatcher {
	t.Helper()
	f.cfg.ClaimEnabled = true
	rc.OrgsRoot, rc.WorkspacesRoot = f.cfg.OrgsRoot, filepath.Join(t.TempDir(), "workspaces")
	rc.Output, rc.Logger = io.Discard, slog.New(slog.DiscardHandler)
	rt, err := runtime.NewProcess(rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	f.cfg.Runtime = rt
	d := f.dispatcher(t)
	ctx := context.Background()
	if n, err := d.Cycle(ctx); err != nil || n != 2 {
		t.Fatalf("first cycle: %d started, %v", n, err)
	}
	d.Wait()
	if st := f.statuses(t); st[sartiq.StatusQueued] != 4 {
		t.Fatalf("jobs after their runs failed to start: %v, want all four queued again", st)
	}
	var released, other int
	if err := f.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE outcome = 'released' AND reason LIKE $1),
		count(*) FILTER (WHERE outcome IS DISTINCT FROM 'released') FROM claim_attempts`, reason).Scan(&released, &other); err != nil {
		t.Fatal(err)
	}
	if released != 2 || other != 0 {
		var ended []string
		rows, err := f.db.Query(ctx, `SELECT coalesce(outcome, '') || ': ' || coalesce(reason, '') FROM claim_attempts`)
		if err == nil {
			ended, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		t.Fatalf("claim_attempts: %d released with a reason like %q, %d otherwise (%v): %q", released, reason, other, err, ended)
	}
	return d
}

// Run keeps the side work going beside the cycles: workers idle past their timeout are
// reaped, and a lease its holder left to expire is swept into an expiry event; at the end
// the org leases are given back.
func TestRunReapsIdleWorkersAndSweepsExpiredLeases(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	rt, err := runtime.NewProcess(runtime.Config{
		Instance: "dispatch-test-reap", OrgsRoot: f.cfg.OrgsRoot, WorkspacesRoot: filepath.Join(t.TempDir(), "workspaces"),
		WorkerIdle: []string{"hermes-host", "worker", "idle"}, BinDir: binDir, Output: io.Discard,
		Logger: slog.New(slog.DiscardHandler), IdleTimeout: 300 * time.Millisecond, Services: f.services(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	f.cfg.Runtime = rt
	ctx := context.Background()
	if _, err := f.leases(t).TryAcquire(ctx, "session:left-behind", "a dashboard that died", 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	d := f.dispatcher(t)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(runCtx, dispatch.RunOptions{Poll: 100 * time.Millisecond, Reap: 100 * time.Millisecond, Sweep: 100 * time.Millisecond})
	}()
	waitFor(t, time.Minute, "the demo jobs to complete", func() bool { return f.statuses(t)[sartiq.StatusCompleted] == 4 })
	waitFor(t, 30*time.Second, "the idle workers to be reaped", func() bool {
		units, err := rt.List(ctx)
		return err == nil && len(units) == 0
	})
	waitFor(t, 30*time.Second, "the expired lease to be swept", func() bool {
		var n int
		_ = f.db.QueryRow(ctx, `SELECT count(*) FROM lease_events WHERE key = 'session:left-behind' AND kind = 'expire'`).Scan(&n)
		return n == 1
	})
	stop()
	<-done
	var held int
	if err := f.db.QueryRow(ctx, `SELECT count(*) FROM leases WHERE key LIKE 'org:%' AND holder IS NOT NULL`).Scan(&held); err != nil || held != 0 {
		t.Fatalf("%d org leases held after Run returned (%v)", held, err)
	}
}
