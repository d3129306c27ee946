package runtime

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"hermeshost/internal/testio"

	"github.com/docker/docker/api/types/container"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// harness is what the shared cases need to know about one implementation beyond the
// Runtime interface: how to open it, and how to look at it from outside.
type harness struct {
	kind string
	// name sets apart harnesses of one kind; default kind.
	name string
	// sandboxed says whether each exec runs in a sandbox of its own, where it sees no
	// other process.
	sandboxed bool
	// available skips or fails the test when the implementation cannot run here.
	available func(t testing.TB)
	open      func(ctx context.Context, cfg Config) (Runtime, error)
	// isolatesHomes says whether an org's programs are confined to its own home.
	isolatesHomes bool
	// cancelEndsWorker says whether cancelling an exec takes the worker with it.
	cancelEndsWorker bool
	// homeInside is the org home's path as its programs see it.
	homeInside func(cfg Config, org string) string
	// kill kills a unit from outside the runtime and returns once it is dead.
	kill func(t *testing.T, rt Runtime, u Unit)
	// exposed gathers everything the engine or the OS shows about org's running units,
	// the image included, where no secret may appear.
	exposed func(t *testing.T, rt Runtime, cfg Config, org string) string
}

func harnesses() []harness {
	return []harness{
		{
			kind:             "docker",
			available:        requireEngine,
			open:             func(ctx context.Context, cfg Config) (Runtime, error) { return NewDocker(ctx, cfg) },
			isolatesHomes:    true,
			cancelEndsWorker: true,
			homeInside:       func(cfg Config, org string) string { return "/home/hermes" },
			kill:             killContainer,
			exposed:          dockerExposed,
		},
		{
			kind:          "process",
			name:          "process-sandboxed",
			sandboxed:     true,
			available:     requireBwrap,
			open:          func(ctx context.Context, cfg Config) (Runtime, error) { return openSandboxed(cfg) },
			isolatesHomes: true,
			homeInside:    func(cfg Config, org string) string { return filepath.Join(cfg.OrgsRoot, org) },
			kill:          killProcessGroup,
			exposed:       func(t *testing.T, rt Runtime, cfg Config, org string) string { return hostCmdlines(t) },
		},
		{
			kind:      "process",
			name:      "process-unsandboxed",
			available: func(testing.TB) {},
			open: func(ctx context.Context, cfg Config) (Runtime, error) {
				cfg.Sandbox.Mode = SandboxNone
				return NewProcess(cfg)
			},
			homeInside: func(cfg Config, org string) string { return filepath.Join(cfg.OrgsRoot, org) },
			kill:       killProcessGroup,
			exposed:    func(t *testing.T, rt Runtime, cfg Config, org string) string { return hostCmdlines(t) },
		},
	}
}

// The same cases run against every implementation.
var runtimeCases = []struct {
	name string
	run  func(t *testing.T, h harness)
}{
	{"EnsureIsIdempotent", testEnsureIsIdempotent},
	{"ExecStreamsStdinAndStdout", testExecStreams},
	{"SlowConsumerGetsTheLastLine", testSlowConsumer},
	{"ExitCodes", testExitCodes},
	{"CancelKillsEverythingTheExecStarted", testCancel},
	{"SecretsOnlyInExecEnvironment", testSecrets},
	{"WorkerKilledFromOutsideIsGone", testKilledFromOutside},
	{"OrgCannotSeeAnotherOrgsHome", testIsolation},
	{"MemoryLimitKillsAndSaysSo", testMemoryLimit},
	{"ReapStopsIdleAndRemovesExited", testReap},
	{"DashboardGetsSecretsOnStdin", testDashboard},
	{"RefusesBadOrgs", testRefusesBadOrgs},
}

func TestRuntimes(t *testing.T) {
	for _, h := range harnesses() {
		name := h.name
		if name == "" {
			name = h.kind
		}
		t.Run(name, func(t *testing.T) {
			h.available(t)
			for _, tc := range runtimeCases {
				t.Run(tc.name, func(t *testing.T) { tc.run(t, h) })
			}
		})
	}
}

