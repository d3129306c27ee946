package dispatch_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"

	"hermeshost/dispatch"
	"hermeshost/dispatch/runtime"
	"hermeshost/internal/hosttest"
	"hermeshost/sartiq"
	"hermeshost/sartiq/backend"
	"hermeshost/scriptedagent"
)

// The end-to-end tests run the demo jobs through a real dispatcher, backend, gateway and
// worker, on the Docker runtime (a worker image built FROM scratch from binDir's static
// binaries) or on the process runtime, and kill workers mid-job.

// dockerRuntime is a fixture's Docker runtime: its own scope and instance on the local
// engine, so that it never touches another runtime's containers, and its own image.
type dockerRuntime struct {
	*runtime.Docker
	engine *client.Client
	scope  string
	image  string
}

func randomName(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// useDocker swaps the fixture's runtime for Docker. Without an engine the test skips,
// except under CI, which must run it. Every container of the test's scope and its image
// are removed when it ends.
func useDocker(t *testing.T, f *fixture) *dockerRuntime {
	t.Helper()
	return useDockerWith(t, f, dockerOptions{})
}

// dockerOptions vary a fixture's Docker runtime.
type dockerOptions struct {
	// limits bound the units; default those of a product's dispatcher, but 512 MiB.
	limits *runtime.Limits
	// shell adds Debian's busybox-static to the image as /bin/sh, for hostile agents
	// written as shell scripts; the test skips without it, except under CI.
	shell bool
	// users gives each org a uid of its own (nil: all run as runtime.DefaultUser).
	users runtime.Users
}

func useDockerWith(t *testing.T, f *fixture, opts dockerOptions) *dockerRuntime {
	t.Helper()
	engine, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err == nil {
		ping, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = engine.Ping(ping)
		cancel()
		if err != nil {
			err = fmt.Errorf("no Docker engine reachable at %s: %w", engine.DaemonHost(), err)
			engine.Close()
		}
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, so the Docker tests must run: %v", err)
		}
		t.Skipf("Docker tests skipped (%v); start dockerd to include them", err)
	}
	t.Cleanup(func() { engine.Close() })
	ctx := context.Background()
	reserveDemoOrgNames(t, engine)

	dr := &dockerRuntime{engine: engine, scope: randomName(e2eScopePrefix), image: "hermes-dispatch-e2e:" + randomName("")}
	binaries := []string{filepath.Join(binDir, "hermes-host"), filepath.Join(binDir, "scripted-agent")}
	if opts.shell {
		binaries = append(binaries, busyboxAsShell(t))
	}
	limits := runtime.Limits{MemoryBytes: 512 << 20, NanoCPUs: 1e9, Pids: 512}
	if opts.limits != nil {
		limits = *opts.limits
	}
	if _, err := runtime.BuildScratchImage(ctx, engine, runtime.ScratchImage{
		Tag:      dr.image,
		Binaries: binaries,
		Cmd:      []string{"hermes-host", "worker", "idle"},
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := engine.ImageRemove(context.Background(), dr.image, image.RemoveOptions{Force: true, PruneChildren: true}); err != nil {
			t.Errorf("remove image %s: %v", dr.image, err)
		}
	})
	// The fixture made the org homes as the test process; the runtime gives them to the
	// units' user (runtime.DefaultUser) when it starts their containers.
	rt, err := runtime.NewDocker(ctx, runtime.Config{
		Limits:   limits,
		Instance: dr.scope, Scope: dr.scope,
		OrgsRoot: f.cfg.OrgsRoot, WorkspacesRoot: filepath.Join(filepath.Dir(f.cfg.OrgsRoot), "workspaces"),
		WorkerIdle:  []string{"hermes-host", "worker", "idle"},
		WorkerImage: dr.image, DashboardImage: dr.image,
		Logger: f.cfg.Log, Services: f.services(t), Users: opts.users,
	})
	if err != nil {
		t.Fatal(err)
	}
	dr.Docker = rt
	t.Cleanup(func() {
		// Only this test's containers: those of its scope.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		list, err := engine.ContainerList(ctx, container.ListOptions{All: true,
			Filters: filters.NewArgs(filters.Arg("label", runtime.LabelScope+"="+dr.scope))})
		if err != nil {
			t.Errorf("list the test's containers: %v", err)
		}
		for _, c := range list {
			if err := engine.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
				t.Errorf("remove container %s: %v", c.ID, err)
			}
		}
		if err := engine.NetworkRemove(ctx, "hermes-units-"+dr.scope); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("remove the test's network: %v", err)
		}
		rt.Close()
	})
	f.cfg.Runtime = rt
	return dr
}

