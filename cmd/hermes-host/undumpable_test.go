package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"hermeshost/pg/pgtest"
)

// nobody is the uid the test runs processes as, so that another process of the same user
// is what reads them (an agent beside the dispatcher, on the process runtime).
const nobody = 65534

// asNobody is cmd running as nobody.
func asNobody(cmd *exec.Cmd) *exec.Cmd {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	return cmd
}

// readableBy says whether a process of nobody can read pid's environment.
func readableBy(t *testing.T, pid int) bool {
	t.Helper()
	return asNobody(exec.Command("cat", "/proc/"+strconv.Itoa(pid)+"/environ")).Run() == nil
}

// The dispatcher holds DATABASE_URL, the bot token and the secrets every org's keys come
// from: a process of its own user cannot read its environment (it is undumpable, as the
// worker and the dashboard are), while that user's ordinary processes' can be.
func TestTheDispatchersEnvironmentIsUnreadableToItsOwnUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the dispatcher and its reader as another user")
	}
	dbURL, _ := pgtest.Schema(t)
	// Not t.TempDir: its parent is 0700, and nobody must reach the binary.
	dir, err := os.MkdirTemp("", "undumpable-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "hermes-host")
	b, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	orgs := filepath.Join(dir, "orgs")
	if err := os.Mkdir(orgs, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(orgs, 0o777); err != nil {
		t.Fatal(err)
	}

	// The control: an ordinary process of nobody's, whose environment nobody can read.
	plain := asNobody(exec.Command("sleep", "30"))
	if err := plain.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = plain.Process.Kill(); _ = plain.Wait() }()
	if !readableBy(t, plain.Process.Pid) {
		t.Fatal("nobody cannot read its own plain process's environment: the check below would prove nothing")
	}

	cmd := asNobody(exec.Command(bin, "dispatcher"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + dbURL, "SARTIQ_API_URL=http://127.0.0.1:9",
		"SARTIQ_BOT_TOKEN=bot-token-for-this-test", "GATEWAY_URL=http://127.0.0.1:9", "GATEWAY_KEY=host-key-for-this-test",
		"GATEWAY_SECRET=gateway-secret-for-this-test", "CLAIM_ENABLED=false", "ORGS_ROOT=" + orgs,
		"CONTROL_ADDR=127.0.0.1:0", "HERMES_RUNTIME=process", "DOCKER_HOST=unix:///nonexistent/docker.sock"}
	if err := startPolling(t, cmd); err != nil {
		t.Fatal(err)
	}
	if readableBy(t, cmd.Process.Pid) {
		t.Fatal("a process of the dispatcher's own user read its environment (DATABASE_URL and the secrets)")
	}
}

// startPolling starts a dispatcher command and waits until it says it polls, stopping it
// (SIGTERM, waited for) when the test ends; an error when it exits or takes 30 s first,
// with what it wrote.
func startPolling(t *testing.T, cmd *exec.Cmd) error {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	up := make(chan struct{})
	var said strings.Builder
	var mu sync.Mutex
	go func() {
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			var ev struct {
				Msg string `json:"msg"`
			}
			if json.Unmarshal(lines.Bytes(), &ev) == nil && ev.Msg == "dispatcher polling" {
				close(up)
				break
			}
			mu.Lock()
			said.WriteString(lines.Text() + "\n")
			mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	select {
	case <-up:
		return nil
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		return fmt.Errorf("the dispatcher did not start polling within 30 s:\n%s", said.String())
	}
}
