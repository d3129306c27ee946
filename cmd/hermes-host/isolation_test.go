package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"hermeshost/pg/pgtest"
)

// runDispatcherBriefly runs `hermes-host dispatcher` with a minimal environment plus env
// and returns its exit error and stderr; one that keeps running past a few seconds is
// stopped and reported as started.
func runDispatcherBriefly(t *testing.T, env ...string) (started bool, stderr string) {
	t.Helper()
	// A database it can use: the dispatcher holds its instance's lease before it opens the
	// runtime.
	dbURL, _ := pgtest.Schema(t)
	cmd := exec.Command(binary, "dispatcher")
	cmd.Env = append([]string{"DATABASE_URL=" + dbURL, "SARTIQ_API_URL=http://127.0.0.1:9",
		"SARTIQ_BOT_TOKEN=bot-token-for-this-test", "GATEWAY_URL=http://127.0.0.1:9", "GATEWAY_KEY=host-key-for-this-test",
		"GATEWAY_SECRET=gateway-secret-for-this-test", "ORGS_ROOT=" + t.TempDir(), "CONTROL_ADDR=127.0.0.1:0",
		"DOCKER_HOST=unix:///nonexistent/docker.sock"}, env...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("the dispatcher exited 0:\n%s", errb.String())
		}
		return false, errb.String()
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return true, errb.String()
	}
}

// refusal is the dispatcher's one-line error, its last line.
func refusal(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	return lines[len(lines)-1]
}

// A production dispatcher does not run orgs unisolated unless told to: not on a process
// runtime without a sandbox, and not on the one auto picks when no engine answers and
// bubblewrap is missing; it says why on one line naming HERMES_ALLOW_UNISOLATED.
func TestTheDispatcherRefusesToRunOrgsUnisolated(t *testing.T) {
	for name, env := range map[string][]string{
		"process without sandbox": {"PATH=" + os.Getenv("PATH"), "HERMES_RUNTIME=process", "HERMES_SANDBOX=none"},
		// No bwrap on this PATH.
		"auto without engine or bubblewrap": {"PATH=/nonexistent", "HERMES_RUNTIME=auto"},
	} {
		t.Run(name, func(t *testing.T) {
			started, stderr := runDispatcherBriefly(t, env...)
			if started {
				t.Fatalf("the dispatcher started:\n%s", stderr)
			}
			line := refusal(stderr)
			if !strings.HasPrefix(line, "hermes-host dispatcher: config: HERMES_ALLOW_UNISOLATED: refusing to start: orgs are not isolated") ||
				!strings.Contains(line, "HERMES_ALLOW_UNISOLATED=true") {
				t.Fatalf("refusal %q, want one line naming HERMES_ALLOW_UNISOLATED:\n%s", line, stderr)
			}
			if name == "auto without engine or bubblewrap" &&
				(!strings.Contains(line, "unix:///nonexistent/docker.sock") || !strings.Contains(line, "bubblewrap is not installed")) {
				t.Errorf("refusal %q names neither the engine that did not answer nor the missing bubblewrap", line)
			}
		})
	}
	// Allowed, it gets past the runtime, warning.
	_, stderr := runDispatcherBriefly(t, "PATH="+os.Getenv("PATH"), "HERMES_RUNTIME=process", "HERMES_SANDBOX=none",
		"HERMES_ALLOW_UNISOLATED=true")
	if strings.Contains(stderr, "refusing to start") || !strings.Contains(stderr, "running with orgs NOT isolated") {
		t.Fatalf("allowed, the dispatcher still refused or did not warn:\n%s", stderr)
	}
	if _, err := exec.LookPath("bwrap"); err == nil {
		// Sandboxed, nothing to refuse.
		_, stderr := runDispatcherBriefly(t, "PATH="+os.Getenv("PATH"), "HERMES_RUNTIME=process")
		if strings.Contains(stderr, "refusing to start") || strings.Contains(stderr, "NOT ISOLATED") {
			t.Fatalf("a sandboxed dispatcher refused or warned:\n%s", stderr)
		}
	}
}

// dev runs without a sandbox, saying so on stdout beside the launcher's address.
func TestDevPrintsThatOrgsAreNotIsolated(t *testing.T) {
	dev := startDev(t, t.TempDir(), "HERMES_RUNTIME=process", "HERMES_SANDBOX=none", "DOCKER_HOST=unix:///nonexistent/docker.sock")
	waitUntil(t, 20*time.Second, func() bool {
		return strings.Contains(dev.stdout.String(), "WARNING: ORGS ARE NOT ISOLATED FROM EACH OTHER")
	})
	out := dev.stdout.String()
	if !strings.Contains(out, "Launcher: ") || !strings.Contains(out, "bubblewrap") {
		t.Fatalf("dev's stdout:\n%s", out)
	}
}
