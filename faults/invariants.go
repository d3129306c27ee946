// Package faults is the fault suite: the whole system run as its processes on a Postgres
// cluster and a Docker engine of the suite's own, faults applied from a seeded schedule, and
// the invariants checked afterwards from durable state. This file holds the invariants:
// each is a function of State (rows read back from the databases, files, the engine and
// /proc once every process has stopped) returning the violations it finds, so that each
// can be tested on hand-made data. The suite itself is faults_test.go.
package faults

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Job is a row of the backend's agent_jobs.
type Job struct {
	ID, Org, Status, Error string
	Attempt                int
}

// JobEvent is a row of the backend's agent_job_events, with its job's organization.
type JobEvent struct {
	ID            int64
	JobID, Org    string
	Kind, Message string
	Attempt       int
	At            time.Time
}

// Attempt is a row of the host's claim_attempts.
type Attempt struct {
	ID                         int64
	JobID, Org, Instance, Kind string
	Outcome, Reason            string
	Attempt                    int
	ClaimedAt                  time.Time
	FinishedAt                 time.Time // zero: no outcome recorded
}

// LeaseEvent is a row of the host's lease_events.
type LeaseEvent struct {
	ID                                 int64
	Key, Kind, Holder, Previous, Actor string
	Epoch                              int64
	At                                 time.Time
}

// Subagent is a row of the host's subagents.
type Subagent struct {
	Org, ID, JobID, Status, Summary, CancelledBy string
	EndedAt                                      time.Time
}

// Message is a row of the host's subagent_messages.
type Message struct {
	ID                    int64
	Org, Subagent, Sender string
	Body                  string
	Deliveries            int
	SentAt, AckedAt       time.Time // AckedAt zero: never acknowledged
}

// SentMessage is a message the suite had accepted (the store gave it an id).
type SentMessage struct {
	ID                    int64
	Org, Subagent, Sender string
	Body                  string
	At                    time.Time
}

// OperatorAction is something the suite did as an operator, and the record it must leave:
// Kind "login" an operator_events row, "send" a message row (see SentMessage), "cancel" the
// subagent's cancelled_by, "force_release" a lease event with the actor.
type OperatorAction struct {
	Kind, Operator, Org, Target string
	At                          time.Time
}

// OperatorEvent is a row of the host's operator_events.
type OperatorEvent struct {
	Operator, Kind, Org, Actor string
	At                         time.Time
}

// File is a file the suite wrote (Want) and what was found at the end (Got, or Err when it
// could not be read); Check, when set, says whether Got is still a good file of its kind
// (for a file the system rewrites, such as credentials).
type File struct {
	Path      string
	Want, Got []byte
	Err       error
	Check     func(got []byte) error
	WrittenAt time.Time
}

// Container is a container left on the suite's engine after every process stopped.
type Container struct {
	Name, State, Instance, Role string
	Execs                       int
}

// Process is a process left on the machine that belongs to the suite's run.
type Process struct {
	PID     int
	Cmdline string
}

// AgentSession is a top-level session an agent ran in an org's home (its state.db): from
// its start to its last message.
type AgentSession struct {
	Org, ID, Source string
	Start, End      time.Time
}

// State is everything the invariants read.
type State struct {
	MaxAttempts   int
	Jobs          []Job
	JobEvents     []JobEvent // by id
	Attempts      []Attempt  // by id
	LeaseEvents   []LeaseEvent
	Subagents     []Subagent
	Messages      []Message
	Sent          []SentMessage
	Actions       []OperatorAction
	OpEvents      []OperatorEvent
	Files         []File
	Containers    []Container
	Processes     []Process
	ContainersErr error
	// Orgs each got a job after LastFault, the end of the last fault.
	Orgs      []string
	LastFault time.Time
	Sessions  []AgentSession
}