// e2eScopePrefix starts the runtime scope of every test here.
const e2eScopePrefix = "dispatch-e2e-"

// reserveDemoOrgNames holds demoOrgsLock until the test ends (so that this suite's tests,
// from any checkout, take turns), removes what a killed run of the suite left, then waits
// until no other runtime (another package's tests, a local `hermes-host dev`) holds a demo
// org's container name: ours would fail to start (runtime.ErrNameTaken), and theirs is
// not ours to remove.
func reserveDemoOrgNames(t *testing.T, engine *client.Client) {
	t.Helper()
	const within = 90 * time.Second
	hosttest.LockDemoOrgContainers(t, within)
	deadline := time.Now().Add(within)
	// Under the lock no other test of this suite runs: containers of its scopes are left
	// by a run that was killed before its cleanup.
	left, err := engine.ContainerList(context.Background(), container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", runtime.LabelScope))})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range left {
		if strings.HasPrefix(c.Labels[runtime.LabelScope], e2eScopePrefix) {
			t.Logf("removing %s, left by an earlier run (scope %s)", c.Names, c.Labels[runtime.LabelScope])
			if err := engine.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
				t.Fatal(err)
			}
		}
	}
	for {
		var held []string
		for _, org := range backend.DemoOrganizations {
			name := runtime.UnitName(org, runtime.RoleWorker)
			info, err := engine.ContainerInspect(context.Background(), name)
			if cerrdefs.IsNotFound(err) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, fmt.Sprintf("%s (scope %q, %s)", name, info.Config.Labels[runtime.LabelScope], info.State.Status))
		}
		if len(held) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("for %s the engine has held containers this test must create: %s", within, strings.Join(held, ", "))
		}
		time.Sleep(time.Second)
	}
}

// writeKnobs sets org's scripted-agent faults; nil removes them.
func writeKnobs(t *testing.T, f *fixture, org string, k *scriptedagent.Knobs) {
	t.Helper()
	path := filepath.Join(f.cfg.OrgsRoot, org, scriptedagent.KnobsFile)
	if k == nil {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		return
	}
	raw, _ := json.Marshal(k)
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// cycleUntilDone runs cycles, each followed by the end of the jobs it started, until the
// backend shows every demo job completed.
func cycleUntilDone(t *testing.T, f *fixture, d *dispatch.Dispatcher, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for f.statuses(t)[sartiq.StatusCompleted] < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("after %s the backend's jobs are %v\n%s", within, f.statuses(t), f.logs.String())
		}
		n, err := d.Cycle(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if n > len(backend.DemoOrganizations) {
			t.Fatalf("one cycle started %d jobs for %d orgs", n, len(backend.DemoOrganizations))
		}
		d.Wait()
	}
}

