package worker_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"hermeshost/sartiq"
	"hermeshost/subagent"
)

// The children hermesplugin/testdata/fake_hermes_chat.py starts, with their session ids.
const (
	pluginParentSession = "20260102_101500_a1b2c3"
	pluginDone          = "sa-0-0d0e0f10"
	pluginFailed        = "sa-1-0d0e0f11"
	pluginMessaged      = "sa-0-0d0e0f12"
	pluginCancelled     = "sa-0-0d0e0f13"
)

// The host's Hermes plugin, loaded from the org's home by a stand-in for the Hermes process
// and called with Hermes' hook arguments, against the hook socket `worker run-job` serves:
// children are recorded as the job's and end as their hooks say, an operator's message
// reaches one tool result once and is acknowledged, and a cancel blocks the child's next
// tool call. Process runtime only: the Docker images are FROM scratch, without Python.
func TestPluginCarriesHermesHooksToTheWorkersHookSocket(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not on PATH: the plugin runs in Hermes' Python")
	}
	standIn, err := filepath.Abs("../hermesplugin/testdata/fake_hermes_chat.py")
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, "process")
	ctl := startControl(t)
	ctx := context.Background()
	// A product ingest with no writes completes on the stand-in's empty answer, so the
	// outcome says whether its tests passed (see the script).
	job := w.backend.DemoJob(t, "acme", sartiq.TypeProductIngest)
	claim, err := w.bot.Claim(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	env := append(ctl.env(t, "acme"), "HERMES_BIN="+standIn) // after run-job's own HERMES_BIN
	done := make(chan result, 1)
	go func() { done <- w.execLive(ctx, "acme", claim, nil, live{env: env}) }()

	// The stand-in polls for the message and the cancel; each is sent once its child exists.
	awaitChild := func(id string) {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			hs, err := ctl.subs.List(ctx, "acme", subagent.ListParams{JobID: job})
			if err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(hs, func(h subagent.Handle) bool { return h.ID == id }) {
				return
			}
			select {
			case r := <-done:
				t.Fatalf("the run ended before child %s started: %v %v outcome %+v\n%s", id, r.err, r.status, r.outcome, r.stderr)
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("no child %s of job %s after 90s: %+v", id, job, hs)
			}
		}
	}
	awaitChild(pluginMessaged)
	if _, err := ctl.subs.Send(ctx, "acme", pluginMessaged, "operator:ada", "use the 2026 list"); err != nil {
		t.Fatal(err)
	}
	awaitChild(pluginCancelled)
	if _, err := ctl.subs.Cancel(ctx, "acme", pluginCancelled, "operator:ada", "wrong supplier"); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the run did not end")
	}
	if !regexp.MustCompile(`(?m)^Ran 5 tests in .*\n\nOK$`).MatchString(r.stderr) {
		t.Fatalf("the plugin's end-to-end cases did not pass:\n%s", r.stderr)
	}
	if r.err != nil || r.status.Code != 0 || r.outcome.Status != "completed" {
		t.Fatalf("worker: %v %v outcome %+v\n%s", r.err, r.status, r.outcome, r.stderr)
	}

	get := func(id string) subagent.Handle {
		t.Helper()
		h, err := ctl.subs.Get(ctx, "acme", id)
		if err != nil {
			t.Fatal(err)
		}
		if h.JobID != job || h.ParentSession != pluginParentSession || h.Live() {
			t.Errorf("child %s as recorded: %+v (want job %s's, parent session %s, ended)", id, h, job, pluginParentSession)
		}
		return h
	}
	if h := get(pluginDone); h.Status != subagent.Done || h.Summary != strings.Repeat("r", subagent.MaxSummaryLen) ||
		h.Role != "leaf" || h.ParentSubagent != "" || h.Session != "20260102_101501_000001" {
		t.Errorf("the completed child (its summary clipped to the host's limit): %+v", h)
	}
	if h := get(pluginFailed); h.Status != subagent.Failed || h.Summary != "" || h.ParentSubagent != pluginDone {
		t.Errorf("the timed-out grandchild: %+v", h)
	}
	if h := get(pluginMessaged); h.Status != subagent.Done || h.Summary != "heard it" || h.Pending != 0 {
		t.Errorf("the messaged child: %+v", h)
	}
	ms, err := ctl.subs.Messages(ctx, "acme", pluginMessaged, 10)
	if err != nil || len(ms) != 1 || ms[0].AckedAt == nil {
		t.Errorf("the messaged child's mailbox: %+v, %v", ms, err)
	}
	if h := get(pluginCancelled); h.Status != subagent.Cancelled || h.CancelledBy != "operator:ada" ||
		h.CancelReason != "wrong supplier" || h.Summary != "stopped as asked" {
		t.Errorf("the cancelled child: %+v", h)
	}
	kinds := r.kinds()
	if n := countOf(kinds, "subagent_start"); n != 4 || countOf(kinds, "subagent_stop") != 4 {
		t.Errorf("the job's progress shows %d starts: %v", n, kinds)
	}
}

func countOf(s []string, v string) int {
	n := 0
	for _, e := range s {
		if e == v {
			n++
		}
	}
	return n
}
