package dispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"hermeshost/control"
	"hermeshost/dispatch"
	"hermeshost/internal/hosttest"
	"hermeshost/pg/pgtest"
	"hermeshost/sartiq"
	"hermeshost/sartiq/backend"
	"hermeshost/sartiq/backend/backendtest"
	"hermeshost/scriptedagent"
)

func TestCrashedAttemptsCountReclaimsAndCrashesNotReleases(t *testing.T) {
	// ev is a log: each "kind@attempt" an event written under that attempt.
	ev := func(kinds ...string) []sartiq.Event {
		var out []sartiq.Event
		for _, k := range kinds {
			kind, at, _ := strings.Cut(k, "@")
			n, err := strconv.Atoi(at)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, sartiq.Event{Kind: kind, Attempt: n})
		}
		return out
	}
	for _, c := range []struct {
		events  []sartiq.Event
		attempt int
		want    int
	}{
		{ev("claim@1", "start@1"), 1, 1},
		{ev("claim@1", "start@1", "release@1", "claim@2", "start@2"), 2, 1},
		{ev("claim@1", "reclaim@2", "start@2", "release@2", "claim@3", "reclaim@4"), 4, 3},
		// Ended at once by the dispatcher: a crash event, then a release.
		{ev("claim@1", "start@1", "crash@1", "release@1", "claim@2", "start@2"), 2, 2},
		// The crash was written, the release was not: the attempt went stale and was
		// re-claimed, and is counted once.
		{ev("claim@1", "start@1", "crash@1", "reclaim@2"), 2, 2},
		// The crash event of the attempt being ended now is in the log already.
		{ev("claim@1", "crash@1", "release@1", "claim@2", "crash@2"), 2, 2},
		// A clean release between crashes counts nothing.
		{ev("claim@1", "crash@1", "release@1", "claim@2", "release@2", "claim@3"), 3, 2},
	} {
		if got := dispatch.CrashedAttempts(c.events, c.attempt); got != c.want {
			t.Errorf("CrashedAttempts(%v, %d) = %d, want %d", c.events, c.attempt, got, c.want)
		}
	}
}

