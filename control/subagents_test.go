package control

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"hermeshost/subagent"
)

type body = map[string]any

func TestSubagentLifecycleThroughTheAPI(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := f.as(orgA)
	start := body{"id": "sa-1", "job_id": "job-1", "session_id": "s1", "parent_session": "s0", "goal": "read the catalogue", "role": "researcher"}
	a.POST("/v1/subagents").WithJSON(start).Expect().Status(http.StatusCreated).
		JSON().Object().HasValue("status", "running").HasValue("org", orgA).HasValue("goal", "read the catalogue")
	// The hook firing twice gets the same child back.
	a.POST("/v1/subagents").WithJSON(start).Expect().Status(http.StatusOK).JSON().Object().HasValue("id", "sa-1")
	start["goal"] = "another goal"
	a.POST("/v1/subagents").WithJSON(start).Expect().Status(http.StatusConflict).JSON().Object().HasValue("error", CodeConflict)

	// The operator's side (the dashboard) and the child's side, both through the client.
	c := f.client(f.key(orgA))
	m, err := c.SendSubagent(ctx, "sa-1", "operator:ada", "also check prices")
	if err != nil || m.ID == 0 || m.Body != "also check prices" {
		t.Fatalf("send = %+v, %v", m, err)
	}
	box, err := c.Mailbox(ctx, "sa-1", 0)
	if err != nil || box.Stop || len(box.Messages) != 1 || box.Messages[0].ID != m.ID {
		t.Fatalf("mailbox = %+v, %v", box, err)
	}
	// Unacknowledged, so handed out again.
	if box, err = c.Mailbox(ctx, "sa-1", 0); err != nil || len(box.Messages) != 1 || box.Messages[0].Deliveries != 2 {
		t.Fatalf("second mailbox = %+v, %v", box, err)
	}
	if n, err := c.Ack(ctx, "sa-1", []int64{m.ID}); err != nil || n != 1 {
		t.Fatalf("ack = %d, %v", n, err)
	}
	if box, err = c.Mailbox(ctx, "sa-1", 0); err != nil || len(box.Messages) != 0 {
		t.Fatalf("mailbox after the ack = %+v, %v", box, err)
	}
	d, err := c.Subagent(ctx, "sa-1")
	if err != nil || d.Subagent.Status != subagent.Running || len(d.Messages) != 1 || d.Messages[0].AckedAt == nil {
		t.Fatalf("detail = %+v, %v", d, err)
	}
	list, err := c.Subagents(ctx, subagent.ListParams{Status: "live"})
	if err != nil || len(list) != 1 || list[0].ID != "sa-1" {
		t.Fatalf("live list = %+v, %v", list, err)
	}

	// A waiting drain is answered by the cancel.
	type result struct {
		box subagent.Mailbox
		err error
	}
	waited := make(chan result, 1)
	go func() {
		box, err := c.Mailbox(ctx, "sa-1", 4*time.Second)
		waited <- result{box, err}
	}()
	h, err := c.CancelSubagent(ctx, "sa-1", "operator:ada", "wrong goal")
	if err != nil || h.Status != subagent.Cancelling || h.CancelledBy != "operator:ada" {
		t.Fatalf("cancel = %+v, %v", h, err)
	}
	if r := <-waited; r.err != nil || !r.box.Stop || r.box.CancelReason != "wrong goal" {
		t.Fatalf("drain during the cancel = %+v, %v", r.box, r.err)
	}
	a.POST("/v1/subagents/sa-1/messages").WithJSON(body{"sender": "operator:ada", "body": "late"}).
		Expect().Status(http.StatusConflict).JSON().Object().HasValue("error", CodeCancelling)
	h, err = c.StopSubagent(ctx, "sa-1", subagent.Done, "stopped early")
	if err != nil || h.Status != subagent.Cancelled || h.Summary != "stopped early" {
		t.Fatalf("stop = %+v, %v", h, err)
	}
	_, err = c.CancelSubagent(ctx, "sa-1", "operator:ada", "")
	if !IsEnded(err) {
		t.Fatalf("cancel of an ended child: %v", err)
	}
	a.POST("/v1/subagents/sa-1/messages").WithJSON(body{"sender": "operator:ada", "body": "late"}).
		Expect().Status(http.StatusConflict).JSON().Object().HasValue("error", CodeEnded)
	a.GET("/v1/subagents").WithQuery("status", "cancelled").Expect().Status(http.StatusOK).
		JSON().Object().Value("subagents").Array().Length().IsEqual(1)
}

