package dispatch_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"hermeshost/dispatch/runtime"
	"hermeshost/sartiq"
)

// sandboxProbe is what a hostile agent on the sandboxed process runtime tries before it
// hands over to the scripted agent; it appends what it reached to reached.txt in its home.
const sandboxProbe = `out="$HERMES_HOME/reached.txt"
say() { printf '%s\n' "$1" >> "$out"; }
say "run uid $(id -u)"
orgs=$(dirname "$HERMES_HOME")
cat "$orgs/globex/SOUL.md" >/dev/null 2>&1 && say "read globex's SOUL.md"
ls "$orgs" 2>/dev/null | grep -q globex && say "listed globex's home"
cat /proc/DISPATCHER_PID/environ >/dev/null 2>&1 && say "read the dispatcher's environment"
cat /proc/$PPID/environ >/dev/null 2>&1 && say "read the worker's environment"
for p in /proc/[0-9]*; do
	cmd=$(tr '\0\n' '  ' < $p/cmdline 2>/dev/null)
	grep -qa -e DATABASE_URL -e CONTROL_KEY -e SARTIQ_TOKEN $p/environ 2>/dev/null && say "read secrets of $cmd"
	case "$cmd" in *dispatch.test*|*postgres*|*"worker idle"*) say "saw host process $cmd";; esac
done
root=$(dirname "$orgs")
for f in /etc/evil /usr/evil "$root/evil" "$orgs/evil" "$orgs/globex/evil" "$root/workspaces/evil" "$root/workspaces/globex/evil"; do
	(echo x > "$f") 2>/dev/null && say "wrote $f"
done
setsid nohup sh -c "sleep 600; echo MARKER" >/dev/null 2>&1 &
sleep 0.2
grep -l MARKER /proc/[0-9]*/cmdline >/dev/null 2>&1 && say "detached a process"
say "handed over"
exec scripted-agent "$@"`

// hostMarked counts the host's processes whose command line holds marker (bubblewrap's
// own, which carry the agent's, aside).
func hostMarked(t *testing.T, marker string) int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	n := 0
	for _, dir := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err == nil && strings.Contains(string(cmdline), marker) && !strings.Contains(string(cmdline), "bwrap") {
			n++
		}
	}
	return n
}

// A hostile agent on the sandboxed process runtime, end to end through the real worker:
// it reaches nothing of globex's, of the dispatcher's or the worker's environment, of the
// host's processes or of the file system outside its own home and workspace, runs as a
// non-root uid, and the process it detaches is gone before acme's next job starts and
// after the runtime closes. Its jobs still complete.
func TestAHostileAgentIsContainedBySandbox(t *testing.T) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI is set, so sandbox tests must run: install bubblewrap")
		}
		t.Skip("bubblewrap is not installed")
	}
	f := newFixture(t, true)
	if err := runtime.Unisolated(f.cfg.Runtime); err != nil {
		t.Fatalf("the fixture's process runtime is not sandboxed: %v", err)
	}
	f.cfg.ClaimEnabled = true
	marker := "left-behind-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	f.cfg.WorkerEnv = append(f.cfg.WorkerEnv, "HERMES_BIN="+hostileAgent(t, strings.NewReplacer("DISPATCHER_PID", strconv.Itoa(os.Getpid()), "MARKER", marker).Replace(sandboxProbe)))
	if err := os.WriteFile(filepath.Join(f.cfg.OrgsRoot, "globex", "SOUL.md"), []byte("globex's soul\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := f.dispatcher(t)
	for cycles := 0; ; cycles++ {
		st := f.statuses(t)
		if st[sartiq.StatusQueued]+st[sartiq.StatusClaimed]+st[sartiq.StatusRunning] == 0 {
			break
		}
		if cycles == 10 {
			t.Fatalf("jobs still queued or running after 10 cycles: %v", st)
		}
		if _, err := d.Cycle(t.Context()); err != nil {
			t.Fatal(err)
		}
		d.Wait()
		// The run is over: what it detached is gone before the org's next job can start.
		if n := hostMarked(t, marker); n != 0 {
			t.Fatalf("%d processes acme's agent detached outlived its job", n)
		}
	}
	if st := f.statuses(t); st[sartiq.StatusCompleted] != 4 {
		t.Errorf("want every job completed: %v", st)
	}
	if err := f.cfg.Runtime.Close(); err != nil {
		t.Fatal(err)
	}
	if n := hostMarked(t, marker); n != 0 {
		t.Fatalf("%d processes acme's agent detached outlived the runtime", n)
	}

	data, err := os.ReadFile(filepath.Join(f.cfg.OrgsRoot, "acme", "reached.txt"))
	if err != nil {
		t.Fatal(err)
	}
	reached := string(data)
	t.Logf("acme's agent reached:\n%s", reached)
	if strings.Count(reached, "handed over") != 2 || strings.Count(reached, "detached a process") != 2 {
		t.Fatalf("the probe did not run through in both of acme's jobs (it must detach each time):\n%s", reached)
	}
	for _, line := range strings.Split(strings.TrimSpace(reached), "\n") {
		switch {
		case line == "handed over", line == "detached a process":
		case strings.HasPrefix(line, "run uid "):
			if uid := strings.TrimPrefix(line, "run uid "); uid == "0" {
				t.Error("the agent ran as root")
			}
		default:
			t.Errorf("the sandboxed agent reached: %s", line)
		}
	}
}