// Violation is one broken invariant: which, about what (a job, a lease, an org, a file),
// what was seen, and when the violating event happened (zero when it is not an event).
type Violation struct {
	Invariant string
	Subject   string
	Detail    string
	At        time.Time
	// After is the last fault applied before At, filled in by Attribute.
	After *Applied
}

func (v Violation) String() string {
	s := fmt.Sprintf("%s: %s: %s", v.Invariant, v.Subject, v.Detail)
	if !v.At.IsZero() {
		s += " at " + v.At.UTC().Format("15:04:05.000")
	}
	switch {
	case v.After != nil:
		s += fmt.Sprintf("; the last fault before it: %s", v.After)
	case !v.At.IsZero():
		s += "; no fault was applied before it"
	}
	return s
}

// Invariant is a named check.
type Invariant struct {
	Name  string
	Check func(State) []Violation
}

// Invariants are every check the suite makes, in the order it reports them.
var Invariants = []Invariant{
	{"every job completed once or failed at the attempt cap", CheckJobsEnded},
	{"never two runs of one org", CheckOneRunPerOrg},
	{"never two agents on one home", CheckOneAgentPerHome},
	{"never two holders of a lease, no stale epoch accepted", CheckLeases},
	{"no write of a superseded attempt accepted", CheckStaleJobWrites},
	{"files intact", CheckFiles},
	{"no orphaned container or process", CheckOrphans},
	{"no subagent message lost or processed twice", CheckMessages},
	{"every operator action recorded", CheckOperatorActions},
	{"work goes on after the faults", CheckProgress},
	{"the host's record of attempts agrees with the backend's log", CheckHostRecord},
}

// CheckAll runs every invariant, each violation named by its invariant.
func CheckAll(s State) []Violation {
	var out []Violation
	for _, inv := range Invariants {
		for _, v := range inv.Check(s) {
			v.Invariant = inv.Name
			out = append(out, v)
		}
	}
	return out
}

// runOpens and runCloses are the backend's kinds that open and close a run of a job. A
// crash (the dispatcher ending an attempt whose worker died) is written within the run, which
// its release (or, at the attempt cap, its fail) then closes; a run left to go stale is
// closed by the re-claim that takes it over.
var (
	runOpens  = []string{"claim", "reclaim"}
	runCloses = []string{"complete", "fail", "release"}
)

// CheckJobsEnded: every job is COMPLETED with exactly one complete in its log, or FAILED
// with a reason, one fail in its log and at least MaxAttempts runs (claims and re-claims).
func CheckJobsEnded(s State) []Violation {
	runs, completes, fails := map[string]int{}, map[string][]time.Time{}, map[string]int{}
	for _, e := range s.JobEvents {
		switch e.Kind {
		case "claim", "reclaim":
			runs[e.JobID]++
		case "complete":
			completes[e.JobID] = append(completes[e.JobID], e.At)
		case "fail":
			fails[e.JobID]++
		}
	}
	var out []Violation
	for _, j := range s.Jobs {
		subject := "job " + j.ID + " of " + j.Org
		switch j.Status {
		case "COMPLETED":
			if n := len(completes[j.ID]); n != 1 {
				at := time.Time{}
				if n > 1 {
					at = completes[j.ID][1]
				}
				out = append(out, Violation{Subject: subject, Detail: fmt.Sprintf("COMPLETED with %d complete events in its log", n), At: at})
			}
		case "FAILED":
			switch {
			case strings.TrimSpace(j.Error) == "":
				out = append(out, Violation{Subject: subject, Detail: "FAILED without a reason"})
			case runs[j.ID] < s.MaxAttempts:
				out = append(out, Violation{Subject: subject, Detail: fmt.Sprintf("FAILED after %d runs, below the cap of %d: %s", runs[j.ID], s.MaxAttempts, j.Error)})
			}
			if fails[j.ID] != 1 || len(completes[j.ID]) != 0 {
				out = append(out, Violation{Subject: subject, Detail: fmt.Sprintf("FAILED with %d fail and %d complete events in its log", fails[j.ID], len(completes[j.ID]))})
			}
		default:
			out = append(out, Violation{Subject: subject, Detail: fmt.Sprintf("still %s (attempt %d) after the drain", j.Status, j.Attempt)})
		}
	}
	return out
}