func TestAnOrgsKeyCannotReachAnotherOrgsSubagents(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, _, err := f.subs.Start(ctx, orgB, subagent.Start{ID: "sa-b", JobID: "job-b", Goal: "globex's secret plan"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.subs.Send(ctx, orgB, "sa-b", "operator:gail", "globex only"); err != nil {
		t.Fatal(err)
	}
	before := f.snapshot()
	a := f.as(orgA)
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/v1/subagents/sa-b", ""},
		{"GET", "/v1/subagents/sa-b/mailbox", ""},
		{"POST", "/v1/subagents/sa-b/messages", `{"sender":"operator:ada","body":"hi"}`},
		{"POST", "/v1/subagents/sa-b/cancel", `{"actor":"operator:ada"}`},
		{"POST", "/v1/subagents/sa-b/stop", `{"status":"done"}`},
		{"POST", "/v1/subagents/sa-b/mailbox/ack", `{"ids":[1]}`},
	} {
		req := a.Request(r.method, r.path)
		if r.body != "" {
			req = req.WithHeader("Content-Type", "application/json").WithBytes([]byte(r.body))
		}
		obj := req.Expect().Status(http.StatusNotFound).JSON().Object()
		obj.HasValue("error", CodeNotFound)
		if s := obj.Value("message").String().Raw(); strings.Contains(s, "globex") {
			t.Errorf("%s %s: the refusal names the other org: %s", r.method, r.path, s)
		}
	}
	a.GET("/v1/subagents").Expect().Status(http.StatusOK).JSON().Object().Value("subagents").Array().IsEmpty()
	a.GET("/v1/subagents").WithQuery("job_id", "job-b").Expect().Status(http.StatusOK).
		JSON().Object().Value("subagents").Array().IsEmpty()
	// The caller cannot name an org: an org field is an unknown field.
	a.POST("/v1/subagents").WithJSON(body{"id": "sa-x", "goal": "g", "org": orgB}).Expect().Status(http.StatusBadRequest)
	// A start under A with B's child's id makes A's own child, never touches B's.
	a.POST("/v1/subagents").WithJSON(body{"id": "sa-b", "goal": "acme's"}).Expect().Status(http.StatusCreated).
		JSON().Object().HasValue("org", orgA)
	if h, err := f.subs.Get(ctx, orgB, "sa-b"); err != nil || h.Goal != "globex's secret plan" || h.Pending != 1 {
		t.Fatalf("globex's child after acme's calls: %+v, %v", h, err)
	}
	if n, err := f.subs.FailJob(ctx, orgA, "job-b", "x"); err != nil || n != 0 {
		t.Fatalf("FailJob across orgs = %d, %v", n, err)
	}
	if _, err := f.pool.Exec(ctx, `DELETE FROM subagents WHERE org = $1`, orgA); err != nil {
		t.Fatal(err)
	}
	if after := f.snapshot(); after != before {
		t.Fatalf("acme's calls changed globex's rows:\n%s\nthen\n%s", before, after)
	}
	// Without a key nothing is reachable at all.
	f.bearer("").GET("/v1/subagents").Expect().Status(http.StatusUnauthorized)
}

func TestBadSubagentInputIsRefusedAndWritesNothing(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, _, err := f.subs.Start(ctx, orgA, subagent.Start{ID: "sa-1", Goal: "g"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.subs.Send(ctx, orgA, "sa-1", "op", "queued"); err != nil {
		t.Fatal(err)
	}
	before := f.snapshot()
	a := f.as(orgA)
	const json = "application/json"
	sql := "x' OR '1'='1"
	cases := []refusal{
		{"start as text", "POST", "/v1/subagents", "text/plain", `{"id":"sa-2","goal":"g"}`, 415},
		{"start too large", "POST", "/v1/subagents", json, `{"id":"sa-2","goal":"` + strings.Repeat("g", MaxBody) + `"}`, 413},
		{"start without goal", "POST", "/v1/subagents", json, `{"id":"sa-2"}`, 400},
		{"start without id", "POST", "/v1/subagents", json, `{"goal":"g"}`, 400},
		{"start with a traversal id", "POST", "/v1/subagents", json, `{"id":"../sa","goal":"g"}`, 400},
		{"start with SQL in the id", "POST", "/v1/subagents", json, `{"id":"` + sql + `","goal":"g"}`, 400},
		{"start with a NUL goal", "POST", "/v1/subagents", json, `{"id":"sa-2","goal":"a\u0000"}`, 400},
		{"start with a bad job id", "POST", "/v1/subagents", json, `{"id":"sa-2","job_id":"a b","goal":"g"}`, 400},
		{"start with a huge goal", "POST", "/v1/subagents", json, `{"id":"sa-2","goal":"` + strings.Repeat("g", subagent.MaxGoalLen+1) + `"}`, 400},
		{"start with a status", "POST", "/v1/subagents", json, `{"id":"sa-2","goal":"g","status":"done"}`, 400},
		{"stop as cancelled", "POST", "/v1/subagents/sa-1/stop", json, `{"status":"cancelled"}`, 400},
		{"stop without a status", "POST", "/v1/subagents/sa-1/stop", json, `{"summary":"x"}`, 400},
		{"stop with a bad id", "POST", "/v1/subagents/" + url.PathEscape("a b") + "/stop", json, `{"status":"done"}`, 400},
		{"send without a body", "POST", "/v1/subagents/sa-1/messages", json, `{"sender":"op"}`, 400},
		{"send without a sender", "POST", "/v1/subagents/sa-1/messages", json, `{"body":"hi"}`, 400},
		{"send as form", "POST", "/v1/subagents/sa-1/messages", "application/x-www-form-urlencoded", `sender=op&body=hi`, 415},
		{"send a number", "POST", "/v1/subagents/sa-1/messages", json, `{"sender":"op","body":5}`, 400},
		{"cancel without an actor", "POST", "/v1/subagents/sa-1/cancel", json, `{"reason":"x"}`, 400},
		{"cancel, malformed", "POST", "/v1/subagents/sa-1/cancel", json, `{"actor":`, 400},
		{"ack nothing", "POST", "/v1/subagents/sa-1/mailbox/ack", json, `{"ids":[]}`, 400},
		{"ack strings", "POST", "/v1/subagents/sa-1/mailbox/ack", json, `{"ids":["1"]}`, 400},
		{"mailbox wait negative", "GET", "/v1/subagents/sa-1/mailbox?wait_ms=-1", "", "", 400},
		{"mailbox wait over the maximum", "GET", "/v1/subagents/sa-1/mailbox?wait_ms=5001", "", "", 400},
		{"mailbox wait not a number", "GET", "/v1/subagents/sa-1/mailbox?wait_ms=" + url.QueryEscape(sql), "", "", 400},
		{"mailbox of a bad id", "GET", "/v1/subagents/" + url.PathEscape(sql) + "/mailbox", "", "", 400},
		{"list by a bad status", "GET", "/v1/subagents?status=zombie", "", "", 400},
		{"list limit 0", "GET", "/v1/subagents?limit=0", "", "", 400},
		{"list limit too big", "GET", "/v1/subagents?limit=201", "", "", 400},
		{"list by a bad job id", "GET", "/v1/subagents?job_id=" + url.QueryEscape(sql), "", "", 400},
		{"unknown child", "GET", "/v1/subagents/sa-9", "", "", 404},
		{"delete a child", "DELETE", "/v1/subagents/sa-1", "", "", 405},
	}
	expectRefusals(t, a, cases)
	if after := f.snapshot(); after != before {
		t.Fatalf("a refused request wrote:\n%s\nthen\n%s", before, after)
	}
}
