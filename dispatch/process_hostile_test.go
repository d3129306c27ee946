package dispatch_test

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hermeshost/dispatch/runtime"
	"hermeshost/sartiq"
)

// The hostile-agent suite's limits on the sandboxed process runtime: the same agents as on
// Docker (hostileAgent: a shell script as HERMES_BIN, acme's hostile, the others' handing
// over to the scripted agent), in units bounded by limits.

// useSandboxedLimits swaps the fixture's runtime for a sandboxed process runtime bounded by
// limits, as a dispatcher opens it.
func useSandboxedLimits(t *testing.T, f *fixture, limits runtime.Limits) *runtime.Process {
	t.Helper()
	return useSandboxedWith(t, f, limits, nil)
}

// useSandboxedWith is useSandboxedLimits with each org's uid from users (nil: all as the
// sandbox's).
func useSandboxedWith(t *testing.T, f *fixture, limits runtime.Limits, users runtime.Users) *runtime.Process {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI is set, so the sandboxed runtime must be tested: install bubblewrap")
		}
		t.Skip("no bubblewrap: ", err)
	}
	root := filepath.Dir(f.cfg.OrgsRoot)
	rt, err := runtime.NewProcess(runtime.Config{
		Instance: "dispatch-test-limits", OrgsRoot: f.cfg.OrgsRoot, WorkspacesRoot: filepath.Join(root, "workspaces"),
		WorkerIdle: []string{"hermes-host", "worker", "idle"}, BinDir: binDir, Output: io.Discard,
		Logger: slog.New(slog.NewJSONHandler(f.logs, nil)), Services: f.services(t), Limits: limits,
		Sandbox: runtime.Sandbox{Mode: runtime.SandboxBwrap}, Users: users,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	f.cfg.Runtime = rt
	return rt
}

// hostProcessesWith counts the host's processes whose arguments, joined by spaces, hold
// marker.
func hostProcessesWith(t *testing.T, marker string) int {
	t.Helper()
	n := 0
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range dirs {
		raw, err := os.ReadFile(p)
		if err == nil && strings.Contains(strings.ReplaceAll(string(raw), "\x00", " "), marker) {
			n++
		}
	}
	return n
}

// A fork bomb the agent leaves detached is held at the unit's pids limit and ends with its
// job's sandbox: acme's attempts crash and fail at MAX_ATTEMPTS, globex's jobs complete,
// the host still forks, and nothing of the bomb is left on the host.
func TestAForkBombOnTheSandboxedProcessRuntimeIsHeldAndEnds(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the pids cgroup needs root")
	}
	f := newFixture(t, true)
	useSandboxedLimits(t, f, runtime.Limits{MemoryBytes: 512 << 20, Pids: 128})
	f.cfg.ClaimEnabled, f.cfg.MaxAttempts = true, 1
	const marker = "hermes-fork-bomb-marker"
	f.cfg.WorkerEnv = append(f.cfg.WorkerEnv, "HERMES_BIN="+hostileAgent(t,
		"setsid sh -c ': "+marker+"; while :; do (while :; do sleep 1; done) & done' >/dev/null 2>&1 </dev/null &\nsleep 5\nexit 7"))
	settle(t, f, 3*time.Minute)

	if st := f.jobsOf(t, "acme"); st[sartiq.StatusFailed] != 2 {
		t.Errorf("acme's jobs: %v, want both failed at MAX_ATTEMPTS=1", st)
	}
	for _, a := range acmeAttempts(t, f) {
		if a.Outcome == "completed" || a.Reason == "" {
			t.Errorf("acme attempt %+v, want an end with a reason", a)
		}
	}
	checkOthersCompleted(t, f)
	if n := hostProcessesWith(t, marker); n != 0 {
		t.Errorf("%d processes of the bomb are left on the host", n)
	}
	if !strings.Contains(f.logs.String(), `"pids_cgroup":`) {
		t.Errorf("the units started without a pids cgroup:\n%s", f.logs.String())
	}
}

// An agent that allocates past the unit's memory limit is killed; each attempt ends crashed
// with the reason "out of memory" and counts, so acme's jobs fail at MAX_ATTEMPTS; globex's
// complete beside it.
func TestAnAgentPastTheMemoryLimitOnTheSandboxedProcessRuntimeIsOutOfMemory(t *testing.T) {
	f := newFixture(t, true)
	useSandboxedLimits(t, f, runtime.Limits{MemoryBytes: 128 << 20, Pids: 256})
	f.cfg.ClaimEnabled, f.cfg.MaxAttempts = true, 1
	f.cfg.WorkerEnv = append(f.cfg.WorkerEnv, "HERMES_BIN="+hostileAgent(t, "echo allocating >&2\nexec dd if=/dev/zero of=/dev/null bs=512M count=1"))
	settle(t, f, 3*time.Minute)

	checkOutOfMemoryAtMaxAttempts(t, f)
}