// CheckOneRunPerOrg replays the backend's log in commit order: a claim or re-claim opens a
// run of its job, a complete, fail or release closes it, and a re-claim also takes
// over the run of its own job. No org may have two runs open. The host's claim_attempts
// say the same: per org, the claim-to-outcome intervals are disjoint.
func CheckOneRunPerOrg(s State) []Violation {
	var out []Violation
	open := map[string]string{} // org -> job with a run open
	for _, e := range s.JobEvents {
		switch {
		case slices.Contains(runOpens, e.Kind):
			if other, busy := open[e.Org]; busy && other != e.JobID {
				out = append(out, Violation{Subject: "org " + e.Org, At: e.At,
					Detail: fmt.Sprintf("job %s %s (attempt %d) while job %s was running", e.JobID, pastTense(e.Kind), e.Attempt, other)})
			}
			open[e.Org] = e.JobID
		case slices.Contains(runCloses, e.Kind):
			if open[e.Org] == e.JobID {
				delete(open, e.Org)
			}
		}
	}
	next := map[string]map[int]time.Time{} // job -> attempt -> claimed
	for _, a := range s.Attempts {
		if next[a.JobID] == nil {
			next[a.JobID] = map[int]time.Time{}
		}
		next[a.JobID][a.Attempt] = a.ClaimedAt
	}
	// A run's end in the backend's log: the close of its attempt.
	closed := map[string]map[int]time.Time{}
	for _, e := range s.JobEvents {
		if slices.Contains(runCloses, e.Kind) {
			if closed[e.JobID] == nil {
				closed[e.JobID] = map[int]time.Time{}
			}
			closed[e.JobID][e.Attempt] = e.At
		}
	}
	// An attempt ends at its outcome, or where the backend closed its run if that came
	// first (an attempt without an outcome, which CheckHostRecord reports, ends there); and
	// at the latest where its job's next attempt began: a re-claim takes a stale run over,
	// revoking its token. A dispatcher paused after its run ended records the outcome late,
	// after another has taken the org over (and claimed its next job) or the run's job.
	end := func(a Attempt) time.Time {
		e := a.FinishedAt
		if at, ok := closed[a.JobID][a.Attempt]; ok && (e.IsZero() || at.Before(e)) {
			e = at
		}
		for n, at := range next[a.JobID] {
			if n > a.Attempt && (e.IsZero() || at.Before(e)) {
				e = at
			}
		}
		if e.IsZero() {
			return time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
		}
		return e
	}
	byOrg := map[string][]Attempt{}
	for _, a := range s.Attempts {
		byOrg[a.Org] = append(byOrg[a.Org], a)
	}
	for org, as := range byOrg {
		sort.Slice(as, func(i, j int) bool { return as[i].ClaimedAt.Before(as[j].ClaimedAt) })
		for i := 1; i < len(as); i++ {
			prev := as[i-1]
			if as[i].ClaimedAt.Before(end(prev)) {
				out = append(out, Violation{Subject: "org " + org, At: as[i].ClaimedAt,
					Detail: fmt.Sprintf("claim_attempts: job %s attempt %d (%s, %s) began at %s, before job %s attempt %d (%s, claimed %s, %s) ended at %s",
						as[i].JobID, as[i].Attempt, as[i].Instance, as[i].Kind, stamp(as[i].ClaimedAt),
						prev.JobID, prev.Attempt, prev.Instance, stamp(prev.ClaimedAt), outcomeOf(prev), stamp(end(prev)))})
			}
		}
	}
	return out
}

func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }

func outcomeOf(a Attempt) string {
	if a.Outcome == "" {
		return "no outcome recorded"
	}
	if a.Reason == "" {
		return a.Outcome
	}
	return a.Outcome + ": " + a.Reason
}

