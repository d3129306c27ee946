package main

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"hermeshost/pg/pgtest"
)

// Two dispatchers under one HERMES_INSTANCE would adopt, sweep and remove each other's
// containers: the second refuses to start, naming the one that runs; once that one has
// stopped, the name is free again.
func TestASecondDispatcherUnderTheSameInstanceRefusesToStart(t *testing.T) {
	dbURL, _ := pgtest.Schema(t)
	orgs := t.TempDir()
	env := []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + dbURL, "SARTIQ_API_URL=http://127.0.0.1:9",
		"SARTIQ_BOT_TOKEN=bot-token-for-this-test", "GATEWAY_URL=http://127.0.0.1:9", "GATEWAY_KEY=host-key-for-this-test",
		"GATEWAY_SECRET=gateway-secret-for-this-test", "CLAIM_ENABLED=false", "ORGS_ROOT=" + orgs,
		"CONTROL_ADDR=127.0.0.1:0", "HERMES_RUNTIME=process", "HERMES_ALLOW_UNISOLATED=true",
		"DOCKER_HOST=unix:///nonexistent/docker.sock", "HERMES_INSTANCE=only-one"}
	dispatcher := func() *exec.Cmd {
		cmd := exec.Command(binary, "dispatcher")
		cmd.Env = env
		return cmd
	}
	first := dispatcher()
	if err := startPolling(t, first); err != nil {
		t.Fatal(err)
	}
	out, err := dispatcher().CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another dispatcher runs as HERMES_INSTANCE=only-one") ||
		!strings.Contains(string(out), "pid") {
		t.Fatalf("the second dispatcher: %v\n%s", err, out)
	}
	if err := first.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("the first dispatcher's stop: %v", err)
	}
	if err := startPolling(t, dispatcher()); err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
}
