package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// containerProcesses is what the engine shows running in a container: one line per
// process, its uid and command line.
func containerProcesses(t *testing.T, id string) string {
	t.Helper()
	top, err := suite.engine.ContainerTop(testContext(t), id, []string{"-o", "pid,uid,args"})
	if err != nil {
		t.Fatalf("top %s: %v", id, err)
	}
	var b strings.Builder
	for _, p := range top.Processes {
		b.WriteString(strings.Join(p, " ") + "\n")
	}
	return b.String()
}

// execsCreated counts the execs of program the engine created in container id since then,
// from the engine's events.
func execsCreated(t *testing.T, id string, since time.Time, program string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(testContext(t), 10*time.Second)
	defer cancel()
	msgs, errs := suite.engine.Events(ctx, events.ListOptions{
		Since: strconv.FormatInt(since.Unix()-1, 10), Until: strconv.FormatInt(time.Now().Unix()+1, 10),
		Filters: filters.NewArgs(filters.Arg("container", id), filters.Arg("event", "exec_create")),
	})
	n := 0
	for {
		select {
		case m := <-msgs:
			if strings.HasPrefix(string(m.Action), "exec_create: "+program) {
				n++
			}
		case err := <-errs:
			if err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			return n
		}
	}
}

// An exec that leaves nothing behind, the usual job, costs no sweep: the engine's list of
// the worker's processes shows none of the units' user, and no sweep exec is made. An exec
// that ends within statsInterval of the last count is swept instead of waiting for the
// engine's next stats tick. (One that leaves a process is swept: see
// TestDockerExecLeavesNothingBehind and TestDockerAProcessThatHopsPidsIsStillSwept.)
func TestDockerAnExecThatLeavesNothingIsNotSwept(t *testing.T) {
	requireEngine(t)
	cfg := testConfig(t, nil)
	rt := dockerHarness().start(t, cfg).(*Docker)
	org := newOrg(t, cfg, "sweep-unneeded")
	e := mustEnsureWorker(t, rt, org)
	since := time.Now()
	echo := func() {
		t.Helper()
		if _, _, st := run(t, rt, org, "", nil, "testagent", "echo"); st.Code != 0 {
			t.Fatal(st)
		}
	}
	for range 3 {
		// Execs further apart than the engine's stats answer at once, as jobs are.
		time.Sleep(statsInterval)
		echo()
	}
	sweeper := strings.Join(rt.sweepCmd, " ")
	if n := execsCreated(t, e.ID, since, sweeper); n != 0 {
		t.Errorf("%d sweeps ran after execs that left nothing, want none", n)
	}
	if got := testutil.ToFloat64(cfg.Metrics.sweeps.WithLabelValues("docker", "nothing_left")); got != 3 {
		t.Errorf("%v exec ends counted as leaving nothing, want 3", got)
	}
	echo() // at once after the last: its count is not asked for
	if n := execsCreated(t, e.ID, since, sweeper); n != 1 {
		t.Errorf("%d sweeps ran after an exec that ended right after another, want 1", n)
	}
	if got := testutil.ToFloat64(cfg.Metrics.sweeps.WithLabelValues("docker", "clean")); got != 1 {
		t.Errorf("%v sweeps counted clean, want 1", got)
	}
}