func pastTense(kind string) string {
	if kind == "claim" || kind == "reclaim" {
		return kind + "ed"
	}
	return kind
}

// CheckLeases replays every lease's events by id: an acquire needs the lease free, a
// takeover names the holder it took the expired lease from, each new holding has an epoch
// above every earlier one, and a refresh, release, expiry or forced release is of the
// current holder at the current epoch (anything else is a write of a stale epoch that was
// accepted).
func CheckLeases(s State) []Violation {
	type held struct {
		holder string
		epoch  int64
	}
	var out []Violation
	cur := map[string]*held{}
	maxEpoch := map[string]int64{}
	events := slices.Clone(s.LeaseEvents)
	sort.SliceStable(events, func(i, j int) bool { return events[i].ID < events[j].ID })
	for _, e := range events {
		subject := "lease " + e.Key
		h := cur[e.Key]
		switch e.Kind {
		case "acquire", "takeover":
			// A takeover is of a holding that expired unswept: it must name that holder.
			switch {
			case e.Kind == "acquire" && h != nil:
				out = append(out, Violation{Subject: subject, At: e.At,
					Detail: fmt.Sprintf("acquire by %s (epoch %d) while %s held it at epoch %d", e.Holder, e.Epoch, h.holder, h.epoch)})
			case e.Kind == "takeover" && (h == nil || h.holder != e.Previous):
				was := "nobody"
				if h != nil {
					was = h.holder
				}
				out = append(out, Violation{Subject: subject, At: e.At,
					Detail: fmt.Sprintf("takeover by %s (epoch %d) names %q as the previous holder, but the holder was %s", e.Holder, e.Epoch, e.Previous, was)})
			}
			if e.Epoch <= maxEpoch[e.Key] {
				out = append(out, Violation{Subject: subject, At: e.At,
					Detail: fmt.Sprintf("%s by %s at epoch %d, not above the earlier epoch %d", e.Kind, e.Holder, e.Epoch, maxEpoch[e.Key])})
			}
			cur[e.Key] = &held{e.Holder, e.Epoch}
			maxEpoch[e.Key] = max(maxEpoch[e.Key], e.Epoch)
		case "refresh", "release", "expire", "force_release":
			if h == nil || h.holder != e.Holder || h.epoch != e.Epoch {
				now := "nobody"
				if h != nil {
					now = fmt.Sprintf("%s at epoch %d", h.holder, h.epoch)
				}
				out = append(out, Violation{Subject: subject, At: e.At,
					Detail: fmt.Sprintf("%s accepted from %s at epoch %d while the holder was %s", e.Kind, e.Holder, e.Epoch, now)})
			}
			if e.Kind != "refresh" {
				delete(cur, e.Key)
			}
			if e.Kind == "force_release" {
				maxEpoch[e.Key] = max(maxEpoch[e.Key], e.Epoch+1)
			}
		default:
			out = append(out, Violation{Subject: subject, At: e.At, Detail: "unknown event kind " + e.Kind})
		}
	}
	return out
}

