package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"hermeshost/pg/pgtest"
	"hermeshost/subagent"
)

func TestSubagentListShowSendAndCancel(t *testing.T) {
	url, pool := pgtest.Schema(t)
	store := subagent.New(pool, subagent.Options{})
	defer store.Close()
	ctx := context.Background()
	for _, st := range []subagent.Start{
		{ID: "sa-1", JobID: "job-1", ParentSession: "s0", Goal: "read the catalogue\nand the price list"},
		{ID: "sa-2", JobID: "job-1", ParentSubagent: "sa-1", Goal: "summarise"},
	} {
		if _, _, err := store.Start(ctx, "acme", st); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := store.Start(ctx, "globex", subagent.Start{ID: "sa-9", Goal: "globex's"}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Stop(ctx, "acme", "sa-2", subagent.Done, "done early"); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": url}

	r := run(t, env, "subagent", "list", "--org", "acme", "--status", "live")
	if r.code != 0 || !regexp.MustCompile(`(?m)^sa-1\s+running\s+job-1\s+-\s+s0\s+0\s+\S+\s+read the catalogue and the price list$`).MatchString(r.stdout) ||
		strings.Contains(r.stdout, "sa-2") || strings.Contains(r.stdout, "sa-9") {
		t.Fatalf("list: %+v", r)
	}
	r = run(t, env, "subagent", "send", "--org", "acme", "--as", "ada", "sa-1", "also", "check", "prices")
	if r.code != 0 || !strings.Contains(r.stdout, "queued message") {
		t.Fatalf("send: %+v", r)
	}
	box, err := store.Drain(ctx, "acme", "sa-1", 0)
	if err != nil || len(box.Messages) != 1 || box.Messages[0].Body != "also check prices" || box.Messages[0].Sender != "operator:ada" {
		t.Fatalf("the child's mailbox after send: %+v, %v", box, err)
	}
	r = run(t, env, "subagent", "cancel", "--org", "acme", "--as", "ada", "--reason", "wrong goal", "sa-1")
	if r.code != 0 || !strings.Contains(r.stdout, "sa-1 is cancelling") {
		t.Fatalf("cancel: %+v", r)
	}
	r = run(t, env, "subagent", "show", "--org", "acme", "sa-1")
	if r.code != 0 || !strings.Contains(r.stdout, "status:   cancelling") || !strings.Contains(r.stdout, "cancel:   by operator:ada: wrong goal") ||
		!regexp.MustCompile(`(?m)^\d+\s+\S+\s+operator:ada\s+delivered x1\s+also check prices$`).MatchString(r.stdout) {
		t.Fatalf("show: %+v", r)
	}
	// Each refusal is one line, and exits 2 for usage, 1 for a refused call.
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"subagent", "list"}, 2, "--org is required"},
		{[]string{"subagent", "send", "--org", "acme", "sa-1"}, 2, "want a subagent ID and the message text"},
		{[]string{"subagent", "send", "--org", "acme", "sa-1", "late"}, 1, "being cancelled"},
		{[]string{"subagent", "cancel", "--org", "acme", "sa-2"}, 1, "has ended"},
		{[]string{"subagent", "show", "--org", "acme", "sa-9"}, 1, "no such subagent"},
		{[]string{"subagent", "show", "--org", "Not An Org", "sa-1"}, 1, "is not one"},
		{[]string{"subagent", "list", "--org", "acme", "--status", "zombie"}, 1, "is not one of"},
	} {
		r := run(t, env, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.says) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%v: want exit %d saying %q in one line, got %+v", c.args, c.code, c.says, r)
		}
	}
	if h, _ := store.Get(ctx, "globex", "sa-9"); h.Status != subagent.Running {
		t.Fatalf("globex's child was touched: %+v", h)
	}
}