// A dispatcher stopped by SIGTERM while a job runs past JOB_GRACE has the worker release
// it: the job is queued again, not counted as an attempt, and its leases are free; the next
// dispatcher completes it even with MAX_ATTEMPTS=1.
func TestSIGTERMDuringAJobReleasesItUncounted(t *testing.T) {
	b := backendtest.Start(t, backend.Config{StaleAfter: 3 * time.Second})
	b.Clock.Follow()
	dbURL, db := pgtest.Schema(t)
	env := replicaEnv{dbURL: dbURL, apiURL: b.URL, gatewayURL: hosttest.DemoGateway(t, "gw-secret", "host-key"),
		orgsRoot: filepath.Join(t.TempDir(), "orgs"), extra: []string{"JOB_GRACE=300ms", "MAX_ATTEMPTS=1"}}
	home := filepath.Join(env.orgsRoot, "acme")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	knobs, _ := json.Marshal(scriptedagent.Knobs{StallAtWrite: 2})
	if err := os.WriteFile(filepath.Join(home, scriptedagent.KnobsFile), knobs, 0o600); err != nil {
		t.Fatal(err)
	}
	var job string // acme's job that stalls first
	jobStatus := func() string {
		var s string
		if err := b.DB.QueryRow(context.Background(), `SELECT status FROM agent_jobs WHERE id = $1`, job).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	ctx := context.Background()
	first := startReplica(t, env, "first")
	// Running, with one category persisted: the agent is stalled at its second write.
	waitFor(t, time.Minute, "an acme job to be running with a write accepted", func() bool {
		err := db.QueryRow(ctx, `SELECT m.job_id FROM mirror_jobs m WHERE m.org = 'acme' AND m.status = 'RUNNING'
			AND EXISTS (SELECT 1 FROM mirror_job_events e WHERE e.job_id = m.job_id AND e.kind = 'progress')`).Scan(&job)
		return err == nil && jobStatus() == sartiq.StatusRunning
	})
	// Its worker's heartbeats reach the backend, with the progress it reports.
	waitFor(t, 30*time.Second, "a heartbeat with progress at the backend", func() bool {
		var n int
		_ = b.DB.QueryRow(ctx, `SELECT count(*) FROM agent_job_events WHERE job_id = $1 AND kind = 'progress'
			AND data->>'accepted_writes' IS NOT NULL`, job).Scan(&n)
		return n > 0
	})
	first.stop(t, 30*time.Second)

	if s := jobStatus(); s != sartiq.StatusQueued {
		t.Fatalf("after SIGTERM the job is %s, want QUEUED (released)", s)
	}
	var releases, reclaims, fails int
	if err := b.DB.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'release'), count(*) FILTER (WHERE kind = 'reclaim'), count(*) FILTER (WHERE kind = 'fail')
		FROM agent_job_events WHERE job_id = $1`, job).Scan(&releases, &reclaims, &fails); err != nil {
		t.Fatal(err)
	}
	if releases != 1 || reclaims != 0 || fails != 0 {
		t.Fatalf("backend log: %d releases, %d re-claims, %d fails; want one release only", releases, reclaims, fails)
	}
	var outcome, reason string
	if err := db.QueryRow(ctx, `SELECT outcome, coalesce(reason, '') FROM claim_attempts WHERE job_id = $1 AND attempt = 1`, job).Scan(&outcome, &reason); err != nil {
		t.Fatal(err)
	}
	if outcome != "released" {
		t.Fatalf("claim_attempts says attempt 1 %s (%s), want released", outcome, reason)
	}
	var held int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM leases WHERE holder IS NOT NULL`).Scan(&held); err != nil || held != 0 {
		t.Fatalf("%d leases still held after a clean stop (%v)", held, err)
	}

	// The release did not count: with MAX_ATTEMPTS=1 the job still runs, to completion.
	if err := os.Remove(filepath.Join(home, scriptedagent.KnobsFile)); err != nil {
		t.Fatal(err)
	}
	second := startReplica(t, env, "second")
	waitFor(t, time.Minute, "the released job to complete", func() bool { return jobStatus() == sartiq.StatusCompleted })
	second.stop(t, 30*time.Second)
	if err := db.QueryRow(ctx, `SELECT outcome FROM claim_attempts WHERE job_id = $1 AND attempt = 2`, job).Scan(&outcome); err != nil || outcome != "completed" {
		t.Fatalf("attempt 2: %q %v", outcome, err)
	}
	raw, _ := os.ReadFile(first.log)
	if !strings.Contains(string(raw), "grace period over") {
		t.Errorf("the first dispatcher's log does not say it asked the worker to release:\n%s", raw)
	}
}