// CheckStaleJobWrites: a job's log has a write only while a run of it is open (after a
// claim or re-claim, before its complete, fail or release), and each carries the
// attempt of that run. The backend accepts a worker's write only with the live job token,
// which a close revokes and a re-claim replaces, so a write outside a run, or of an earlier
// attempt, is a superseded run's write that got through.
func CheckStaleJobWrites(s State) []Violation {
	var out []Violation
	current := map[string]int{}
	open := map[string]bool{}
	for _, e := range s.JobEvents {
		subject := "job " + e.JobID + " of " + e.Org
		switch {
		case slices.Contains(runOpens, e.Kind):
			if e.Attempt <= current[e.JobID] {
				out = append(out, Violation{Subject: subject, At: e.At,
					Detail: fmt.Sprintf("%s at attempt %d after attempt %d", e.Kind, e.Attempt, current[e.JobID])})
			}
			current[e.JobID], open[e.JobID] = e.Attempt, true
			continue
		case !open[e.JobID]:
			out = append(out, Violation{Subject: subject, At: e.At,
				Detail: fmt.Sprintf("%s event of attempt %d accepted while no run of the job was open", e.Kind, e.Attempt)})
		case e.Attempt != current[e.JobID]:
			out = append(out, Violation{Subject: subject, At: e.At,
				Detail: fmt.Sprintf("%s event of attempt %d accepted while attempt %d was current", e.Kind, e.Attempt, current[e.JobID])})
		}
		if slices.Contains(runCloses, e.Kind) {
			open[e.JobID] = false
		}
	}
	return out
}

// CheckFiles: every file the suite wrote is still there, byte for byte, or (for a file the
// system rewrites) still passes its kind's check.
func CheckFiles(s State) []Violation {
	var out []Violation
	for _, f := range s.Files {
		switch {
		case f.Err != nil:
			out = append(out, Violation{Subject: "file " + f.Path, Detail: "unreadable: " + f.Err.Error()})
		case f.Check != nil:
			if err := f.Check(f.Got); err != nil {
				out = append(out, Violation{Subject: "file " + f.Path, Detail: err.Error()})
			}
		case string(f.Got) != string(f.Want):
			out = append(out, Violation{Subject: "file " + f.Path,
				Detail: fmt.Sprintf("changed: %d bytes written, %d found (%s)", len(f.Want), len(f.Got), firstDifference(f.Want, f.Got))})
		}
	}
	return out
}

func firstDifference(a, b []byte) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("first difference at byte %d", i)
		}
	}
	return fmt.Sprintf("one is a prefix of the other, up to byte %d", min(len(a), len(b)))
}

// CheckOrphans: once every process stopped cleanly, a container left on the engine is a
// worker or dashboard unit kept for its instance's next start (as a production dispatcher
// leaves them), running no exec, at most one per name; and no process of the run is left.
func CheckOrphans(s State) []Violation {
	var out []Violation
	if s.ContainersErr != nil {
		out = append(out, Violation{Subject: "the engine", Detail: "containers could not be listed: " + s.ContainersErr.Error()})
	}
	seen := map[string]bool{}
	for _, c := range s.Containers {
		subject := "container " + c.Name
		switch {
		case c.Instance == "" || (c.Role != "worker" && c.Role != "dashboard"):
			out = append(out, Violation{Subject: subject, Detail: fmt.Sprintf("not a unit of an instance (instance %q, role %q, %s)", c.Instance, c.Role, c.State)})
		case c.Execs > 0:
			out = append(out, Violation{Subject: subject, Detail: fmt.Sprintf("%d execs still running after its dispatcher stopped", c.Execs)})
		}
		if seen[c.Name] {
			out = append(out, Violation{Subject: subject, Detail: "two containers of one name"})
		}
		seen[c.Name] = true
	}
	for _, p := range s.Processes {
		out = append(out, Violation{Subject: fmt.Sprintf("process %d", p.PID), Detail: "left running: " + p.Cmdline})
	}
	return out
}