// checkDemoJobsDone asserts what every run of the four demo jobs ends with: each completed
// once at the backend and in the host's mirror, its last attempt recorded completed, the
// workers' progress mirrored, claims+reclaims attempts in all, and never two runs of one
// org at once.
func checkDemoJobsDone(t *testing.T, f *fixture, claims, reclaims int) {
	t.Helper()
	ctx := context.Background()
	if st := f.statuses(t); st[sartiq.StatusCompleted] != 4 || len(st) != 1 {
		t.Fatalf("backend jobs: %v", st)
	}
	var nClaims, nReclaims, completed, progress, mirrored, overlaps int
	if err := f.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'claim'), count(*) FILTER (WHERE kind = 'reclaim'),
		count(*) FILTER (WHERE outcome = 'completed') FROM claim_attempts`).Scan(&nClaims, &nReclaims, &completed); err != nil {
		t.Fatal(err)
	}
	if err := f.db.QueryRow(ctx, `SELECT count(*) FROM mirror_job_events WHERE kind = 'progress'`).Scan(&progress); err != nil {
		t.Fatal(err)
	}
	if nClaims != claims || nReclaims != reclaims || completed != 4 || progress < 5 {
		t.Errorf("claim_attempts: %d claims, %d re-claims, %d completed; mirrored progress lines %d; want %d, %d, 4, at least 5",
			nClaims, nReclaims, completed, progress, claims, reclaims)
	}
	if err := f.db.QueryRow(ctx, `SELECT count(*) FROM mirror_jobs m WHERE status = 'COMPLETED'
		AND attempt = (SELECT max(attempt) FROM claim_attempts a WHERE a.job_id = m.job_id)`).Scan(&mirrored); err != nil || mirrored != 4 {
		t.Errorf("mirror_jobs: %d COMPLETED at their last attempt (%v), want 4", mirrored, err)
	}
	// Each org's claim-to-outcome intervals are disjoint.
	if err := f.db.QueryRow(ctx, `SELECT count(*) FROM claim_attempts a JOIN claim_attempts b
		ON a.org = b.org AND a.id < b.id AND (a.finished_at IS NULL OR b.claimed_at < a.finished_at)`).Scan(&overlaps); err != nil || overlaps != 0 {
		t.Errorf("overlapping runs of one org: %d %v", overlaps, err)
	}
	checkOneRunPerOrg(t, f.backend.DB)
}

// attempt is one claim_attempts row.
type attempt struct {
	Attempt int
	Kind    string
	Outcome string
	Reason  string
}

func attemptsOf(t *testing.T, f *fixture, job string) []attempt {
	t.Helper()
	rows, err := f.db.Query(context.Background(), `SELECT attempt, kind, coalesce(outcome, ''), coalesce(reason, '')
		FROM claim_attempts WHERE job_id = $1 ORDER BY attempt`, job)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []attempt
	for rows.Next() {
		var a attempt
		if err := rows.Scan(&a.Attempt, &a.Kind, &a.Outcome, &a.Reason); err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

// runKinds is the job's backend log reduced to the events that open or close a run.
func runKinds(t *testing.T, f *fixture, job string) []string {
	t.Helper()
	events, err := f.cfg.Bot.ListEvents(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range events {
		switch e.Kind {
		case sartiq.EventClaim, sartiq.EventReclaim, sartiq.EventCrash, sartiq.EventComplete, sartiq.EventFail, sartiq.EventRelease:
			kinds = append(kinds, fmt.Sprintf("%s@%d", e.Kind, e.Attempt))
		}
	}
	return kinds
}

// stallAcme has a new dispatcher claim the demo jobs, acme's agent stalling before its
// first write, and returns the dispatcher (shut down when the test ends) and acme's job.
func stallAcme(t *testing.T, f *fixture) (*dispatch.Dispatcher, string) {
	t.Helper()
	f.cfg.ClaimEnabled = true
	writeKnobs(t, f, "acme", &scriptedagent.Knobs{StallAtWrite: 1})
	d := f.dispatcher(t)
	// A failed test must not leave the stalled delivery running.
	t.Cleanup(func() { d.Shutdown(0, 10*time.Second) })
	if n, err := d.Cycle(t.Context()); err != nil || n != 2 {
		t.Fatalf("first cycle started %d jobs (%v), want one per org", n, err)
	}
	var job string
	if err := f.backend.DB.QueryRow(t.Context(), `SELECT id::text FROM agent_jobs WHERE organization_id = 'acme' AND status IN ('CLAIMED', 'RUNNING')`).Scan(&job); err != nil {
		t.Fatalf("acme's claimed job: %v", err)
	}
	return d, job
}

// killMidJob is the crash scenario every runtime must survive. acme's first job stalls in
// its agent; once the job is RUNNING there, kill kills the worker with SIGKILL. The
// dispatcher, alive and holding the job token, must end attempt 1 at once: recorded
// crashed, a crash event in the backend's log, the job released to the queue and the home
// lease given back, all without the backend's clock moving (the job never goes stale). The
// next cycle claims the job again and it completes, with everything else; the crash is
// counted once. It returns attempt 1's reason.
func killMidJob(t *testing.T, f *fixture, kill func(t *testing.T)) string {
	t.Helper()
	d, job := stallAcme(t, f)
	ctx := t.Context()
	waitFor(t, 30*time.Second, "acme's agent to run the job", func() bool {
		var running bool
		err := f.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM mirror_job_events WHERE job_id = $1 AND attempt = 1 AND kind = 'agent_start')`, job).Scan(&running)
		return err == nil && running
	})
	if st := jobStatus(t, f, job); st != sartiq.StatusRunning {
		t.Fatalf("the stalled job is %s at the backend, want RUNNING", st)
	}
	writeKnobs(t, f, "acme", nil) // the agent read its knobs as it started; the next attempt runs through

	kill(t)

	waitFor(t, 20*time.Second, "the killed delivery to record its outcome", func() bool {
		a := attemptsOf(t, f, job)
		return len(a) == 1 && a[0].Outcome != ""
	})
	first := attemptsOf(t, f, job)[0]
	if first.Kind != "claim" || first.Outcome != "crashed" {
		t.Fatalf("attempt 1 after the kill: %+v, want a claim that crashed", first)
	}
	// Promptly, not when its TTL runs out: a lease kept past the crash would hold the
	// next claim off (or, refreshed by a leaked keeper, forever).
	waitFor(t, 5*time.Second, "the home lease to be given back", func() bool {
		var free bool
		err := f.db.QueryRow(ctx, `SELECT holder IS NULL FROM leases WHERE key = 'home:acme'`).Scan(&free)
		return err == nil && free
	})
	// Ended at once: queued again with the crash counted, while its last heartbeat is
	// still fresh (the backend's clock has not moved).
	if kinds := runKinds(t, f, job); !slices.Equal(kinds, []string{"claim@1", "crash@1", "release@1"}) || jobStatus(t, f, job) != sartiq.StatusQueued {
		t.Fatalf("after the kill the job's log reads %v, status %s; want claim@1 crash@1 release@1, QUEUED", kinds, jobStatus(t, f, job))
	}
	if m := f.mirrorStatus(t, job); m != sartiq.StatusQueued {
		t.Errorf("the mirror shows the crashed job %s, want QUEUED", m)
	}

	// The very next cycle claims it again (once the delivery has given back the org's slot).
	d.Wait()
	if _, err := d.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	if kinds := runKinds(t, f, job); !slices.Contains(kinds, "claim@2") {
		t.Fatalf("the next cycle did not claim the crashed job again: its log reads %v\n%s", kinds, f.logs.String())
	}
	cycleUntilDone(t, f, d, 40*time.Second)

	checkDemoJobsDone(t, f, 5, 0)
	if kinds := runKinds(t, f, job); !slices.Equal(kinds, []string{"claim@1", "crash@1", "release@1", "claim@2", "complete@2"}) {
		t.Errorf("the killed job's log reads %v, want claim@1 crash@1 release@1 claim@2 complete@2", kinds)
	}
	events, err := f.cfg.Bot.ListEvents(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	if n := dispatch.CrashedAttempts(events, 2) - 1; n != 1 {
		t.Errorf("the backend's log counts %d crashed attempts before the last, want 1", n)
	}
	got := attemptsOf(t, f, job)
	if len(got) != 2 || got[0].Outcome != "crashed" || got[1] != (attempt{Attempt: 2, Kind: "claim", Outcome: "completed"}) {
		t.Errorf("claim_attempts of the killed job: %+v, want attempt 1 crashed and attempt 2 claimed and completed", got)
	}
	logs := f.logs.String()
	if !strings.Contains(logs, `"msg":"attempt crashed: the job is queued again"`) || strings.Contains(logs, "claim_attempts disagree") ||
		strings.Contains(logs, "re-claimed a stale job") {
		t.Errorf("the crash is not logged, the host's attempts disagree with the backend's log, or the job was re-claimed as stale:\n%s", logs)
	}
	return first.Reason
}

func jobStatus(t *testing.T, f *fixture, job string) string {
	t.Helper()
	var st string
	if err := f.backend.DB.QueryRow(context.Background(), `SELECT status FROM agent_jobs WHERE id = $1`, job).Scan(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// workerUnit is org's worker unit as the runtime lists it.
func workerUnit(t *testing.T, rt runtime.Runtime, org string) runtime.Unit {
	t.Helper()
	units, err := rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range units {
		if u.Org == org && u.Role == runtime.RoleWorker {
			return u
		}
	}
	t.Fatalf("no worker of %s among %+v", org, units)
	return runtime.Unit{}
}

// busyboxAsShell is a copy of Debian's static busybox named sh: in a FROM scratch image,
// /bin/sh running its applets (setsid, dd, id, ps...) without links.
func busyboxAsShell(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("/bin/busybox")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, so the hostile-agent tests must run: %v (apt-get install busybox-static)", err)
		}
		t.Skipf("no static busybox (%v): apt-get install busybox-static to run the hostile-agent tests", err)
	}
	p := filepath.Join(t.TempDir(), "sh")
	if err := os.WriteFile(p, raw, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}