// A process that keeps changing pid (each generation starts the next and exits) can fall
// between the two steps of the engine's process list; the cgroup's task count still holds
// it, so the exec that left it is swept, and the chain ends.
func TestDockerAProcessThatHopsPidsIsStillSwept(t *testing.T) {
	requireEngine(t)
	cfg := testConfig(t, nil)
	rt := dockerHarness().start(t, cfg).(*Docker)
	org := newOrg(t, cfg, "sweep-hop")
	e := mustEnsureWorker(t, rt, org)
	since := time.Now()
	const hops = 5
	for range hops {
		time.Sleep(statsInterval) // so that each exec's end is checked, not swept outright
		if _, _, st := run(t, rt, org, "", nil, "testagent", "hop", "hop-"+randomHex(4)); st.Code != 0 {
			t.Fatal(st)
		}
	}
	if n := execsCreated(t, e.ID, since, strings.Join(rt.sweepCmd, " ")); n != hops {
		t.Errorf("%d of %d execs that left a chain were swept", n, hops)
	}
	if got := testutil.ToFloat64(cfg.Metrics.sweeps.WithLabelValues("docker", "nothing_left")); got != 0 {
		t.Errorf("%v exec ends that left a chain counted as leaving nothing", got)
	}
	if ps := containerProcesses(t, e.ID); strings.Contains(ps, "hop") {
		t.Fatalf("the chain outlived its sweeps:\n%s", ps)
	}
	tasks, err := rt.tasks(testContext(t), e.ID)
	if err != nil {
		t.Fatal(err)
	}
	rt.mu.Lock()
	u := rt.units[UnitName(org, RoleWorker)]
	rt.mu.Unlock()
	time.Sleep(statsInterval)
	if !rt.nothingLeft(testContext(t), UnitName(org, RoleWorker), u) {
		t.Errorf("after the sweeps, the worker (%d tasks) still does not read as empty:\n%s", tasks, containerProcesses(t, e.ID))
	}
}

// A process an exec detached into a session of its own (as setsid nohup ... & does) is
// gone when the exec returns; the worker's init and main process, as the keeper, stay,
// and the worker stays warm.
func TestDockerExecLeavesNothingBehind(t *testing.T) {
	requireEngine(t)
	cfg := testConfig(t, nil)
	rt := dockerHarness().start(t, cfg)
	org := newOrg(t, cfg, "sweep")
	e := mustEnsureWorker(t, rt, org)

	tag := "left-" + randomHex(4)
	out, _, status := run(t, rt, org, "", nil, "testagent", "detach", tag)
	if status.Code != 0 || strings.TrimSpace(out) == "" {
		t.Fatalf("detach: %v %q", status, out)
	}
	if ps := containerProcesses(t, e.ID); strings.Contains(ps, tag) {
		t.Fatalf("the detached process outlived its exec:\n%s", ps)
	}
	ps := containerProcesses(t, e.ID)
	if !strings.Contains(ps, "testagent idle") {
		t.Errorf("the worker's main process is gone:\n%s", ps)
	}
	if got := testutil.ToFloat64(cfg.Metrics.sweptProcs.WithLabelValues("docker")); got != 1 {
		t.Errorf("%v processes counted as swept, want 1", got)
	}
	if again := mustEnsureWorker(t, rt, org); again.Cold || again.ID != e.ID {
		t.Errorf("the worker did not stay warm through the sweep: %+v", again)
	}
	// A second org's exec, and its own leftover, are its own: sweeping a never reaches b.
	other := newOrg(t, cfg, "sweep-other")
	eo := mustEnsureWorker(t, rt, other)
	if _, _, st := run(t, rt, other, "", nil, "testagent", "echo"); st.Code != 0 {
		t.Fatal(st)
	}
	if ps := containerProcesses(t, eo.ID); !strings.Contains(ps, "testagent idle") {
		t.Errorf("b's worker lost its main process:\n%s", ps)
	}
}

// A sweep that does not end within its bound removes the worker, and the next ensure
// starts a fresh one. (The exec the timeout cuts removes the container itself; the
// sweep's own removal after it, once given the spent context, is not what this shows.)
func TestDockerASweepThatTimesOutRemovesTheWorker(t *testing.T) {
	requireEngine(t)
	cfg := testConfig(t, nil)
	rt := dockerHarness().start(t, cfg).(*Docker)
	org := newOrg(t, cfg, "sweep-timeout")
	e := mustEnsureWorker(t, rt, org)
	rt.sweepCmd = []string{"testagent", "sleep", "30s"}
	rt.sweepTimeout = time.Second
	if _, _, st := run(t, rt, org, "", nil, "testagent", "detach", "left-"+randomHex(4)); st.Code != 0 {
		t.Fatal(st)
	}
	if got := testutil.ToFloat64(cfg.Metrics.sweeps.WithLabelValues("docker", "failed")); got != 1 {
		t.Errorf("%v sweeps counted as failed, want 1", got)
	}
	if _, err := suite.engine.ContainerInspect(testContext(t), e.ID); !cerrdefs.IsNotFound(err) {
		t.Fatalf("the worker whose sweep timed out is still there: %v", err)
	}
	if again := mustEnsureWorker(t, rt, org); !again.Cold || again.ID == e.ID {
		t.Errorf("the next ensure did not start a fresh worker: %+v", again)
	}
}