// CheckMessages: every message the suite had accepted is in the mailbox as sent; a child
// that ended done acknowledged it and quoted it once in its summary (the scripted agent's
// child says what it heard); none was quoted twice, whatever the child's end.
func CheckMessages(s State) []Violation {
	var out []Violation
	rows := map[int64]Message{}
	for _, m := range s.Messages {
		rows[m.ID] = m
	}
	subs := map[string]Subagent{}
	for _, sa := range s.Subagents {
		subs[sa.Org+"/"+sa.ID] = sa
	}
	for _, sent := range s.Sent {
		subject := fmt.Sprintf("message %d to %s/%s", sent.ID, sent.Org, sent.Subagent)
		m, ok := rows[sent.ID]
		if !ok {
			out = append(out, Violation{Subject: subject, At: sent.At, Detail: "accepted but not in the mailbox"})
			continue
		}
		if m.Body != sent.Body || m.Sender != sent.Sender || m.Org != sent.Org || m.Subagent != sent.Subagent {
			out = append(out, Violation{Subject: subject, At: sent.At, Detail: fmt.Sprintf("stored as %q from %s to %s/%s", m.Body, m.Sender, m.Org, m.Subagent)})
		}
		sa, ok := subs[sent.Org+"/"+sent.Subagent]
		if !ok {
			out = append(out, Violation{Subject: subject, At: sent.At, Detail: "its subagent is unknown"})
			continue
		}
		quoted := strings.Count(sa.Summary, sent.Body)
		switch {
		case quoted > 1:
			out = append(out, Violation{Subject: subject, At: sa.EndedAt, Detail: fmt.Sprintf("processed %d times (the child's summary: %q)", quoted, sa.Summary)})
		case sa.Status == "done" && m.AckedAt.IsZero():
			out = append(out, Violation{Subject: subject, At: sa.EndedAt, Detail: fmt.Sprintf("lost: its child ended done without acknowledging it (%d deliveries)", m.Deliveries)})
		case sa.Status == "done" && quoted == 0:
			out = append(out, Violation{Subject: subject, At: sa.EndedAt, Detail: fmt.Sprintf("lost: acknowledged but its child ended done without it (summary %q)", sa.Summary)})
		case sa.Status == "running" || sa.Status == "cancelling":
			out = append(out, Violation{Subject: subject, Detail: "its child is still " + sa.Status + " after every process stopped"})
		}
	}
	return out
}

// CheckOperatorActions: every operator action the suite took left its record.
func CheckOperatorActions(s State) []Violation {
	var out []Violation
	subs := map[string]Subagent{}
	for _, sa := range s.Subagents {
		subs[sa.Org+"/"+sa.ID] = sa
	}
	for _, a := range s.Actions {
		subject := fmt.Sprintf("%s by %s", a.Kind, a.Operator)
		if a.Target != "" {
			subject += " of " + a.Target
		}
		found := false
		switch a.Kind {
		case "login", "add", "grant":
			for _, e := range s.OpEvents {
				if e.Operator == a.Operator && e.Kind == a.Kind && (a.Org == "" || e.Org == a.Org) && !e.At.Before(a.At.Add(-time.Second)) {
					found = true
				}
			}
		case "send":
			for _, m := range s.Messages {
				if m.Org == a.Org && m.Subagent == a.Target && m.Sender == "operator:"+a.Operator {
					found = true
				}
			}
		case "cancel":
			found = subs[a.Org+"/"+a.Target].CancelledBy == "operator:"+a.Operator
		case "force_release":
			for _, e := range s.LeaseEvents {
				if e.Kind == "force_release" && e.Key == a.Target && e.Actor == "operator:"+a.Operator {
					found = true
				}
			}
		default:
			out = append(out, Violation{Subject: subject, At: a.At, Detail: "an action the checker does not know"})
			continue
		}
		if !found {
			out = append(out, Violation{Subject: subject, At: a.At, Detail: "no record of it"})
		}
	}
	return out
}

// CheckProgress: every org completed a job after the last fault ended (each was given one),
// so no fault left an org unable to work: a home still full, a lease never freed, a
// backoff never ending.
func CheckProgress(s State) []Violation {
	var out []Violation
	for _, org := range s.Orgs {
		ok := false
		for _, e := range s.JobEvents {
			if e.Org == org && e.Kind == "complete" && e.At.After(s.LastFault) {
				ok = true
				break
			}
		}
		if !ok {
			detail := "completed no job after the last fault ended"
			failed := map[string]bool{}
			for _, e := range s.JobEvents {
				if e.Org == org && e.Kind == "fail" && e.At.After(s.LastFault) {
					failed[e.JobID] = true
				}
			}
			for _, j := range s.Jobs {
				if failed[j.ID] {
					detail += fmt.Sprintf("; job %s failed after it: %s", j.ID, j.Error)
					break
				}
			}
			out = append(out, Violation{Subject: "org " + org, Detail: detail, At: s.LastFault})
		}
	}
	return out
}

