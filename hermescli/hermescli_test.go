package hermescli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestArgsAreTheHeadlessContract(t *testing.T) {
	got := Args("do it", 30, "")
	want := []string{"chat", "-q", "do it", "-Q", "--source", "tool", "--max-turns", "30"}
	if !slices.Equal(got, want) {
		t.Fatalf("args %q", got)
	}
	got = Args("go on", 5, "20261203_141812_7c2bfe")
	if !slices.Equal(got[len(got)-2:], []string{"--resume", "20261203_141812_7c2bfe"}) || slices.Contains(got, "--ignore-rules") {
		t.Fatalf("resume args %q", got)
	}
}

// write sends text in small pieces, as a pipe may deliver it.
func write(w io.Writer, text string) {
	for len(text) > 0 {
		n := min(7, len(text))
		_, _ = w.Write([]byte(text[:n]))
		text = text[n:]
	}
}

func TestOutputReadsTheSessionLineAndTheTurnLimitLine(t *testing.T) {
	var o Output
	var passed bytes.Buffer
	write(o.Stdout(), "⚠ tirith security scanner disabled\n⚠️  Reached maximum iterations (3). Requesting summary...\n"+
		"So far I persisted tone and colors.\n{\"categories\": [\"tone\", \"colors\"]}\n")
	write(o.Stderr(&passed), "↻ Resumed session 20261203_141812_7c2bfe (4 messages)\nsession_id: 20261203_141812_7c2bfe")
	r := o.Result()
	if r.SessionID != "20261203_141812_7c2bfe" || !r.TurnLimit || r.StdoutCut {
		t.Fatalf("result %+v", r)
	}
	if !strings.HasSuffix(string(r.Stdout), "{\"categories\": [\"tone\", \"colors\"]}\n") {
		t.Fatalf("stdout %q", r.Stdout)
	}
	if !strings.Contains(passed.String(), "session_id: 20261203_141812_7c2bfe") {
		t.Fatalf("stderr not passed on: %q", passed.String())
	}
}

func TestOutputWithoutMarkers(t *testing.T) {
	var o Output
	write(o.Stdout(), "Done.\n{\"categories\": [\"tone\"]}\n")
	// A session line on stdout (the model's text, say) is not the CLI's.
	write(o.Stdout(), "session_id: 20990101_000000_ffffff\n")
	write(o.Stderr(nil), "session_id: not an id at all!\n")
	r := o.Result()
	if r.SessionID != "" || r.TurnLimit {
		t.Fatalf("result %+v", r)
	}
}

func TestOutputCutsAFlood(t *testing.T) {
	var o Output
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	for range 6 {
		_, _ = o.Stdout().Write(chunk)
	}
	r := o.Result()
	if !r.StdoutCut || len(r.Stdout) != MaxStdout {
		t.Fatalf("kept %d bytes, cut %v", len(r.Stdout), r.StdoutCut)
	}
}

// Every agent start gets only its home, the gateway key under KeyEnv and what its caller
// adds, never the caller's own environment; ending ctx kills the agent's whole group.
func TestLaunchGivesTheAgentOnlyWhatItNeeds(t *testing.T) {
	t.Setenv("HOST_ONLY_SECRET", "must-not-reach-the-agent")
	script := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nenv | sort\necho 'session_id: 20261203_141812_7c2bfe' >&2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	res, code, err := Launch{Bin: script, Home: home, GatewayKey: "hgw_acme_k", Dir: home, Env: []string{"EXTRA=1"}}.Run(t.Context(), nil)
	if err != nil || code != 0 || res.SessionID != "20261203_141812_7c2bfe" {
		t.Fatalf("%+v %d %v", res, code, err)
	}
	env := string(res.Stdout)
	for _, want := range []string{"HOME=" + home, "HERMES_HOME=" + home, KeyEnv + "=hgw_acme_k", "EXTRA=1"} {
		if !strings.Contains(env, want+"\n") {
			t.Errorf("the agent's environment lacks %s:\n%s", want, env)
		}
	}
	if strings.Contains(env, "HOST_ONLY_SECRET") || strings.Contains(env, "OPENAI_BASE_URL") {
		t.Fatalf("the agent got more than it needs:\n%s", env)
	}

	// A stop kills what the agent started too.
	marker := filepath.Join(t.TempDir(), "child.pid")
	long := filepath.Join(t.TempDir(), "long")
	if err := os.WriteFile(long, []byte("#!/bin/sh\nsleep 300 &\necho $! > "+marker+"\nwait\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	go func() { _, code, _ := (Launch{Bin: long, Home: home, Dir: home}).Run(ctx, nil); done <- code }()
	var pid int
	for deadline := time.Now().Add(30 * time.Second); pid == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the agent never started its child")
		}
		b, _ := os.ReadFile(marker)
		_, _ = fmt.Sscan(string(b), &pid)
	}
	cancel()
	if code := <-done; code != -1 {
		t.Fatalf("a stopped agent's code %d", code)
	}
	// The group was sent SIGKILL; the kernel ends the child a moment later (gone, or a zombie
	// until its new parent reaps it).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(b), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's child %d outlived the stop", pid)
		}
	}
}
