package runtime

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"hermeshost/internal/testio"

	"hermeshost/internal/unitnet"
)

// requireBwrap skips a sandbox test where bubblewrap is not installed, except under CI,
// which must run them.
func requireBwrap(tb testing.TB) {
	tb.Helper()
	if _, err := exec.LookPath("bwrap"); err == nil {
		return
	}
	if os.Getenv("CI") != "" {
		tb.Fatal("CI is set, so sandbox tests must run: install bubblewrap")
	}
	tb.Skip("sandbox tests skipped: bubblewrap (bwrap) is not installed")
}

// openSandboxed is a Process that must be sandboxed.
func openSandboxed(cfg Config) (*Process, error) {
	cfg.Sandbox.Mode = SandboxBwrap
	return NewProcess(cfg)
}

// hostile is a shell script run in org a's sandbox that tries what an agent turned
// hostile would and writes, one line each, what it reached to reached.txt in its home.
const hostile = `
out="$HOME/reached.txt"
: > "$out"
say() { printf '%s\n' "$1" >> "$out"; }
say "uid $(id -u) gid $(id -g)"
cat "$OTHER_HOME/SOUL.md" >/dev/null 2>&1 && say "read the other org's SOUL.md"
ls "$OTHER_HOME" >/dev/null 2>&1 && say "listed the other org's home"
ls "$ORGS_ROOT" >/dev/null 2>&1 && say "listed every org's home"
cat "/proc/$HOST_PID/environ" >/dev/null 2>&1 && say "read the host's environment"
cat "/proc/$WORKER_PID/environ" >/dev/null 2>&1 && say "read the worker's environment"
for p in /proc/[0-9]*; do
	say "process $(tr '\0\n' '  ' < $p/cmdline 2>/dev/null)"
done
for f in /evil /usr/evil /etc/evil "$ORGS_ROOT/evil" "$OTHER_HOME/evil" "$(dirname "$HOME")/../evil"; do
	(echo x > "$f") 2>/dev/null && say "wrote $f"
done
echo private > /tmp/sandbox-private-$MARKER && say "wrote its own /tmp"
cat "$HOME/host-written.txt" >/dev/null 2>&1 && say "read what the host wrote in its home"
echo x > "$HOME/SOUL.md" 2>/dev/null && say "rewrote its SOUL.md"
setsid nohup sh -c "sleep 600; echo $MARKER" >/dev/null 2>&1 &
sleep 0.2
grep -l "$MARKER" /proc/[0-9]*/cmdline >/dev/null 2>&1 && say "detached a process"
say "done"
`

// markedOnHost counts the host's processes whose command line holds marker.
func markedOnHost(t *testing.T, marker string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(hostCmdlines(t), "\n") {
		if strings.Contains(line, marker) && !strings.Contains(line, "bwrap") {
			n++
		}
	}
	return n
}