// CheckHostRecord: once every process stopped cleanly, the host's claim_attempts agree with
// the backend's log: every run the backend opened (a claim or re-claim) has its row, and
// every row has an outcome; an attempt the backend completed is recorded completed, and
// one recorded completed was completed at the backend.
func CheckHostRecord(s State) []Violation {
	var out []Violation
	type key struct {
		job     string
		attempt int
	}
	opened := map[key]JobEvent{}
	completed := map[key]bool{}
	for _, e := range s.JobEvents {
		switch {
		case slices.Contains(runOpens, e.Kind):
			opened[key{e.JobID, e.Attempt}] = e
		case e.Kind == "complete":
			completed[key{e.JobID, e.Attempt}] = true
		}
	}
	rows := map[key]Attempt{}
	for _, a := range s.Attempts {
		k := key{a.JobID, a.Attempt}
		rows[k] = a
		subject := fmt.Sprintf("job %s of %s attempt %d (%s)", a.JobID, a.Org, a.Attempt, a.Instance)
		switch {
		case a.Outcome == "":
			out = append(out, Violation{Subject: subject, At: a.ClaimedAt, Detail: fmt.Sprintf("claimed at %s, no outcome recorded (the backend's log: %s)",
				stamp(a.ClaimedAt), runLog(s.JobEvents, a.JobID, a.Attempt))})
		case completed[k] != (a.Outcome == "completed"):
			out = append(out, Violation{Subject: subject, At: a.FinishedAt, Detail: fmt.Sprintf("recorded %s, the backend's log: %s",
				outcomeOf(a), runLog(s.JobEvents, a.JobID, a.Attempt))})
		}
	}
	for k, e := range opened {
		if _, ok := rows[k]; !ok {
			out = append(out, Violation{Subject: fmt.Sprintf("job %s of %s attempt %d", k.job, e.Org, k.attempt), At: e.At,
				Detail: e.Kind + " in the backend's log, no claim_attempts row"})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// runLog is the kinds of a job's events at one attempt, with their times.
func runLog(events []JobEvent, job string, attempt int) string {
	var parts []string
	for _, e := range events {
		if e.JobID == job && e.Attempt == attempt && e.Kind != "progress" && e.Kind != "proposal" {
			parts = append(parts, e.Kind+"@"+stamp(e.At))
		}
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, " ")
}

// CheckOneAgentPerHome: in each home's state.db, no two agents' sessions (a job's or a chat
// turn's; a subagent's runs inside its parent's) were written at once: ordered by start,
// each begins after the one before it wrote its last message.
func CheckOneAgentPerHome(s State) []Violation {
	var out []Violation
	byOrg := map[string][]AgentSession{}
	for _, a := range s.Sessions {
		byOrg[a.Org] = append(byOrg[a.Org], a)
	}
	for org, ss := range byOrg {
		sort.Slice(ss, func(i, j int) bool { return ss[i].Start.Before(ss[j].Start) })
		last := 0
		for i := 1; i < len(ss); i++ {
			if ss[i].Start.Before(ss[last].End) {
				out = append(out, Violation{Subject: "the home of " + org, At: ss[i].Start,
					Detail: fmt.Sprintf("session %s (%s) began at %s while session %s (%s, from %s) wrote until %s",
						ss[i].ID, ss[i].Source, stamp(ss[i].Start), ss[last].ID, ss[last].Source, stamp(ss[last].Start), stamp(ss[last].End))})
			}
			if ss[i].End.After(ss[last].End) {
				last = i
			}
		}
	}
	return out
}
