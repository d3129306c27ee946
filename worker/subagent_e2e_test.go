package worker_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"hermeshost/control"
	"hermeshost/lease"
	"hermeshost/pg/pgtest"
	"hermeshost/sartiq"
	"hermeshost/scriptedagent"
	"hermeshost/service"
	"hermeshost/subagent"
)

const controlSecret service.Secret = "test-control-secret-0123456789abcdef"

// controlAPI is the dispatcher's control API on a fresh schema, as org containers reach it.
type controlAPI struct {
	url  string
	subs *subagent.Store
}

func startControl(t *testing.T) controlAPI {
	t.Helper()
	_, pool := pgtest.Schema(t)
	leases := lease.New(pool, lease.Options{})
	t.Cleanup(leases.Close)
	subs := subagent.New(pool, subagent.Options{})
	t.Cleanup(subs.Close)
	s, err := control.NewServer(control.Config{DB: pool, Leases: leases, Subagents: subs, Secret: controlSecret})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return controlAPI{url: srv.URL, subs: subs}
}

func (c controlAPI) env(t *testing.T, org string) []string {
	t.Helper()
	key, err := control.Key(controlSecret, org)
	if err != nil {
		t.Fatal(err)
	}
	return []string{"CONTROL_URL=" + c.url, "CONTROL_KEY=" + key}
}

// An agent's child reports itself through the worker's hooks, is recorded as the running
// job's (the agent never names the job), hears an operator's message through its mailbox,
// acknowledges it and reports done; the job completes.
func TestSubagentHooksCarryAChildsLifeToTheControlAPI(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, kind string) {
		w := newWorld(t, kind)
		ctl := startControl(t)
		ctx := context.Background()
		w.knobs("acme", scriptedagent.Knobs{Subagent: &scriptedagent.SubagentKnob{
			ID: "researcher-1", Goal: "find the 2026 price list", Role: "researcher", WaitMS: 60000,
		}})
		job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
		claim, err := w.bot.Claim(ctx, job)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan result, 1)
		go func() { done <- w.execLive(ctx, "acme", claim, nil, live{env: ctl.env(t, "acme")}) }()

		var child subagent.Handle
		deadline := time.Now().Add(60 * time.Second)
		for {
			hs, err := ctl.subs.List(ctx, "acme", subagent.ListParams{Status: "live"})
			if err != nil {
				t.Fatal(err)
			}
			if len(hs) == 1 {
				child = hs[0]
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no live child of acme's agent after a minute: %+v", hs)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if child.ID != "researcher-1" || child.JobID != job || child.Role != "researcher" || child.ParentSession == "" {
			t.Fatalf("the child as recorded: %+v (want the running job's, with the agent's session as parent)", child)
		}
		// The operator's message, as the dashboard would send it.
		if _, err := ctl.subs.Send(ctx, "acme", child.ID, "operator:ada", "use the 2026 list"); err != nil {
			t.Fatal(err)
		}
		var r result
		select {
		case r = <-done:
		case <-time.After(2 * time.Minute):
			t.Fatal("the job did not finish after the child heard its message")
		}
		if r.err != nil || r.status.Code != 0 || r.outcome.Status != "completed" {
			t.Fatalf("worker: %v %v outcome %+v\n%s", r.err, r.status, r.outcome, r.stderr)
		}
		h, err := ctl.subs.Get(ctx, "acme", child.ID)
		if err != nil || h.Status != subagent.Done || h.Summary != "heard: use the 2026 list" || h.Pending != 0 {
			t.Fatalf("the child after the job: %+v, %v", h, err)
		}
		kinds := strings.Join(r.kinds(), " ")
		if !strings.Contains(kinds, "subagent_start") || !strings.Contains(kinds, "subagent_stop") {
			t.Fatalf("the job's progress does not show the child: %s", kinds)
		}
		if strings.Contains(r.stdout+r.stderr, ctl.env(t, "acme")[1][len("CONTROL_KEY="):]) {
			t.Fatal("the control key reached the worker's output")
		}
	})
}