// A hostile exec in a sandbox reaches only its own org: not the other org's home, not
// the host's or the worker's environment, no host process, nothing outside its home to
// write; it runs as a non-root uid, and what it detached is gone when Exec returns.
func TestSandboxContainsAHostileExec(t *testing.T) {
	requireBwrap(t)
	cfg := testConfig(t, nil)
	p, err := openSandboxed(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.Unisolated(); err != nil {
		t.Fatalf("a sandboxed runtime says %v", err)
	}
	a, b := newOrg(t, cfg, "hostile-a"), newOrg(t, cfg, "hostile-b")
	aHome, bHome := filepath.Join(cfg.OrgsRoot, a), filepath.Join(cfg.OrgsRoot, b)
	worker := mustEnsureWorker(t, p, a)
	mustEnsureWorker(t, p, b)
	// Written by the host (root, 0600) after the worker started: the exec still reads it.
	if err := os.WriteFile(filepath.Join(aHome, "host-written.txt"), []byte("from the host"), 0o600); err != nil {
		t.Fatal(err)
	}
	marker := "detached-" + randomHex(6)
	env := []string{"OTHER_HOME=" + bHome, "ORGS_ROOT=" + cfg.OrgsRoot, "HOST_PID=" + strconv.Itoa(os.Getpid()),
		"WORKER_PID=" + worker.ID, "MARKER=" + marker}
	_, stderr, status := run(t, p, a, "", env, "/bin/sh", "-c", hostile)
	// Gone as soon as Exec returns, not eventually.
	if n := markedOnHost(t, marker); n != 0 {
		t.Errorf("%d detached processes outlived their exec", n)
	}
	if status.Code != 0 {
		t.Fatalf("the script exited %v: %s", status, stderr)
	}
	data, err := os.ReadFile(filepath.Join(aHome, "reached.txt"))
	if err != nil {
		t.Fatal(err)
	}
	reached := string(data)
	t.Logf("reached:\n%s", reached)
	if !strings.HasSuffix(reached, "done\n") || !strings.Contains(reached, "detached a process") ||
		!strings.Contains(reached, "wrote its own /tmp") || !strings.Contains(reached, "read what the host wrote") {
		t.Fatalf("the script did not run through (it must detach, write its /tmp and read its home):\n%s", reached)
	}
	wantUID := os.Geteuid()
	if wantUID == 0 {
		wantUID = DefaultSandboxUID
	}
	if !strings.HasPrefix(reached, fmt.Sprintf("uid %d gid ", wantUID)) || strings.HasPrefix(reached, "uid 0 ") {
		t.Errorf("the sandbox runs as %q, want uid %d", strings.SplitN(reached, "\n", 2)[0], wantUID)
	}
	for _, line := range strings.Split(strings.TrimSpace(reached), "\n") {
		switch {
		case strings.HasPrefix(line, "uid "), line == "done", line == "detached a process",
			line == "wrote its own /tmp", line == "read what the host wrote in its home":
		case strings.HasPrefix(line, "process "):
			// Only its own: bubblewrap's pid 1, the script, what it started.
			if cmd := strings.TrimPrefix(line, "process "); !strings.Contains(cmd, "bwrap") &&
				!strings.Contains(cmd, "sh -c") && !strings.Contains(cmd, "sleep") && !strings.HasPrefix(cmd, "tr ") && cmd != "" {
				t.Errorf("the exec saw a process not its own: %q", cmd)
			}
		default:
			t.Errorf("contained exec reached: %s", line)
		}
	}
	if strings.Contains(reached, "testagent idle") || strings.Contains(reached, ".test") {
		t.Error("the exec saw the worker or the host's processes")
	}
	if _, err := os.Stat(filepath.Join(os.TempDir(), "sandbox-private-"+marker)); err == nil {
		t.Error("the exec's /tmp is the host's")
	}
	if got, _ := os.ReadFile(filepath.Join(aHome, "SOUL.md")); !strings.HasPrefix(string(got), "soul of ") {
		t.Errorf("SOUL.md changed: %q", got)
	}
}

// Stop and Close take a unit's whole tree along, detached processes included.
func TestSandboxStopAndCloseKillWholeUnits(t *testing.T) {
	requireBwrap(t)
	cfg := testConfig(t, nil)
	workerMark, dashMark, execMark := "worker-"+randomHex(6), "dash-"+randomHex(6), "exec-"+randomHex(6)
	detachThen := func(marker, then string) []string {
		return []string{"/bin/sh", "-c", "setsid nohup sh -c 'sleep 600; echo " + marker + "' >/dev/null 2>&1 & exec " + then}
	}
	cfg.WorkerIdle = detachThen(workerMark, "sleep 600")
	p, err := openSandboxed(cfg)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			p.Close()
		}
	})
	org := newOrg(t, cfg, "trees")
	mustEnsureWorker(t, p, org)
	if _, err := p.EnsureDashboard(testContext(t), org, Dashboard{Args: detachThen(dashMark, "sleep 600")}); err != nil {
		t.Fatal(err)
	}
	execDone := make(chan error, 1)
	go func() {
		_, err := p.Exec(testContext(t), org, Command{Args: detachThen(execMark, "sleep 600")})
		execDone <- err
	}()
	waitMarked(t, workerMark, 1)
	waitMarked(t, dashMark, 1)
	waitMarked(t, execMark, 1)

	if err := p.Stop(testContext(t), org, RoleWorker); err != nil {
		t.Fatal(err)
	}
	if n := markedOnHost(t, workerMark); n != 0 {
		t.Errorf("%d processes the worker detached outlived its Stop", n)
	}
	if err := <-execDone; !errors.Is(err, ErrWorkerGone) {
		t.Errorf("exec in a stopped worker: %v, want ErrWorkerGone", err)
	}
	if n := markedOnHost(t, execMark); n != 0 {
		t.Errorf("%d processes an exec detached outlived its worker's Stop", n)
	}
	closed = true
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if n := markedOnHost(t, dashMark); n != 0 {
		t.Errorf("%d processes the dashboard detached outlived Close", n)
	}
}

