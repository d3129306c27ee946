package dispatch_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"hermeshost/sartiq"
	"hermeshost/scriptedagent"
	"hermeshost/subagent"
)

func (f *fixture) subagents(t *testing.T) *subagent.Store {
	s := subagent.New(f.db, subagent.Options{})
	t.Cleanup(s.Close)
	return s
}

// startChild records a running child of org as its subagent_start hook would.
func startChild(t *testing.T, s *subagent.Store, org string, st subagent.Start) {
	t.Helper()
	if st.Goal == "" {
		st.Goal = "look something up"
	}
	if _, _, err := s.Start(context.Background(), org, st); err != nil {
		t.Fatal(err)
	}
}

func childStatus(t *testing.T, s *subagent.Store, org, id string) subagent.Handle {
	t.Helper()
	h, err := s.Get(context.Background(), org, id)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// When run-job ends, its agent has ended, and the children it started will never report:
// the dispatcher fails the ones still live, and only that job's.
func TestTheLiveSubagentsOfAnEndedJobAreFailed(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	ctx := context.Background()
	subs := f.subagents(t)
	rows, err := f.backend.DB.Query(ctx, `SELECT id::text, organization_id FROM agent_jobs WHERE status = 'QUEUED'`)
	if err != nil {
		t.Fatal(err)
	}
	jobs := map[string]string{}
	for rows.Next() {
		var id, org string
		if err := rows.Scan(&id, &org); err != nil {
			t.Fatal(err)
		}
		jobs[id] = org
	}
	rows.Close()
	if len(jobs) != 4 {
		t.Fatalf("demo jobs: %v", jobs)
	}
	// Stand-ins for what each job's agent would report through its hooks (the scripted agent
	// starts no children): one child per job, and one that reported on its own.
	for job, org := range jobs {
		startChild(t, subs, org, subagent.Start{ID: "child-of-" + job, JobID: job})
	}
	var reported string
	for job, org := range jobs {
		if org == "acme" {
			reported = job
			break
		}
	}
	startChild(t, subs, "acme", subagent.Start{ID: "reported", JobID: reported})
	if _, err := subs.Stop(ctx, "acme", "reported", subagent.Done, "found it"); err != nil {
		t.Fatal(err)
	}
	// A chat session's child belongs to no job and is left alone.
	startChild(t, subs, "acme", subagent.Start{ID: "chat-child", Session: "chat-1"})

	d := f.dispatcher(t)
	cycleUntilDone(t, f, d, 2*time.Minute)
	checkDemoJobsDone(t, f, 4, 0)
	for job, org := range jobs {
		h := childStatus(t, subs, org, "child-of-"+job)
		if h.Status != subagent.Failed || !strings.Contains(h.Summary, "job "+job+" ended (completed) before the subagent reported") {
			t.Errorf("the child of %s after its job completed: %s %q", job, h.Status, h.Summary)
		}
	}
	if h := childStatus(t, subs, "acme", "reported"); h.Status != subagent.Done || h.Summary != "found it" {
		t.Errorf("a child that had reported was rewritten: %+v", h)
	}
	if h := childStatus(t, subs, "acme", "chat-child"); h.Status != subagent.Running {
		t.Errorf("a chat session's child was ended with the jobs: %+v", h)
	}
}

// A dispatcher that died mid-job never records the end of its run: the new owner's
// recovery fails the stale attempt's children when it re-claims the job, before the next
// attempt starts children of its own.
func TestRecoveryFailsTheSubagentsOfAStaleAttempt(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	ctx := context.Background()
	subs := f.subagents(t)
	orphan := f.backend.DemoJob(t, "acme", sartiq.TypeProductIngest)
	if _, err := f.cfg.Bot.Claim(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	startChild(t, subs, "acme", subagent.Start{ID: "orphaned", JobID: orphan})
	f.backend.Clock.Advance(2 * time.Minute)
	d := f.dispatcher(t)
	if _, err := d.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	if kinds := runKinds(t, f, orphan); len(kinds) < 2 || kinds[1] != "reclaim@2" {
		t.Fatalf("the orphan was not re-claimed: %v", kinds)
	}
	h := childStatus(t, subs, "acme", "orphaned")
	if h.Status != subagent.Failed || !strings.Contains(h.Summary, "attempt 1 went stale") {
		t.Fatalf("the stale attempt's child after the re-claim: %s %q", h.Status, h.Summary)
	}
	d.Wait()
}

// A run that lost its home lease is no longer the job's: whoever holds the home now may
// have re-claimed the job, and its children are not this run's to fail.
func TestARunThatLostItsHomeLeaseLeavesTheSubagentsAlone(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	ctx := context.Background()
	subs := f.subagents(t)
	writeKnobs(t, f, "acme", &scriptedagent.Knobs{StallAtWrite: 1})
	d := f.dispatcher(t)
	t.Cleanup(func() { d.Shutdown(0, 10*time.Second) })
	if _, err := d.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	var job string
	waitFor(t, 30*time.Second, "acme's agent to start", func() bool {
		err := f.db.QueryRow(ctx, `SELECT m.job_id FROM mirror_job_events e JOIN mirror_jobs m USING (job_id)
 WHERE m.org = 'acme' AND e.kind = 'agent_start'`).Scan(&job)
		return err == nil
	})
	startChild(t, subs, "acme", subagent.Start{ID: "child", JobID: job})
	if _, err := f.leases(t).ForceRelease(ctx, "home:acme", "operator", "test: take the home away"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "acme's run to record its end", func() bool {
		a := attemptsOf(t, f, job)
		return len(a) == 1 && a[0].Outcome != ""
	})
	d.Wait()
	if h := childStatus(t, subs, "acme", "child"); h.Status != subagent.Running {
		t.Fatalf("a run without its home lease failed the job's child: %+v", h)
	}
}