// start opens a runtime for one test; cleanup stops everything it ran and closes it.
func (h harness) start(t *testing.T, cfg Config) Runtime {
	t.Helper()
	rt, err := h.open(t.Context(), cfg)
	if err != nil {
		t.Fatalf("open %s runtime: %v", h.kind, err)
	}
	if rt.Kind() != h.kind {
		t.Fatalf("Kind() = %q, want %q", rt.Kind(), h.kind)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		units, err := rt.List(ctx)
		if err != nil {
			t.Errorf("list at cleanup: %v", err)
		}
		for _, u := range units {
			if err := rt.Stop(ctx, u.Org, u.Role); err != nil {
				t.Errorf("stop %s at cleanup: %v", u.Name, err)
			}
		}
		if err := rt.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return rt
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// run execs args in org's worker with stdin and returns what it printed.
func run(t *testing.T, rt Runtime, org, stdin string, env []string, args ...string) (string, string, ExitStatus) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	status, err := rt.Exec(testContext(t), org, Command{
		Args: args, Env: env, Stdin: strings.NewReader(stdin), Stdout: &stdout, Stderr: &stderr,
	})
	if err != nil {
		t.Fatalf("exec %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), status
}

func mustEnsureWorker(t *testing.T, rt Runtime, org string) Ensured {
	t.Helper()
	e, err := rt.EnsureWorker(testContext(t), org)
	if err != nil {
		t.Fatalf("ensure worker %s: %v", org, err)
	}
	return e
}

func findUnit(t *testing.T, rt Runtime, name string) (Unit, bool) {
	t.Helper()
	units, err := rt.List(testContext(t))
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	for _, u := range units {
		if u.Name == name {
			return u, true
		}
	}
	return Unit{}, false
}

func testEnsureIsIdempotent(t *testing.T, h harness) {
	cfg := testConfig(t, nil)
	rt := h.start(t, cfg)
	org := newOrg(t, cfg, "idem")

	var wg sync.WaitGroup
	results := make([]Ensured, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Go(func() { results[i], errs[i] = rt.EnsureWorker(testContext(t), org) })
	}
	wg.Wait()
	cold := 0
	for i, e := range results {
		if errs[i] != nil {
			t.Fatalf("concurrent ensure: %v", errs[i])
		}
		if e.Cold {
			cold++
		}
		if e.ID != results[0].ID {
			t.Errorf("ensure %d gave unit %s, ensure 0 gave %s", i, e.ID, results[0].ID)
		}
	}
	if cold != 1 {
		t.Errorf("%d of 4 concurrent ensures started a worker, want exactly 1", cold)
	}
	again := mustEnsureWorker(t, rt, org)
	if again.Cold || again.ID != results[0].ID {
		t.Errorf("ensure of a running worker = %+v, want warm %s", again, results[0].ID)
	}
	u, ok := findUnit(t, rt, UnitName(org, RoleWorker))
	if !ok || !u.Running || u.Org != org || u.Role != RoleWorker || u.ID != results[0].ID {
		t.Errorf("List shows %+v (found %v), want the running worker %s", u, ok, results[0].ID)
	}
	if got := testutil.ToFloat64(cfg.Metrics.ensures.WithLabelValues(h.kind, "worker", "cold")); got != 1 {
		t.Errorf("cold ensures counted %v, want 1", got)
	}
	if got := testutil.ToFloat64(cfg.Metrics.ensures.WithLabelValues(h.kind, "worker", "warm")); got != 4 {
		t.Errorf("warm ensures counted %v, want 4", got)
	}
}

func testExecStreams(t *testing.T, h harness) {
	cfg := testConfig(t, nil)
	rt := h.start(t, cfg)
	org := newOrg(t, cfg, "stream")
	mustEnsureWorker(t, rt, org)

	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	stdoutR, stdoutW := io.Pipe()
	var stderr testio.Buffer
	type result struct {
		status ExitStatus
		err    error
	}
	done := make(chan result, 1)
	go func() {
		status, err := rt.Exec(testContext(t), org, Command{
			Args: []string{"testagent", "echo"}, Stdin: stdinR, Stdout: stdoutW, Stderr: &stderr,
		})
		stdoutW.Close()
		done <- result{status, err}
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		scanner := bufio.NewScanner(stdoutR)
		for scanner.Scan() {
			lines <- scanner.Text()
		}
	}()

	for _, want := range []string{"first line", "second line"} {
		if _, err := io.WriteString(stdinW, want+"\n"); err != nil {
			t.Fatalf("write stdin: %v", err)
		}
		select {
		case got := <-lines:
			if got != want {
				t.Fatalf("stdout line %q, want %q", got, want)
			}
		case r := <-done:
			t.Fatalf("exec ended (%v, %v) before its output arrived", r.status, r.err)
		case <-testContext(t).Done():
			t.Fatal("no output while the exec runs")
		}
	}
	select {
	case r := <-done:
		t.Fatalf("exec ended (%v, %v) while its stdin was open", r.status, r.err)
	default:
	}
	stdinW.Close()
	r := <-done
	if r.err != nil || r.status.Code != 0 {
		t.Fatalf("exec = %v, %v; want exit 0", r.status, r.err)
	}
	for range lines {
		t.Error("output after stdin closed")
	}
	if !strings.Contains(stderr.String(), "testagent: echo done") {
		t.Errorf("stderr %q lacks the agent's line", stderr.String())
	}
}

// An exec whose consumer is slow (the dispatcher mirrors each line in a transaction of
// its own, slow on a saturated machine) still delivers every line its program wrote
// before it exited: the last one is a run's outcome. The consumer takes the first line and
// then stays busy with it for longer than the runtime waits on an idle pipe after an exit,
// while the program writes its last line and ends.
func testSlowConsumer(t *testing.T, h harness) {
	cfg := testConfig(t, nil)
	rt := h.start(t, cfg)
	org := newOrg(t, cfg, "slow")
	mustEnsureWorker(t, rt, org)

	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	got := &slowWriter{first: make(chan struct{}), hold: outputDrainWait + 2*time.Second}
	done := make(chan error, 1)
	go func() {
		status, err := rt.Exec(testContext(t), org, Command{Args: []string{"testagent", "echo"}, Stdin: stdinR, Stdout: got})
		if err == nil && status.Code != 0 {
			err = fmt.Errorf("exit %v", status)
		}
		done <- err
	}()
	if _, err := io.WriteString(stdinW, "first\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got.first:
	case err := <-done:
		t.Fatalf("exec ended (%v) before its first line arrived", err)
	case <-testContext(t).Done():
		t.Fatal("no first line")
	}
	if _, err := io.WriteString(stdinW, "outcome\n"); err != nil {
		t.Fatal(err)
	}
	stdinW.Close()
	if err := <-done; err != nil {
		t.Fatalf("exec: %v", err)
	}
	if out := got.String(); out != "first\noutcome\n" {
		t.Fatalf("the consumer got %q, want both lines", out)
	}
}

// Unsandboxed, a process the program detached into a session of its own outlives it and
// may keep its output open: the exec still ends, soon after its program, with what the
// program wrote. (In a sandbox nothing outlives the exec.)
func TestProcessExecEndsWhenALeftoverHoldsItsOutput(t *testing.T) {
	var h harness
	for _, c := range harnesses() {
		if c.name == "process-unsandboxed" {
			h = c
		}
	}
	cfg := testConfig(t, nil)
	rt := h.start(t, cfg)
	org := newOrg(t, cfg, "held")
	mustEnsureWorker(t, rt, org)
	done := make(chan string, 1)
	go func() {
		out, _, status := run(t, rt, org, "", nil, "testagent", "detach", "held-"+randomHex(4), "hold")
		if status.Code != 0 {
			out = fmt.Sprintf("exit %v", status)
		}
		done <- out
	}()
	var out string
	select {
	case out = <-done:
	case <-time.After(outputDrainWait + 30*time.Second):
		t.Fatal("the exec did not end while a leftover held its output")
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("detach printed %q, not its child's pid", out)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Errorf("the leftover %d: %v", pid, err)
	}
}

// slowWriter takes its first write, says so, and stays in it for hold.
type slowWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	first chan struct{}
	hold  time.Duration
	once  sync.Once
}

func (w *slowWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.buf.Write(p)
	w.mu.Unlock()
	w.once.Do(func() {
		close(w.first)
		time.Sleep(w.hold)
	})
	return len(p), nil
}

func (w *slowWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func testExitCodes(t *testing.T, h harness) {
	cfg := testConfig(t, nil)
	rt := h.start(t, cfg)
	org := newOrg(t, cfg, "codes")

	_, err := rt.Exec(testContext(t), org, Command{Args: []string{"testagent", "echo"}})
	if !errors.Is(err, ErrNotRunning) {
		t.Errorf("exec before ensure: %v, want ErrNotRunning", err)
	}
	mustEnsureWorker(t, rt, org)
	for _, code := range []int{0, 3, 42} {
		out, _, status := run(t, rt, org, "ping\n", []string{"TESTAGENT_EXIT=" + strconv.Itoa(code)}, "testagent", "echo")
		if status.Code != code || status.OutOfMemory || out != "ping\n" {
			t.Errorf("exit %d: got %v with output %q", code, status, out)
		}
		if got := testutil.ToFloat64(cfg.Metrics.exitCodes.WithLabelValues(h.kind, strconv.Itoa(code))); got != 1 {
			t.Errorf("exit code %d counted %v times, want 1", code, got)
		}
	}
	_, stderr, status := run(t, rt, org, "", nil, "testagent", "cat", "no-such-file")
	if status.Code != 1 || !strings.Contains(stderr, "no-such-file") {
		t.Errorf("failing program: %v, stderr %q; want exit 1 naming the file", status, stderr)
	}
	if got := testutil.ToFloat64(cfg.Metrics.execs.WithLabelValues(h.kind, outcomeExited)); got != 4 {
		t.Errorf("exited execs counted %v, want 4", got)
	}
	// A program that never started is not an exit status: the caller may run it again.
	_, err = rt.Exec(testContext(t), org, Command{Args: []string{"no-such-program"}, Stdin: strings.NewReader("x")})
	if !errors.Is(err, ErrNotStarted) || !strings.Contains(err.Error(), "no-such-program") {
		t.Errorf("exec of a program that does not exist: %v, want ErrNotStarted naming it", err)
	}
	if got := testutil.ToFloat64(cfg.Metrics.execs.WithLabelValues(h.kind, outcomeNotStarted)); got != 1 {
		t.Errorf("execs not started counted %v, want 1", got)
	}
	// The worker is still there for the next program.
	if out, _, status := run(t, rt, org, "again\n", nil, "testagent", "echo"); status.Code != 0 || out != "again\n" {
		t.Errorf("exec after one that did not start: %v, output %q", status, out)
	}
}

func testCancel(t *testing.T, h harness) {
	cfg := testConfig(t, nil)
	rt := h.start(t, cfg)
	org := newOrg(t, cfg, "cancel")
	first := mustEnsureWorker(t, rt, org)

	tag := "tree-" + randomHex(4)
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	stdoutR, stdoutW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := rt.Exec(ctx, org, Command{Args: []string{"testagent", "tree", tag}, Stdout: stdoutW})
		stdoutW.Close()
		done <- err
	}()
	// The tree prints its child's pid once the child runs: both are up.
	if _, err := bufio.NewReader(stdoutR).ReadString('\n'); err != nil {
		t.Fatalf("tree never reported its child: %v", err)
	}
	want := 2
	if h.sandboxed {
		want += 2 // bubblewrap and the sandbox's pid 1 carry the command line too
	}
	if got := processesTagged(t, tag); got != want {
		t.Fatalf("%d processes tagged %s before cancel, want %d", got, tag, want)
	}
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled exec returned %v, want context.Canceled", err)
	}
	if got := processesTagged(t, tag); got != 0 {
		t.Errorf("%d processes tagged %s linger after cancel", got, tag)
	}
	if got := testutil.ToFloat64(cfg.Metrics.execs.WithLabelValues(h.kind, outcomeCanceled)); got != 1 {
		t.Errorf("cancelled execs counted %v, want 1", got)
	}

	next := mustEnsureWorker(t, rt, org)
	if next.Cold != h.cancelEndsWorker || (next.ID == first.ID) == h.cancelEndsWorker {
		t.Errorf("ensure after cancel = %+v (first %s); a fresh worker expected: %v", next, first.ID, h.cancelEndsWorker)
	}
	if out, _, status := run(t, rt, org, "again\n", nil, "testagent", "echo"); out != "again\n" || status.Code != 0 {
		t.Errorf("exec after cancel: %q, %v", out, status)
	}
}

func testSecrets(t *testing.T, h harness) {
	var logs testio.Buffer
	cfg := testConfig(t, &logs)
	rt := h.start(t, cfg)
	org := newOrg(t, cfg, "secret")
	mustEnsureWorker(t, rt, org)
	token := "job-token-" + randomHex(12)
	hostSecret := "host-secret-" + randomHex(12)
	t.Setenv("HERMES_RUNTIME_TEST_HOST_SECRET", hostSecret)
	env := []string{"SARTIQ_TOKEN=" + token}

	out, _, status := run(t, rt, org, "", env, "testagent", "env")
	if status.Code != 0 {
		t.Fatalf("env exited %v", status)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	cmdline := lines[len(lines)-1]
	if !strings.Contains(out, "SARTIQ_TOKEN="+token+"\n") {
		t.Fatalf("the exec's environment lacks the token; printed:\n%s", out)
	}
	if strings.Contains(cmdline, token) {
		t.Errorf("token in the exec's command line %q", cmdline)
	}
	if strings.Contains(out, hostSecret) {
		t.Error("the host's own environment reached the exec")
	}
	if !strings.Contains(out, "HERMES_HOME="+h.homeInside(cfg, org)+"\n") {
		t.Errorf("HERMES_HOME is not the org's home; printed:\n%s", out)
	}

	// While an exec holding the token runs, nothing outside its environment shows it.
	stdinR, stdinW := io.Pipe()
	stdoutR, stdoutW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := rt.Exec(testContext(t), org, Command{Args: []string{"testagent", "echo"}, Env: env, Stdin: stdinR, Stdout: stdoutW})
		stdoutW.Close()
		done <- err
	}()
	if _, err := io.WriteString(stdinW, "up\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(stdoutR).ReadString('\n'); err != nil {
		t.Fatalf("echo holding the token did not start: %v", err)
	}
	inside, _, _ := run(t, rt, org, "", nil, "testagent", "cmdlines")
	switch {
	case h.sandboxed && strings.Contains(inside, "testagent echo"):
		t.Fatalf("an exec sees another one running in its own sandbox:\n%s", inside)
	case h.sandboxed && !strings.Contains(inside, "testagent cmdlines"):
		t.Fatalf("the process list seen from inside misses the exec itself:\n%s", inside)
	case !h.sandboxed && !strings.Contains(inside, "testagent echo"):
		t.Fatalf("the process list seen from inside misses the running exec:\n%s", inside)
	}
	exposed := h.exposed(t, rt, cfg, org)
	for what, text := range map[string]string{"process list inside": inside, "outside views": exposed, "logs": logs.String()} {
		if strings.Contains(text, token) {
			t.Errorf("token found in %s", what)
		}
	}
	stdinW.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func testKilledFromOutside(t *testing.T, h harness) {
	cfg := testConfig(t, nil)
	rt := h.start(t, cfg)
	org := newOrg(t, cfg, "killed")
	first := mustEnsureWorker(t, rt, org)

	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	stdoutR, stdoutW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := rt.Exec(testContext(t), org, Command{Args: []string{"testagent", "echo"}, Stdin: stdinR, Stdout: stdoutW})
		stdoutW.Close()
		done <- err
	}()
	if _, err := io.WriteString(stdinW, "up\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(stdoutR).ReadString('\n'); err != nil {
		t.Fatalf("exec did not start: %v", err)
	}
	h.kill(t, rt, first.Unit)
	if err := <-done; !errors.Is(err, ErrWorkerGone) {
		t.Errorf("exec in a killed worker returned %v, want ErrWorkerGone", err)
	}
	if u, ok := findUnit(t, rt, first.Name); ok && u.Running {
		t.Errorf("List reports the killed worker as running: %+v", u)
	}
	next := mustEnsureWorker(t, rt, org)
	if !next.Cold || next.ID == first.ID {
		t.Errorf("ensure after the kill = %+v, want a fresh worker (old %s)", next, first.ID)
	}
	if out, _, _ := run(t, rt, org, "fresh\n", nil, "testagent", "echo"); out != "fresh\n" {
		t.Errorf("exec in the fresh worker printed %q", out)
	}
}

func testIsolation(t *testing.T, h harness) {
	if !h.isolatesHomes {
		t.Skipf("the %s runtime runs every org as the host's user: only docker and a sandbox isolate homes", h.kind)
	}
	cfg := testConfig(t, nil)
	rt := h.start(t, cfg)
	a, b := newOrg(t, cfg, "iso-a"), newOrg(t, cfg, "iso-b")
	bHome := filepath.Join(cfg.OrgsRoot, b)
	if err := os.WriteFile(filepath.Join(bHome, "private.txt"), []byte("b only"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.OrgsRoot, a, "mine.txt"), []byte("a's"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustEnsureWorker(t, rt, a)
	mustEnsureWorker(t, rt, b)
	home := h.homeInside(cfg, a)

	// What a sees of its own home proves the probes below could succeed.
	if out, _, status := run(t, rt, a, "", nil, "testagent", "cat", home+"/mine.txt"); status.Code != 0 || out != "a's" {
		t.Fatalf("a cannot read its own home: %v %q", status, out)
	}
	for _, path := range []string{bHome, bHome + "/private.txt", home + "/../" + b + "/private.txt", cfg.OrgsRoot} {
		verb := "ls"
		if strings.HasSuffix(path, ".txt") {
			verb = "cat"
		}
		out, _, status := run(t, rt, a, "", nil, "testagent", verb, path)
		if status.Code == 0 || strings.Contains(out, "b only") || strings.Contains(out, "private.txt") {
			t.Errorf("%s %s from org a: %v, printed %q; want a failure", verb, path, status, out)
		}
	}
	if _, _, status := run(t, rt, a, "forged", nil, "testagent", "write", home+"/SOUL.md"); status.Code == 0 {
		t.Error("org a rewrote its SOUL.md, which is mounted read-only")
	}
	if _, _, status := run(t, rt, a, "note", nil, "testagent", "write", home+"/note.txt"); status.Code != 0 {
		t.Errorf("org a cannot write its home: %v", status)
	}
	if got, err := os.ReadFile(filepath.Join(cfg.OrgsRoot, a, "note.txt")); err != nil || string(got) != "note" {
		t.Errorf("a's write did not land in its home on the host: %q, %v", got, err)
	}
}

func testMemoryLimit(t *testing.T, h harness) {
	cfg := testConfig(t, nil)
	cfg.Limits.MemoryBytes = 64 << 20
	rt := h.start(t, cfg)
	org := newOrg(t, cfg, "oom")
	mustEnsureWorker(t, rt, org)

	if _, _, status := run(t, rt, org, "", nil, "testagent", "alloc", "8"); status.Code != 0 || status.OutOfMemory {
		t.Fatalf("alloc within the limit: %v", status)
	}
	// Without the limit the agent would hold 512 MiB until stdin closes, which is only at
	// the end of this test.
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	status, err := rt.Exec(testContext(t), org, Command{Args: []string{"testagent", "alloc", "512"}, Stdin: stdinR})
	if err != nil {
		t.Fatalf("alloc past the limit: %v", err)
	}
	if !status.OutOfMemory || status.Code != 137 || status.String() != "killed: out of memory" {
		t.Errorf("alloc past the limit = %+v (%s), want killed: out of memory, exit 137", status, status)
	}
	if got := testutil.ToFloat64(cfg.Metrics.execs.WithLabelValues(h.kind, outcomeOutOfMemory)); got != 1 {
		t.Errorf("out-of-memory execs counted %v, want 1", got)
	}
	if e := mustEnsureWorker(t, rt, org); e.Cold {
		t.Error("the worker did not survive its exec's OOM kill")
	}
}

func testReap(t *testing.T, h harness) {
	cfg := testConfig(t, nil)
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg.Now = clock.Now
	cfg.IdleTimeout = time.Minute
	rt := h.start(t, cfg)
	idle, busy, dead := newOrg(t, cfg, "reap-idle"), newOrg(t, cfg, "reap-busy"), newOrg(t, cfg, "reap-dead")
	for _, org := range []string{idle, busy, dead} {
		mustEnsureWorker(t, rt, org)
	}
	run(t, rt, idle, "", nil, "testagent", "echo")

	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	stdoutR, stdoutW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := rt.Exec(testContext(t), busy, Command{Args: []string{"testagent", "echo"}, Stdin: stdinR, Stdout: stdoutW})
		stdoutW.Close()
		done <- err
	}()
	if _, err := io.WriteString(stdinW, "up\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(stdoutR).ReadString('\n'); err != nil {
		t.Fatalf("busy exec did not start: %v", err)
	}
	deadUnit, _ := findUnit(t, rt, UnitName(dead, RoleWorker))
	h.kill(t, rt, deadUnit)

	if got, err := rt.Reap(testContext(t)); err != nil || got != (Reaped{Exited: 1}) {
		t.Errorf("reap before the timeout = %+v, %v; want only the dead one", got, err)
	}
	clock.Advance(2 * time.Minute)
	if got, err := rt.Reap(testContext(t)); err != nil || got != (Reaped{Idle: 1}) {
		t.Errorf("reap after the timeout = %+v, %v; want only the idle one (the busy one runs an exec)", got, err)
	}
	units, err := rt.List(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(units) != 1 || units[0].Org != busy || !units[0].Running {
		t.Errorf("after reaping, List = %+v; want only %s running", units, busy)
	}
	stdinW.Close()
	if err := <-done; err != nil {
		t.Errorf("busy exec: %v", err)
	}
	for reason, want := range map[string]float64{"idle": 1, "exited": 1} {
		if got := testutil.ToFloat64(cfg.Metrics.reaped.WithLabelValues(h.kind, reason)); got != want {
			t.Errorf("reaped %s counted %v, want %v", reason, got, want)
		}
	}
}

func testDashboard(t *testing.T, h harness) {
	cfg := testConfig(t, nil)
	clock := &fakeClock{now: time.Now()}
	cfg.Now = clock.Now
	cfg.IdleTimeout = time.Minute
	rt := h.start(t, cfg)
	org := newOrg(t, cfg, "dash")
	secret := "gateway-key-" + randomHex(12)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dash := Dashboard{Args: []string{"testagent", "dashboard", ln.Addr().String()}, Secrets: []string{"GATEWAY_KEY=" + secret}}
	e, err := rt.EnsureDashboard(testContext(t), org, dash)
	if err != nil || !e.Cold || e.Name != "hermes-dash-"+org || e.Role != RoleDashboard {
		t.Fatalf("ensure dashboard = %+v, %v", e, err)
	}
	// The dashboard dials back once it has read its secrets: no polling for readiness.
	if err := ln.(*net.TCPListener).SetDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	conn, err := ln.Accept()
	if err != nil {
		t.Fatalf("the dashboard never reported: %v", err)
	}
	report, err := io.ReadAll(conn)
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(secret))
	if want := "GATEWAY_KEY " + hex.EncodeToString(sum[:]) + "\n"; string(report) != want {
		t.Errorf("dashboard received %q, want %q", report, want)
	}
	if strings.Contains(h.exposed(t, rt, cfg, org), secret) {
		t.Error("the dashboard's secret shows outside its stdin")
	}
	if again, err := rt.EnsureDashboard(testContext(t), org, dash); err != nil || again.Cold || again.ID != e.ID {
		t.Errorf("second ensure = %+v, %v; want the running dashboard", again, err)
	}
	clock.Advance(time.Hour)
	if got, err := rt.Reap(testContext(t)); err != nil || got != (Reaped{}) {
		t.Errorf("reap took %+v, %v; dashboards are not reaped for idleness", got, err)
	}
	if err := rt.Stop(testContext(t), org, RoleDashboard); err != nil {
		t.Fatal(err)
	}
	if u, ok := findUnit(t, rt, e.Name); ok {
		t.Errorf("dashboard still listed after Stop: %+v", u)
	}
	if err := rt.Stop(testContext(t), org, RoleDashboard); err != nil {
		t.Errorf("stopping a stopped dashboard: %v", err)
	}
}

func testRefusesBadOrgs(t *testing.T, h harness) {
	cfg := testConfig(t, nil)
	rt := h.start(t, cfg)
	for _, org := range []string{"", "../etc", "Upper", "-lead", "a/b", strings.Repeat("a", 64)} {
		if _, err := rt.EnsureWorker(testContext(t), org); !errors.Is(err, ErrInvalidOrg) {
			t.Errorf("EnsureWorker(%q) = %v, want ErrInvalidOrg", org, err)
		}
		if _, err := rt.Exec(testContext(t), org, Command{Args: []string{"testagent", "echo"}}); !errors.Is(err, ErrInvalidOrg) {
			t.Errorf("Exec(%q) = %v, want ErrInvalidOrg", org, err)
		}
		if err := rt.Stop(testContext(t), org, RoleWorker); !errors.Is(err, ErrInvalidOrg) {
			t.Errorf("Stop(%q) = %v, want ErrInvalidOrg", org, err)
		}
	}
	soulless := suite.runID + "-soulless"
	if err := os.MkdirAll(filepath.Join(cfg.OrgsRoot, soulless), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.EnsureWorker(testContext(t), soulless); !errors.Is(err, ErrNoSoul) {
		t.Errorf("ensure of a home without SOUL.md = %v, want ErrNoSoul", err)
	}
}

// processesTagged counts live processes on this host whose command line holds tag;
// containers of a local engine show here too.
func processesTagged(t *testing.T, tag string) int {
	n := 0
	for _, line := range strings.Split(hostCmdlines(t), "\n") {
		if strings.Contains(line, tag) {
			n++
		}
	}
	return n
}

// hostCmdlines lists the command line of every process on this host, one per line.
func hostCmdlines(t *testing.T) string {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, dir := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue // ended, or a zombie
		}
		b.WriteString(strings.ReplaceAll(string(cmdline), "\x00", " "))
		b.WriteByte('\n')
	}
	return b.String()
}

func killContainer(t *testing.T, rt Runtime, u Unit) {
	t.Helper()
	ctx := testContext(t)
	waited, errs := suite.engine.ContainerWait(ctx, u.ID, container.WaitConditionNotRunning)
	if err := suite.engine.ContainerKill(ctx, u.ID, "KILL"); err != nil {
		t.Fatalf("kill %s: %v", u.Name, err)
	}
	select {
	case <-waited:
	case err := <-errs:
		t.Fatalf("wait for %s to die: %v", u.Name, err)
	}
}

func killProcessGroup(t *testing.T, rt Runtime, u Unit) {
	t.Helper()
	p := rt.(*Process)
	p.mu.Lock()
	unit := p.units[u.Name]
	p.mu.Unlock()
	if unit == nil {
		t.Fatalf("%s is not a unit of the process runtime", u.Name)
	}
	if err := syscall.Kill(-unit.pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill process group %d: %v", unit.pid, err)
	}
	select {
	case <-unit.exited:
	case <-testContext(t).Done():
		t.Fatalf("%s did not die", u.Name)
	}
}

// dockerExposed is every view of org's containers the engine gives: inspect of the
// containers and their execs, the processes it lists in them, and the image's config,
// labels and history.
func dockerExposed(t *testing.T, rt Runtime, cfg Config, org string) string {
	t.Helper()
	ctx := testContext(t)
	var b strings.Builder
	dump := func(what string, v any) {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		fmt.Fprintf(&b, "%s: %s\n", what, data)
	}
	for _, role := range []Role{RoleWorker, RoleDashboard} {
		info, err := suite.engine.ContainerInspect(ctx, UnitName(org, role))
		if err != nil {
			continue // this org has no unit of that role
		}
		dump("container", info)
		for _, execID := range info.ExecIDs {
			if ei, err := suite.engine.ContainerExecInspect(ctx, execID); err == nil {
				dump("exec", ei)
			}
		}
		if top, err := suite.engine.ContainerTop(ctx, info.ID, nil); err == nil {
			dump("top", top)
		}
		if logs, err := suite.engine.ContainerLogs(ctx, info.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true}); err == nil {
			data, _ := io.ReadAll(logs)
			logs.Close()
			fmt.Fprintf(&b, "logs: %s\n", data)
		}
	}
	img, err := suite.engine.ImageInspect(ctx, cfg.WorkerImage)
	if err != nil {
		t.Fatalf("inspect image: %v", err)
	}
	dump("image", img)
	history, err := suite.engine.ImageHistory(ctx, cfg.WorkerImage)
	if err != nil {
		t.Fatalf("image history: %v", err)
	}
	dump("history", history)
	return b.String() + hostCmdlines(t)
}