func waitMarked(t *testing.T, marker string, want int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); markedOnHost(t, marker) != want; {
		if time.Now().After(deadline) {
			t.Fatalf("%d processes marked %s, want %d", markedOnHost(t, marker), marker, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Without a sandbox the runtime says so, and why; a sandbox that is required but missing
// is an error.
func TestUnsandboxedSaysSo(t *testing.T) {
	var logs testio.Buffer
	cfg := testConfig(t, &logs)
	cfg.Sandbox = Sandbox{Bwrap: "/nonexistent/bwrap"}
	p, err := NewProcess(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := Unisolated(p); err == nil || !strings.Contains(err.Error(), "bubblewrap is not installed") {
		t.Errorf("Unisolated = %v, want bubblewrap named", err)
	}
	if !strings.Contains(logs.String(), "ORGS ARE NOT ISOLATED") {
		t.Errorf("no warning logged:\n%s", logs.String())
	}

	cfg.Sandbox = Sandbox{Mode: SandboxNone}
	none, err := NewProcess(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer none.Close()
	if err := none.Unisolated(); err == nil || !strings.Contains(err.Error(), "turned off") {
		t.Errorf("Unisolated with mode none = %v", err)
	}

	cfg.Sandbox = Sandbox{Mode: SandboxBwrap, Bwrap: "/nonexistent/bwrap"}
	if p, err := NewProcess(cfg); err == nil {
		p.Close()
		t.Error("a required sandbox without bubblewrap opened")
	}
}

// auto with no engine answering may pick the process runtime, but an unsandboxed one
// says which engine did not answer and that bubblewrap is missing.
func TestDetectWithoutEngineOrSandboxSaysWhy(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	var logs testio.Buffer
	cfg := testConfig(t, &logs)
	cfg.Sandbox = Sandbox{Bwrap: "/nonexistent/bwrap"}
	rt, err := Detect(testContext(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	err = Unisolated(rt)
	if err == nil || !strings.Contains(err.Error(), "unix:///nonexistent/docker.sock") || !strings.Contains(err.Error(), "bubblewrap") {
		t.Fatalf("Unisolated after Detect = %v; want the engine and bubblewrap named", err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("the reason is not one line: %q", err)
	}
	if bwrapErr := exec.Command("bwrap", "--version").Run(); bwrapErr == nil {
		cfg.Sandbox = Sandbox{}
		rt, err := Detect(testContext(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		if err := Unisolated(rt); err != nil {
			t.Errorf("Detect picked an unsandboxed process runtime with bubblewrap installed: %v", err)
		}
	}
}

// On an isolated network (the default) a sandboxed program has a loopback of its own:
// what the host serves on its loopback is out of reach, and the host services it may use
// are the sockets of its org's folder, at unitnet.Dir. On the host's network it reaches the
// host's loopback.
func TestSandboxedUnitsHaveANetworkOfTheirOwn(t *testing.T) {
	requireBwrap(t)
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	go func() {
		for {
			c, err := host.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	for _, tc := range []struct {
		network, want string
	}{
		{"", host.Addr().String() + ": refused\n"},
		{NetworkHost, host.Addr().String() + ": connected\n"},
	} {
		cfg := testConfig(t, nil)
		cfg.Network = tc.network
		cfg.RunRoot = filepath.Join(t.TempDir(), "run")
		cfg.Services = map[string]http.Handler{"api": http.NotFoundHandler()}
		rt, err := openSandboxed(cfg)
		if err != nil {
			t.Fatal(err)
		}
		org := newOrg(t, cfg, "net"+tc.network)
		mustEnsureWorker(t, rt, org)
		if out, _, _ := run(t, rt, org, "", nil, "testagent", "dial", "tcp", host.Addr().String()); out != tc.want {
			t.Errorf("network %q: the host's loopback: %q, want %q", tc.network, out, tc.want)
		}
		socket := unitnet.Dir + "/api.sock"
		want := socket + ": connected\n"
		if tc.network == NetworkHost {
			want = socket + ": refused\n" // no sockets: the services are at their addresses
		}
		if out, _, _ := run(t, rt, org, "", nil, "testagent", "dial", "unix", socket); out != want {
			t.Errorf("network %q: the org's socket: %q, want %q", tc.network, out, want)
		}
		if got := rt.ServiceURL(org, "api"); (got != "") == (tc.network == NetworkHost) {
			t.Errorf("network %q: ServiceURL %q", tc.network, got)
		}
		rt.Close()
	}
}

// A sandboxed unit is held at its pids limit, whatever it forks: a hundred sleeps in a
// unit of 32 leave at most 32 processes in it (the shell forking them dies at the first
// refused fork), the cgroup counts the refusals, and the
// host starts processes as before.
func TestSandboxedUnitsAreHeldAtTheirPidsLimit(t *testing.T) {
	requireBwrap(t)
	if os.Geteuid() != 0 {
		t.Skip("the pids cgroup needs root")
	}
	cfg := testConfig(t, nil)
	cfg.Limits.Pids = 32
	rt, err := openSandboxed(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if rt.pids == nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI is set, so the pids limit must be tested, and no pids cgroup is writable here")
		}
		t.Skip("no writable pids cgroup here")
	}
	org := newOrg(t, cfg, "pids")
	mustEnsureWorker(t, rt, org)
	out, stderr, status := run(t, rt, org, "", nil, "/bin/sh", "-c",
		`(i=0; while [ $i -lt 100 ]; do sleep 30 & i=$((i+1)); done) 2>/dev/null; set -- /proc/[0-9]*; echo $#`)
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || n > 32 || n < 10 {
		t.Fatalf("%q processes in the unit (%v, stderr %q), want the bomb held under 32", out, status, stderr)
	}
	events, err := os.ReadFile(filepath.Join(rt.pids.dir(UnitName(org, RoleWorker)), "pids.events"))
	if err != nil || !strings.HasPrefix(string(events), "max ") || strings.TrimSpace(string(events)) == "max 0" {
		t.Errorf("pids.events %q (%v), want refusals counted", events, err)
	}
	if out, err := exec.Command("true").CombinedOutput(); err != nil {
		t.Errorf("the host cannot start a process: %v %s", err, out)
	}
}
