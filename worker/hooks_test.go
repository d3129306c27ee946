package worker_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"hermeshost/control"
	"hermeshost/subagent"
	"hermeshost/worker"
)

type hookClient struct {
	t  *testing.T
	hc *http.Client
}

func (c hookClient) do(method, path, body string) (int, map[string]any) {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, "http://hooks"+path, rd)
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// The hooks are the running job's: a child is recorded under the worker's job whatever the
// agent says, and a child of another job (or org) cannot be stopped, drained or acked.
func TestHookProxyKeepsTheAgentToItsOwnJobsChildren(t *testing.T) {
	ctl := startControl(t)
	ctx := context.Background()
	key, err := control.Key(controlSecret, "acme")
	if err != nil {
		t.Fatal(err)
	}
	client, err := control.NewClient(ctl.url, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []string
	socket := filepath.Join(t.TempDir(), "hooks.sock")
	p, err := worker.StartHookProxy(socket, client, "job-1", slog.New(slog.DiscardHandler), func(kind string, _ any) {
		mu.Lock()
		events = append(events, kind)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := hookClient{t: t, hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}}
	// Children that are not this job's: another job of acme's, and globex's.
	if _, _, err := ctl.subs.Start(ctx, "acme", subagent.Start{ID: "other-job-child", JobID: "job-2", Goal: "g"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ctl.subs.Start(ctx, "globex", subagent.Start{ID: "globex-child", JobID: "job-1", Goal: "g"}); err != nil {
		t.Fatal(err)
	}

	if code, body := c.do("POST", "/subagents", `{"id":"c1","goal":"g","job_id":"job-2"}`); code != http.StatusBadRequest {
		t.Fatalf("a start naming a job: %d %v, want 400 (the job is the worker's to say)", code, body)
	}
	code, body := c.do("POST", "/subagents", `{"id":"c1","goal":"look it up","parent_session":"s1"}`)
	if code != http.StatusCreated || body["job_id"] != "job-1" || body["org"] != "acme" {
		t.Fatalf("start: %d %v", code, body)
	}
	for _, path := range []string{"/subagents/other-job-child/stop", "/subagents/globex-child/stop"} {
		if code, body := c.do("POST", path, `{"status":"done"}`); code != http.StatusNotFound {
			t.Errorf("%s: %d %v, want 404", path, code, body)
		}
	}
	if code, _ := c.do("GET", "/subagents/other-job-child/mailbox", ""); code != http.StatusNotFound {
		t.Errorf("drain of another job's child: %d", code)
	}
	if code, _ := c.do("POST", "/subagents/other-job-child/mailbox/ack", `{"ids":[1]}`); code != http.StatusNotFound {
		t.Errorf("ack for another job's child: %d", code)
	}
	if code, _ := c.do("GET", "/subagents/c1/mailbox?wait_ms=abc", ""); code != http.StatusBadRequest {
		t.Errorf("a bad wait: %d", code)
	}
	// The operator cancels; the child's next drain says stop; its stop hook ends it cancelled.
	if _, err := ctl.subs.Cancel(ctx, "acme", "c1", "operator:ada", "not needed"); err != nil {
		t.Fatal(err)
	}
	code, body = c.do("GET", "/subagents/c1/mailbox?wait_ms=1000", "")
	if code != http.StatusOK || body["stop"] != true || body["cancel_reason"] != "not needed" {
		t.Fatalf("drain after the cancel: %d %v", code, body)
	}
	code, body = c.do("POST", "/subagents/c1/stop", `{"status":"done","summary":"stopped"}`)
	if code != http.StatusOK || body["status"] != subagent.Cancelled {
		t.Fatalf("stop: %d %v", code, body)
	}
	// A refusal of the control API passes through with its code.
	if code, body := c.do("POST", "/subagents/c1/stop", `{"status":"failed"}`); code != http.StatusConflict || body["error"] != control.CodeEnded {
		t.Fatalf("a second stop: %d %v", code, body)
	}
	for id, want := range map[string]string{"other-job-child": subagent.Running} {
		if h, _ := ctl.subs.Get(ctx, "acme", id); h.Status != want {
			t.Errorf("%s = %s, want %s", id, h.Status, want)
		}
	}
	if h, _ := ctl.subs.Get(ctx, "globex", "globex-child"); h.Status != subagent.Running {
		t.Errorf("globex's child = %s", h.Status)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(events, ",") != "subagent_start,subagent_stop" {
		t.Fatalf("events: %v", events)
	}
}