// A sweep the engine does not start (it failed execs now and then under a load average in
// the hundreds) is tried again before the worker is given up. Here it never can start: it
// is tried sweepTries times, then the worker is removed.
func TestDockerASweepThatDoesNotStartIsTriedAgain(t *testing.T) {
	requireEngine(t)
	cfg := testConfig(t, nil)
	rt := dockerHarness().start(t, cfg).(*Docker)
	org := newOrg(t, cfg, "sweep-unstarted")
	e := mustEnsureWorker(t, rt, org)
	rt.sweepCmd = []string{"no-such-sweeper"}
	rt.sweepPause = 10 * time.Millisecond
	since := time.Now()
	if _, _, st := run(t, rt, org, "", nil, "testagent", "detach", "left-"+randomHex(4)); st.Code != 0 {
		t.Fatal(st)
	}
	if tries := execsCreated(t, e.ID, since, "no-such-sweeper"); tries != sweepTries {
		t.Errorf("the sweep was tried %d times, want %d", tries, sweepTries)
	}
	if got := testutil.ToFloat64(cfg.Metrics.sweeps.WithLabelValues("docker", "failed")); got != 1 {
		t.Errorf("%v sweeps counted as failed, want 1", got)
	}
	if _, err := suite.engine.ContainerInspect(testContext(t), e.ID); !cerrdefs.IsNotFound(err) {
		t.Fatalf("the worker whose sweep never started is still there: %v", err)
	}
}