// The dispatcher's control API, as an org's processes use it: its own org's job mirror and
// home and session leases, nothing of another org's; /healthz and /metrics beside it.
func TestTheDispatchersControlAPIKeepsOrgsApart(t *testing.T) {
	b := backendtest.Start(t, backend.Config{})
	dbURL, _ := pgtest.Schema(t)
	env := replicaEnv{dbURL: dbURL, apiURL: b.URL, gatewayURL: hosttest.DemoGateway(t, "gw-secret", "host-key"),
		orgsRoot: filepath.Join(t.TempDir(), "orgs"), extra: []string{"CONTROL_SECRET=control-secret-for-the-test"}}
	r := startReplica(t, env, "control")
	base := r.url(t)
	waitFor(t, time.Minute, "the demo jobs to complete", func() bool { return countJobs(t, b.DB, sartiq.StatusCompleted) == 4 })
	ctx := context.Background()
	client := func(org string) *control.Client {
		key, err := control.Key("control-secret-for-the-test", org)
		if err != nil {
			t.Fatal(err)
		}
		c, err := control.NewClient(base, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	acme, globex := client("acme"), client("globex")
	// The worker reports to the backend before the dispatcher records the outcome in its
	// mirror, so the mirror may trail the backend by a moment: wait for it to catch up.
	var page control.JobsPage
	waitFor(t, 30*time.Second, "acme's mirror to show its 2 jobs completed", func() bool {
		p, err := acme.Jobs(ctx, 50, "")
		if err != nil {
			t.Fatal(err)
		}
		page = p
		done := 0
		for _, j := range p.Jobs {
			if j.Status == sartiq.StatusCompleted {
				done++
			}
		}
		return done == 2
	})
	if len(page.Jobs) != 2 {
		t.Fatalf("acme sees %d jobs, want its own 2: %+v", len(page.Jobs), page.Jobs)
	}
	theirs := b.DemoJob(t, "globex", sartiq.TypeProductIngest)
	if _, err := acme.Job(ctx, theirs); !control.IsNotFound(err) {
		t.Fatalf("acme reading globex's job: %v", err)
	}
	if _, err := globex.Job(ctx, theirs); err != nil {
		t.Fatalf("globex reading its own job: %v", err)
	}
	if _, err := acme.Acquire(ctx, "home:globex", "acme-chat", time.Second, 0); !control.IsForbidden(err) {
		t.Fatalf("acme taking globex's home lease: %v", err)
	}
	l, err := acme.Acquire(ctx, "home:acme", "acme-chat", 5*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := acme.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/healthz", "/metrics"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || (path == "/metrics" && !strings.Contains(string(body), "hermes_dispatch_claims_total")) {
			t.Fatalf("%s: %d\n%.300s", path, resp.StatusCode, body)
		}
	}
	resp, err := http.Get(base + "/v1/jobs")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the control API without a key: %d", resp.StatusCode)
	}
	r.stop(t, 30*time.Second)
}

// A job whose runs keep crashing is run again at once after its first crash, then spaced
// out: a passing trouble does not use up MAX_ATTEMPTS in seconds.
func TestCrashedAttemptsAreSpacedOutAfterTheFirst(t *testing.T) {
	f := newFixture(t, true)
	f.backend.Clock.Follow()
	f.cfg.ClaimEnabled, f.cfg.MaxAttempts, f.cfg.CrashBackoff = true, 3, 2*time.Second
	writeKnobs(t, f, "acme", &scriptedagent.Knobs{CrashAtWrite: 1})
	d := f.dispatcher(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx, dispatch.RunOptions{Poll: 100 * time.Millisecond})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	var job string
	if err := f.backend.DB.QueryRow(ctx, `SELECT id::text FROM agent_jobs WHERE organization_id = 'acme' ORDER BY created_at, id LIMIT 1`).Scan(&job); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "acme's first job to fail at MAX_ATTEMPTS", func() bool { return jobStatus(t, f, job) == sartiq.StatusFailed })
	at := map[string]time.Time{}
	events, err := f.cfg.Bot.ListEvents(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		if e.Kind == sartiq.EventClaim || e.Kind == sartiq.EventCrash {
			at[fmt.Sprintf("%s@%d", e.Kind, e.Attempt)] = e.At
		}
	}
	if len(at) != 6 {
		t.Fatalf("the job's claims and crashes: %v, want three of each", at)
	}
	// Attempt 2 at once (well under the backoff), attempt 3 only after it.
	if gap := at["claim@2"].Sub(at["crash@1"]); gap >= f.cfg.CrashBackoff {
		t.Errorf("attempt 2 was claimed %s after the first crash, want at once", gap)
	}
	if gap := at["claim@3"].Sub(at["crash@2"]); gap < f.cfg.CrashBackoff {
		t.Errorf("attempt 3 was claimed %s after the second crash, want at least CrashBackoff (%s)", gap, f.cfg.CrashBackoff)
	}
}

func TestCrashBackoffGrowsThreefoldToItsCap(t *testing.T) {
	for crashed, want := range map[int]time.Duration{1: 0, 2: 10 * time.Second, 3: 30 * time.Second, 4: 90 * time.Second, 5: 270 * time.Second, 6: 5 * time.Minute, 40: 5 * time.Minute} {
		if got := dispatch.CrashBackoff(crashed, 10*time.Second); got != want {
			t.Errorf("crashBackoff(%d) = %s, want %s", crashed, got, want)
		}
	}
}
