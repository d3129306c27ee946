package dispatch_test

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hermeshost/dispatch/runtime"
	"hermeshost/sartiq"
	"hermeshost/sartiq/backend"
)

// The hostile-agent suite on the Docker runtime: the agent is a busybox shell script that
// the real worker runs as HERMES_BIN, inside the org's container. Each org's home gets its
// own script at /home/hermes/agent: acme's is hostile, the others hand over to the
// scripted agent. What an agent saw goes to reached.log in its home, which the test reads.

const dockerAgentBin = "/home/hermes/agent"

// dockerHostile writes the agents and points the workers at them.
func dockerHostile(t *testing.T, f *fixture, script string) {
	t.Helper()
	for _, org := range backend.DemoOrganizations {
		body := "#!/bin/sh\nexec scripted-agent \"$@\"\n"
		if org == "acme" {
			body = "#!/bin/sh\n" + script + "\n"
		}
		if err := os.WriteFile(filepath.Join(f.cfg.OrgsRoot, org, "agent"), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f.cfg.WorkerEnv = append(f.cfg.WorkerEnv, "HERMES_BIN="+dockerAgentBin)
}

// settle cycles (each followed by the end of its jobs, then the backend's clock past
// STALE_AFTER, so crashed jobs are re-claimed or failed) until no job is left to run.
func settle(t *testing.T, f *fixture, within time.Duration) {
	t.Helper()
	d := f.dispatcher(t)
	for deadline := time.Now().Add(within); ; {
		st := f.statuses(t)
		if st[sartiq.StatusQueued]+st[sartiq.StatusClaimed]+st[sartiq.StatusRunning] == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s the jobs are %v\n%s", within, st, f.logs.String())
		}
		if _, err := d.Cycle(t.Context()); err != nil {
			t.Fatal(err)
		}
		d.Wait()
		f.backend.Clock.Advance(2 * time.Minute)
	}
}

// acmeAttempts are acme's claim_attempts, in order.
func acmeAttempts(t *testing.T, f *fixture) []attempt {
	t.Helper()
	rows, err := f.db.Query(context.Background(), `SELECT attempt, kind, coalesce(outcome, ''), coalesce(reason, '')
		FROM claim_attempts WHERE org = 'acme' ORDER BY id`)
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

// checkOthersCompleted asserts every job of the orgs other than acme completed, and that
// the host can still start a process.
func checkOthersCompleted(t *testing.T, f *fixture) {
	t.Helper()
	for _, org := range backend.DemoOrganizations {
		if org == "acme" {
			continue
		}
		if st := f.jobsOf(t, org); st[sartiq.StatusCompleted] != 2 || len(st) != 1 {
			t.Errorf("%s's jobs: %v, want both completed", org, st)
		}
	}
	if out, err := exec.Command("true").CombinedOutput(); err != nil {
		t.Errorf("the host cannot start a process: %v %s", err, out)
	}
}

// An agent that allocates past its unit's memory limit (dd's 512 MiB buffer, filled from
// /dev/zero, in a 128 MiB unit) is killed by the kernel; each attempt ends crashed with
// the reason "out of memory" and counts, so acme's jobs fail at MAX_ATTEMPTS; globex's
// complete beside it.
func TestDockerAgentPastTheMemoryLimitIsOutOfMemory(t *testing.T) {
	f := newFixture(t, true)
	useDockerWith(t, f, dockerOptions{shell: true, limits: &runtime.Limits{MemoryBytes: 128 << 20, NanoCPUs: 1e9, Pids: 256}})
	f.cfg.ClaimEnabled, f.cfg.MaxAttempts = true, 1
	dockerHostile(t, f, "echo allocating >&2\nexec dd if=/dev/zero of=/dev/null bs=512M count=1")
	settle(t, f, 3*time.Minute)

	checkOutOfMemoryAtMaxAttempts(t, f)
}

// A fork bomb is held at the unit's pids limit: the host and globex's jobs carry on, acme's
// attempts end (crashed, with the worker's reason) and fail at MAX_ATTEMPTS, and nothing of
// the bomb is left in acme's worker afterwards.
func TestDockerForkBombIsBoundedByThePidsLimit(t *testing.T) {
	f := newFixture(t, true)
	dr := useDockerWith(t, f, dockerOptions{shell: true, limits: &runtime.Limits{MemoryBytes: 256 << 20, NanoCPUs: 1e9, Pids: 128}})
	f.cfg.ClaimEnabled, f.cfg.MaxAttempts = true, 1
	// Detached, so that the worker's kill of the agent's process group does not end it: the
	// sweep must.
	// A loop that forks without end (the textbook bomb dies out at a pids limit, its
	// subshells failing to fork) keeps the unit at its limit.
	dockerHostile(t, f, "setsid sh -c 'while :; do (while :; do sleep 1; done) & done' >/dev/null 2>&1 </dev/null &\nsleep 5\nexit 7")
	settle(t, f, 3*time.Minute)

	if st := f.jobsOf(t, "acme"); st[sartiq.StatusFailed] != 2 {
		t.Errorf("acme's jobs: %v, want both failed at MAX_ATTEMPTS=1", st)
	}
	// The bomb outlived its agent: each job's sweep found it at work (or failed to
	// start beside it and removed the container).
	logs := f.logs.String()
	if n := strings.Count(logs, `"msg":"processes left by an exec killed","runtime":"docker","container":"hermes-org-acme"`) +
		strings.Count(logs, `"msg":"worker sweep failed: container removed","runtime":"docker","container":"hermes-org-acme"`); n != 2 {
		t.Errorf("%d of acme's 2 jobs ended with a sweep that found the bomb, want 2", n)
	}
	for _, a := range acmeAttempts(t, f) {
		if a.Outcome == "completed" || a.Reason == "" {
			t.Errorf("acme attempt %+v, want an end with a reason", a)
		}
	}
	checkOthersCompleted(t, f)
	// Whatever is left of acme's worker holds no bomb: swept, or removed when the sweep
	// could not even start.
	if info, err := dr.engine.ContainerInspect(context.Background(), runtime.UnitName("acme", runtime.RoleWorker)); err == nil && info.State.Running {
		if ps := topOf(t, dr, info.ID); strings.Count(ps, "\n") > 2 {
			t.Errorf("acme's worker after the bomb runs more than its init and main process:\n%s", ps)
		}
	}
}

// A process the agent detaches (setsid nohup sleep &, the nohup done by the shell) is gone before the org's next job
// starts and after the dispatcher stops; the agent runs as the units' user, not root.
func TestDockerDetachedProcessEndsWithItsJob(t *testing.T) {
	f := newFixture(t, true)
	dr := useDockerWith(t, f, dockerOptions{shell: true})
	f.cfg.ClaimEnabled = true
	// The agent's own look for it (grep) must not carry the marker on its command line, or
	// the test would take the look for the detached process.
	marker := fmt.Sprintf("sleep %d", 600000+mrand.IntN(400000))
	dockerHostile(t, f, `log=/home/hermes/reached.log
seen=$(for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <"$f"; echo; done 2>/dev/null | grep -c "^`+strings.Replace(marker, "sleep", "slee[p]", 1)+`")
runs=$(($(cat /home/hermes/runs 2>/dev/null || echo 0) + 1))
echo $runs >/home/hermes/runs
echo "run=$runs uid=$(id -u) gid=$(id -g) seen=$seen" >>$log
setsid sh -c "trap '' HUP; exec `+marker+`" >/dev/null 2>&1 </dev/null & # nohup, which busybox-static lacks
sleep 1
[ $runs -lt 2 ] || exec sleep 60 # the second run is in flight when the dispatcher stops
exec scripted-agent "$@"`)
	d := f.dispatcher(t)
	ctx := t.Context()
	acme := runtime.UnitName("acme", runtime.RoleWorker)

	if _, err := d.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	d.Wait()
	info, err := dr.engine.ContainerInspect(ctx, acme)
	if err != nil {
		t.Fatal(err)
	}
	if ps := topOf(t, dr, info.ID); strings.Contains(ps, marker) {
		t.Fatalf("the first job's detached process outlived it:\n%s", ps)
	}
	if _, err := d.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			raw, _ := os.ReadFile(filepath.Join(f.cfg.OrgsRoot, "acme", "reached.log"))
			t.Logf("reached.log:\n%s\nlogs:\n%s", raw, f.logs.String())
		}
	})
	waitFor(t, 30*time.Second, "acme's second run to detach its process", func() bool {
		info, err = dr.engine.ContainerInspect(ctx, acme)
		return err == nil && strings.Contains(topOf(t, dr, info.ID), marker)
	})
	d.Shutdown(0, time.Minute)
	if info, err := dr.engine.ContainerInspect(ctx, acme); err == nil && info.State.Running {
		if ps := topOf(t, dr, info.ID); strings.Contains(ps, marker) {
			t.Errorf("the detached process outlived the dispatcher:\n%s", ps)
		}
	}

	raw, err := os.ReadFile(filepath.Join(f.cfg.OrgsRoot, "acme", "reached.log"))
	if err != nil {
		t.Fatal(err)
	}
	uid, gid, _ := strings.Cut(runtime.DefaultUser, ":")
	want := fmt.Sprintf("run=1 uid=%s gid=%s seen=0\nrun=2 uid=%s gid=%s seen=0\n", uid, gid, uid, gid)
	if string(raw) != want {
		t.Errorf("the agent reached:\n%s\nwant (each run as the units' user, seeing no earlier run's process):\n%s", raw, want)
	}
}

// topOf is what the engine shows running in a container, a line per process.
func topOf(t *testing.T, dr *dockerRuntime, id string) string {
	t.Helper()
	top, err := dr.engine.ContainerTop(context.Background(), id, []string{"-o", "pid,uid,args"})
	if err != nil {
		return "" // the container is gone
	}
	var b strings.Builder
	for _, p := range top.Processes {
		b.WriteString(strings.Join(p, " ") + "\n")
	}
	return b.String()
}