// The sweep is a kill of everything of the units' uid in the container, so a process
// detached by an exec that nobody swept (started outside the runtime here, as a dispatcher
// that died mid-job would leave it) is gone before the first exec of the next runtime that
// adopts the container starts.
func TestDockerAdoptedWorkerIsSweptBeforeItsFirstExec(t *testing.T) {
	requireEngine(t)
	cfg := testConfig(t, nil)
	rt := dockerHarness().start(t, cfg)
	org := newOrg(t, cfg, "adopt-sweep")
	e := mustEnsureWorker(t, rt, org)
	tag := "orphan-" + randomHex(4)
	ctx := testContext(t)
	created, err := suite.engine.ContainerExecCreate(ctx, e.ID, container.ExecOptions{
		User: DefaultUser, Cmd: []string{"testagent", "detach", tag}})
	if err != nil {
		t.Fatal(err)
	}
	if err := suite.engine.ContainerExecStart(ctx, created.ID, container.ExecStartOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the orphan to run", func() bool { return strings.Contains(containerProcesses(t, e.ID), tag) })

	again, err := NewDocker(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if ensured := mustEnsureWorker(t, again, org); ensured.Cold {
		t.Fatal("the new runtime did not adopt the worker")
	}
	out, _, status := run(t, again, org, "", nil, "testagent", "cmdlines")
	if status.Code != 0 || strings.Contains(out, tag) {
		t.Errorf("the first exec after adoption saw the orphan (%v):\n%s", status, out)
	}
}

// Programs in a worker run as the units' user, never root, with the org's home theirs; the
// host's files in it (a 0600 SOUL.md the host wrote as root, say) are given to that user
// when the container starts, and what the programs write is theirs on the host.
func TestDockerExecsRunAsTheUnitsUser(t *testing.T) {
	requireEngine(t)
	cfg := testConfig(t, nil)
	rt := dockerHarness().start(t, cfg)
	org := newOrg(t, cfg, "uid")
	home := filepath.Join(cfg.OrgsRoot, org)
	if err := os.MkdirAll(filepath.Join(home, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(home, "sub", "link")); err != nil {
		t.Fatal(err)
	}
	mustEnsureWorker(t, rt, org)
	uid, gid, err := parseUser(DefaultUser)
	if err != nil {
		t.Fatal(err)
	}
	out, _, status := run(t, rt, org, "", nil, "testagent", "cat", "/proc/self/status")
	if status.Code != 0 || !strings.Contains(out, fmt.Sprintf("\nUid:\t%d\t%d\t%d\t%d\n", uid, uid, uid, uid)) {
		t.Errorf("exec's status (%v) does not show uid %d:\n%s", status, uid, out)
	}
	if uid == 0 {
		t.Error("the units' user is root")
	}
	if _, _, status := run(t, rt, org, "", nil, "testagent", "cat", "/home/hermes/SOUL.md"); status.Code != 0 {
		t.Errorf("the unit cannot read its 0600 SOUL.md: %v", status)
	}
	if _, _, status := run(t, rt, org, "made", nil, "testagent", "write", "/home/hermes/sub/made.txt"); status.Code != 0 {
		t.Fatalf("write in the home: %v", status)
	}
	for _, p := range []string{home, filepath.Join(home, "SOUL.md"), filepath.Join(home, "sub"), filepath.Join(home, "sub", "made.txt"),
		filepath.Join(cfg.WorkspacesRoot, org)} {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		if int(st.Uid) != uid || int(st.Gid) != gid {
			t.Errorf("%s is owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, uid, gid)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(outside, &st); err != nil {
		t.Fatal(err)
	}
	if int(st.Uid) != os.Getuid() {
		t.Errorf("a link in the home was followed: %s was given to %d", outside, st.Uid)
	}
}

// An exec whose child the OOM killer took, and which then failed itself, as a worker does
// whose agent was killed, is out of memory too.
func TestDockerChildOutOfMemory(t *testing.T) {
	requireEngine(t)
	cfg := testConfig(t, nil)
	cfg.Limits.MemoryBytes = 64 << 20
	rt := dockerHarness().start(t, cfg)
	org := newOrg(t, cfg, "child-oom")
	mustEnsureWorker(t, rt, org)
	_, _, status := run(t, rt, org, "", nil, "testagent", "child", "alloc", "512")
	if !status.OutOfMemory || status.Code != 3 {
		t.Errorf("child killed past the limit = %+v, want out of memory, exit 3", status)
	}
	if _, _, status := run(t, rt, org, "", nil, "testagent", "child", "echo"); status.OutOfMemory || status.Code != 0 {
		t.Errorf("the next exec = %+v, want a plain exit 0", status)
	}
}

func waitUntil(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !ok(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %s waiting for %s", within, what)
		}
	}
}

// An ensure the engine does not answer within its bound fails, saying so (the dispatcher
// then releases the job), and frees the unit for the next ensure, which starts the worker.
// The engine that hung here for good (a start and every inspect of its container, under a
// load average of 400) cannot be made to hang on purpose: the bound is shortened instead.
func TestDockerAnEnsureTheEngineDoesNotAnswerInTimeFails(t *testing.T) {
	requireEngine(t)
	cfg := testConfig(t, nil)
	rt := dockerHarness().start(t, cfg).(*Docker)
	org := newOrg(t, cfg, "ensure-bound")
	rt.ensureTimeout = time.Millisecond
	_, err := rt.EnsureWorker(testContext(t), org)
	if !errors.Is(err, errEngineHung) || !strings.Contains(err.Error(), "the engine did not answer within 1ms") {
		t.Fatalf("an ensure past its bound: %v", err)
	}
	rt.ensureTimeout = ensureTimeout
	if e := mustEnsureWorker(t, rt, org); !e.Cold {
		t.Fatalf("the next ensure: %+v", e)
	}
}
