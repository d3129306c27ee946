package faults

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// Each invariant on hand-made data: a history that keeps it gives no violation, and each
// way of breaking it gives one that names the job, lease, org or file.

var t0 = time.Date(2026, 12, 4, 8, 0, 0, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

func ev(id int64, job, org, kind string, attempt, s int) JobEvent {
	return JobEvent{ID: id, JobID: job, Org: org, Kind: kind, Attempt: attempt, At: at(s)}
}

// wantViolations fails unless vs has exactly n violations, each mentioning every word.
func wantViolations(t *testing.T, vs []Violation, n int, words ...string) {
	t.Helper()
	if len(vs) != n {
		t.Fatalf("%d violations, want %d:\n%s", len(vs), n, Report(vs))
	}
	for _, v := range vs {
		for _, w := range words {
			if !strings.Contains(v.String(), w) {
				t.Errorf("violation %q does not mention %q", v, w)
			}
		}
	}
}

func goodHistory() State {
	return State{
		MaxAttempts: 3,
		Jobs: []Job{{ID: "j1", Org: "acme", Status: "COMPLETED", Attempt: 2},
			{ID: "j2", Org: "acme", Status: "FAILED", Attempt: 4, Error: "crashed 3 times"},
			{ID: "j3", Org: "globex", Status: "COMPLETED", Attempt: 1}},
		JobEvents: []JobEvent{
			ev(1, "j1", "acme", "claim", 1, 1), ev(2, "j3", "globex", "claim", 1, 1),
			ev(3, "j1", "acme", "start", 1, 2), ev(4, "j1", "acme", "crash", 1, 3), ev(13, "j1", "acme", "release", 1, 3),
			ev(5, "j1", "acme", "claim", 2, 4), ev(6, "j1", "acme", "complete", 2, 5),
			ev(7, "j3", "globex", "complete", 1, 5),
			ev(8, "j2", "acme", "claim", 1, 6), ev(9, "j2", "acme", "reclaim", 2, 8), ev(10, "j2", "acme", "reclaim", 3, 10),
			ev(11, "j2", "acme", "reclaim", 4, 12), ev(12, "j2", "acme", "fail", 4, 12),
		},
		Attempts: []Attempt{
			{ID: 1, JobID: "j1", Org: "acme", Attempt: 1, ClaimedAt: at(1), FinishedAt: at(3), Outcome: "crashed"},
			{ID: 2, JobID: "j3", Org: "globex", Attempt: 1, ClaimedAt: at(1), FinishedAt: at(5), Outcome: "completed"},
			{ID: 3, JobID: "j1", Org: "acme", Attempt: 2, ClaimedAt: at(4), FinishedAt: at(5), Outcome: "completed"},
			{ID: 4, JobID: "j2", Org: "acme", Attempt: 1, ClaimedAt: at(6), FinishedAt: at(8), Outcome: "crashed", Reason: "re-claimed as stale"},
			{ID: 5, JobID: "j2", Org: "acme", Attempt: 2, ClaimedAt: at(8), FinishedAt: at(10), Outcome: "crashed"},
			{ID: 6, JobID: "j2", Org: "acme", Attempt: 3, ClaimedAt: at(10), FinishedAt: at(12), Outcome: "crashed"},
			{ID: 7, JobID: "j2", Org: "acme", Attempt: 4, ClaimedAt: at(12), FinishedAt: at(12), Outcome: "failed"},
		},
		LeaseEvents: []LeaseEvent{
			{ID: 1, Key: "home:acme", Kind: "acquire", Holder: "a", Epoch: 1, At: at(1)},
			{ID: 2, Key: "home:acme", Kind: "refresh", Holder: "a", Epoch: 1, At: at(2)},
			{ID: 3, Key: "home:acme", Kind: "takeover", Holder: "b", Previous: "a", Epoch: 2, At: at(4)},
			{ID: 4, Key: "home:acme", Kind: "force_release", Holder: "b", Epoch: 2, Actor: "operator:ann", At: at(5)},
			{ID: 5, Key: "home:acme", Kind: "acquire", Holder: "a", Epoch: 4, At: at(6)},
			{ID: 6, Key: "home:acme", Kind: "expire", Holder: "a", Epoch: 4, At: at(9)},
		},
		Subagents: []Subagent{{Org: "acme", ID: "sa-1", Status: "done", Summary: "heard: hello", EndedAt: at(7)},
			{Org: "acme", ID: "sa-2", Status: "failed", CancelledBy: "operator:ann", EndedAt: at(8)}},
		Messages: []Message{{ID: 1, Org: "acme", Subagent: "sa-1", Sender: "operator:ann", Body: "hello", Deliveries: 2, AckedAt: at(6)},
			{ID: 2, Org: "acme", Subagent: "sa-2", Sender: "operator:ann", Body: "never heard", Deliveries: 0}},
		Sent: []SentMessage{{ID: 1, Org: "acme", Subagent: "sa-1", Sender: "operator:ann", Body: "hello", At: at(5)},
			{ID: 2, Org: "acme", Subagent: "sa-2", Sender: "operator:ann", Body: "never heard", At: at(6)}},
		Actions: []OperatorAction{{Kind: "login", Operator: "ann", At: at(1)}, {Kind: "send", Operator: "ann", Org: "acme", Target: "sa-1", At: at(5)},
			{Kind: "cancel", Operator: "ann", Org: "acme", Target: "sa-2", At: at(7)}, {Kind: "force_release", Operator: "ann", Org: "acme", Target: "home:acme", At: at(5)}},
		OpEvents:   []OperatorEvent{{Operator: "ann", Kind: "login", Actor: "ann", At: at(1)}},
		Files:      []File{{Path: "/h/SOUL.md", Want: []byte("soul"), Got: []byte("soul")}},
		Containers: []Container{{Name: "hermes-org-acme", State: "running", Instance: "a", Role: "worker"}},
		Orgs:       []string{"acme", "globex"},
		LastFault:  at(4),
	}
}

func TestAGoodHistoryKeepsEveryInvariant(t *testing.T) {
	if vs := CheckAll(goodHistory()); len(vs) != 0 {
		t.Fatalf("violations in a good history:\n%s", Report(vs))
	}
}

func TestJobsEnded(t *testing.T) {
	s := goodHistory()
	s.JobEvents = append(s.JobEvents, ev(14, "j3", "globex", "complete", 1, 20)) // completed twice
	wantViolations(t, CheckJobsEnded(s), 1, "j3", "2 complete events")

	s = goodHistory()
	s.Jobs[1].Error = ""
	wantViolations(t, CheckJobsEnded(s), 1, "j2", "without a reason")

	s = goodHistory()
	s.MaxAttempts = 5 // j2 failed after 4 runs
	wantViolations(t, CheckJobsEnded(s), 1, "j2", "below the cap")

	s = goodHistory()
	s.Jobs = append(s.Jobs, Job{ID: "j4", Org: "acme", Status: "RUNNING", Attempt: 1})
	wantViolations(t, CheckJobsEnded(s), 1, "j4", "still RUNNING")
}

func TestOneRunPerOrg(t *testing.T) {
	s := goodHistory()
	// j4 claimed for acme while j1's second run is open.
	s.JobEvents = slices.Insert(s.JobEvents, 6, ev(50, "j4", "acme", "claim", 1, 4))
	s.JobEvents = slices.Insert(s.JobEvents, 8, ev(51, "j4", "acme", "complete", 1, 5))
	wantViolations(t, CheckOneRunPerOrg(s), 1, "org acme", "j4 claimed", "while job j1")

	s = goodHistory()
	// The host's record: j9 claimed while j2's attempt 2 ran.
	s.Attempts = append(s.Attempts, Attempt{ID: 8, JobID: "j9", Org: "acme", Attempt: 1, ClaimedAt: at(8).Add(500 * time.Millisecond), FinishedAt: at(9)})
	wantViolations(t, CheckOneRunPerOrg(s), 1, "org acme", "claim_attempts", "j9")

	s = goodHistory()
	// An attempt without an outcome ends where the backend closed its run: no overlap.
	s.Attempts[2].FinishedAt, s.Attempts[2].Outcome = time.Time{}, ""
	wantViolations(t, CheckOneRunPerOrg(s), 0)

	s = goodHistory()
	// A paused dispatcher records the outcome of the run a re-claim took over late: the
	// re-claim ended it.
	s.Attempts[4].FinishedAt = at(11)
	wantViolations(t, CheckOneRunPerOrg(s), 0)

	s = goodHistory()
	// ... or after another took the org over and claimed its next job: the backend's close
	// of the run ended it.
	s.Attempts[6].FinishedAt = at(14)
	s.JobEvents = append(s.JobEvents, ev(60, "j9", "acme", "claim", 1, 13), ev(61, "j9", "acme", "complete", 1, 15))
	s.Attempts = append(s.Attempts, Attempt{ID: 8, JobID: "j9", Org: "acme", Attempt: 1, ClaimedAt: at(13), FinishedAt: at(15), Outcome: "completed"})
	wantViolations(t, CheckOneRunPerOrg(s), 0)
	// The same claim while the backend still had the run open is two runs at once.
	s.JobEvents[len(s.JobEvents)-2].At, s.Attempts[len(s.Attempts)-1].ClaimedAt = at(11).Add(time.Second/2), at(11).Add(time.Second/2)
	wantViolations(t, CheckOneRunPerOrg(s), 2, "org acme", "claim_attempts", "j9")
}

func TestLeases(t *testing.T) {
	s := goodHistory()
	// b acquires while a holds (two holders).
	s.LeaseEvents = slices.Insert(s.LeaseEvents, 2, LeaseEvent{ID: 2, Key: "home:acme", Kind: "acquire", Holder: "b", Epoch: 2, At: at(3)})
	vs := CheckLeases(s)
	if len(vs) == 0 || !strings.Contains(vs[0].String(), "acquire by b (epoch 2) while a held it") {
		t.Fatalf("two holders not seen:\n%s", Report(vs))
	}

	s = goodHistory()
	// a refreshes at its old epoch after b took over: a stale epoch accepted.
	s.LeaseEvents = slices.Insert(s.LeaseEvents, 3, LeaseEvent{ID: 3, Key: "home:acme", Kind: "refresh", Holder: "a", Epoch: 1, At: at(4)})
	wantViolations(t, CheckLeases(s), 1, "home:acme", "refresh accepted from a at epoch 1", "b at epoch 2")

	s = goodHistory()
	// A takeover that names someone else than the holder.
	s.LeaseEvents[2].Previous = "c"
	wantViolations(t, CheckLeases(s), 1, "names \"c\"", "the holder was a")

	s = goodHistory()
	// An epoch that does not grow.
	s.LeaseEvents[4].Epoch, s.LeaseEvents[5].Epoch = 3, 3
	wantViolations(t, CheckLeases(s), 1, "not above the earlier epoch 3")
}

func TestStaleJobWrites(t *testing.T) {
	s := goodHistory()
	// attempt 1's progress lands after the release closed its run (and after the claim).
	s.JobEvents = slices.Insert(s.JobEvents, 6, ev(40, "j1", "acme", "progress", 1, 4))
	wantViolations(t, CheckStaleJobWrites(s), 1, "j1", "attempt 1 accepted while attempt 2")

	s = goodHistory()
	s.JobEvents = append(s.JobEvents, ev(41, "j3", "globex", "proposal", 1, 30))
	wantViolations(t, CheckStaleJobWrites(s), 1, "j3", "no run of the job was open")
}

func TestFiles(t *testing.T) {
	s := goodHistory()
	s.Files = append(s.Files, File{Path: "/h/trunc", Want: []byte("abcdef"), Got: []byte("abc")},
		File{Path: "/h/gone", Want: []byte("x"), Err: errors.New("no such file")},
		File{Path: "/c/auth.json", Got: []byte("{"), Check: func([]byte) error { return errors.New("truncated at offset 1") }})
	vs := CheckFiles(s)
	wantViolations(t, vs, 3)
	for i, w := range []string{"/h/trunc", "/h/gone", "truncated at offset 1"} {
		if !strings.Contains(vs[i].String(), w) {
			t.Errorf("violation %q does not mention %q", vs[i], w)
		}
	}
}

func TestOrphans(t *testing.T) {
	s := goodHistory()
	s.Containers = append(s.Containers, Container{Name: "stray", State: "running"},
		Container{Name: "hermes-org-globex", State: "running", Instance: "b", Role: "worker", Execs: 1})
	s.Processes = []Process{{PID: 42, Cmdline: "scripted-agent chat"}}
	vs := CheckOrphans(s)
	wantViolations(t, vs, 3)
	for i, w := range []string{"stray", "1 execs", "process 42"} {
		if !strings.Contains(vs[i].String(), w) {
			t.Errorf("violation %q does not mention %q", vs[i], w)
		}
	}
}

func TestMessages(t *testing.T) {
	s := goodHistory()
	s.Subagents[0].Summary = "heard: hello | hello" // processed twice
	wantViolations(t, CheckMessages(s), 1, "message 1", "processed 2 times")

	s = goodHistory()
	s.Messages[0].AckedAt = time.Time{} // the child ended done without it
	wantViolations(t, CheckMessages(s), 1, "message 1", "lost")

	s = goodHistory()
	s.Messages = s.Messages[1:] // accepted, then gone
	wantViolations(t, CheckMessages(s), 1, "message 1", "not in the mailbox")
}

func TestOperatorActions(t *testing.T) {
	s := goodHistory()
	s.Actions = append(s.Actions, OperatorAction{Kind: "login", Operator: "bob", At: at(3)},
		OperatorAction{Kind: "cancel", Operator: "bob", Org: "acme", Target: "sa-1", At: at(4)})
	vs := CheckOperatorActions(s)
	wantViolations(t, vs, 2, "bob", "no record")
}

func TestAViolationNamesTheFaultBeforeIt(t *testing.T) {
	vs := []Violation{{Invariant: "x", Subject: "job j1", Detail: "d", At: at(10)}, {Invariant: "y", Subject: "lease k", Detail: "d", At: at(1)}}
	Attribute(vs, []Applied{{At: at(9), Kind: KillWorker, Target: "acme"}, {At: at(2), Kind: RestartDB, Target: "postgres"}, {At: at(11), Kind: KillGateway, Target: "gateway"}})
	if vs[0].After == nil || vs[0].After.Kind != KillWorker || !strings.Contains(vs[0].String(), "kill-worker of acme") {
		t.Errorf("violation at 10s: %s", vs[0])
	}
	if vs[1].After != nil || !strings.Contains(vs[1].String(), "no fault was applied before it") {
		t.Errorf("violation at 1s: %s", vs[1])
	}
}

func TestAScheduleIsItsSeeds(t *testing.T) {
	a := Plan(7, 2*time.Minute, 3*time.Second, 8*time.Second, AllKinds)
	b := Plan(7, 2*time.Minute, 3*time.Second, 8*time.Second, AllKinds)
	c := Plan(8, 2*time.Minute, 3*time.Second, 8*time.Second, AllKinds)
	if !slices.Equal(a, b) || slices.Equal(a, c) {
		t.Fatalf("same seed, same schedule; other seed, other schedule:\n%v\n%v\n%v", a, b, c)
	}
	seen := map[Kind]bool{}
	for i, p := range a {
		if p.At > 2*time.Minute || (i > 0 && p.At-a[i-1].At < 3*time.Second) {
			t.Fatalf("fault %d at %s out of bounds", i, p.At)
		}
		seen[p.Kind] = true
	}
	if len(seen) != len(AllKinds) {
		t.Fatalf("a two-minute schedule covers %d of %d kinds: %v", len(seen), len(AllKinds), a)
	}
}

func TestProgress(t *testing.T) {
	s := goodHistory()
	s.LastFault = at(5) // both orgs' last completes are at 5s, not after
	s.JobEvents = append(s.JobEvents, ev(20, "j9", "acme", "claim", 1, 6), ev(21, "j9", "acme", "complete", 1, 7))
	wantViolations(t, CheckProgress(s), 1, "org globex", "no job after the last fault")
}

func TestHostRecord(t *testing.T) {
	s := goodHistory()
	s.Attempts[2].FinishedAt, s.Attempts[2].Outcome = time.Time{}, "" // its outcome write was lost
	wantViolations(t, CheckHostRecord(s), 1, "j1", "attempt 2", "no outcome recorded", "complete@")

	s = goodHistory()
	s.Attempts[1].Outcome = "crashed" // the backend completed it
	wantViolations(t, CheckHostRecord(s), 1, "j3", "recorded crashed")

	s = goodHistory()
	s.Attempts = s.Attempts[1:] // j1's first claim never recorded
	wantViolations(t, CheckHostRecord(s), 1, "j1", "attempt 1", "no claim_attempts row")
}

func TestOneAgentPerHome(t *testing.T) {
	s := goodHistory()
	s.Sessions = []AgentSession{{Org: "acme", ID: "s1", Source: "tool", Start: at(1), End: at(3)}, {Org: "acme", ID: "s2", Source: "tool", Start: at(4), End: at(6)},
		{Org: "globex", ID: "s3", Source: "tool", Start: at(2), End: at(5)}}
	wantViolations(t, CheckOneAgentPerHome(s), 0)
	s.Sessions = append(s.Sessions, AgentSession{Org: "acme", ID: "chat", Source: "cli", Start: at(5), End: at(7)})
	wantViolations(t, CheckOneAgentPerHome(s), 1, "the home of acme", "session chat", "while session s2")
}
