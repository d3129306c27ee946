package dispatch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"hermeshost/dispatch/runtime"
	"hermeshost/sartiq"
)

// brokenStream is a fault injector around a real runtime: the first exec of org runs on
// while the dispatcher is told, as soon as the agent has started, that the exec's stream
// broke. The program is neither killed nor told: its stdin stays open and its output goes
// nowhere, the worst an engine's broken stream can leave. It keeps the job token the exec
// was given, as the run it cut off still holds it.
type brokenStream struct {
	runtime.Runtime
	org string

	mu     sync.Mutex
	cut    bool
	token  string
	ended  chan struct{} // closed when the cut-off program has really exited
	status runtime.ExitStatus
}

var errStreamBroke = errors.New("exec stream broke (injected fault)")

func (b *brokenStream) Exec(ctx context.Context, org string, cmd runtime.Command) (runtime.ExitStatus, error) {
	b.mu.Lock()
	first := org == b.org && !b.cut
	b.cut = b.cut || first
	b.mu.Unlock()
	if !first {
		return b.Runtime.Exec(ctx, org, cmd)
	}
	for _, kv := range cmd.Env {
		if v, ok := strings.CutPrefix(kv, "SARTIQ_TOKEN="); ok {
			b.token = v
		}
	}
	// The assignment is the JSON value the dispatcher's stdin begins with; the rest (which
	// would end when the dispatcher asks the worker to stop) never reaches the program.
	var assignment json.RawMessage
	if err := json.NewDecoder(cmd.Stdin).Decode(&assignment); err != nil {
		return runtime.ExitStatus{}, err
	}
	stdinR, stdinW := io.Pipe()
	go func() { _, _ = stdinW.Write(assignment) }() // and then nothing, never an EOF
	started := make(chan struct{})
	out := &cutOff{to: cmd.Stdout, started: started}
	b.ended = make(chan struct{})
	go func() {
		defer close(b.ended)
		defer stdinW.Close()
		st, _ := b.Runtime.Exec(context.WithoutCancel(ctx), org, runtime.Command{Args: cmd.Args, Env: cmd.Env, Stdin: stdinR, Stdout: out, Stderr: io.Discard})
		b.status = st
	}()
	select {
	case <-started:
		return runtime.ExitStatus{}, errStreamBroke
	case <-b.ended:
		return b.status, nil
	case <-ctx.Done():
		return runtime.ExitStatus{}, ctx.Err()
	}
}

// cutOff passes the program's output on until its agent_start line, then drops the rest.
type cutOff struct {
	mu      sync.Mutex
	to      io.Writer
	seen    []byte
	started chan struct{}
	cut     bool
}

func (c *cutOff) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return len(p), nil
	}
	if _, err := c.to.Write(p); err != nil {
		return 0, err
	}
	c.seen = append(c.seen, p...)
	if i := bytes.LastIndexByte(c.seen, '\n'); i >= 0 {
		if bytes.Contains(c.seen[:i], []byte(`"event":"agent_start"`)) {
			c.cut = true
			close(c.started)
		}
		c.seen = c.seen[i+1:]
	}
	return len(p), nil
}

// A run that only lost its exec stream (its worker and agent still running, its stdin
// still open) is ended at once like a dead one, and cannot write after the next attempt
// starts: the release revoked its token, so the backend refuses it (its heartbeat's 409
// stops it), and the home lock keeps a second agent off the home until it has exited. The
// job completes once; the crash is counted once.
func TestARunThatLostItsExecStreamCannotWriteAfterTheNextAttemptStarts(t *testing.T) {
	f := newFixture(t, true)
	cut := &brokenStream{Runtime: f.cfg.Runtime, org: "acme"}
	f.cfg.Runtime = cut
	// The first attempt's agent stalls before its first write, still heartbeating.
	d, job := stallAcme(t, f)
	ctx := t.Context()
	waitFor(t, 30*time.Second, "acme's first attempt to be ended", func() bool {
		a := attemptsOf(t, f, job)
		return len(a) == 1 && a[0].Outcome != ""
	})
	if a := attemptsOf(t, f, job)[0]; a.Outcome != "crashed" || !strings.Contains(a.Reason, errStreamBroke.Error()) {
		t.Fatalf("acme's first attempt: %+v, want crashed with the broken stream", a)
	}
	if kinds := runKinds(t, f, job); !slices.Equal(kinds, []string{"claim@1", "crash@1", "release@1"}) {
		t.Fatalf("after the broken stream the job's log reads %v, want claim@1 crash@1 release@1", kinds)
	}
	writeKnobs(t, f, "acme", nil)
	d.Wait() // the delivery has given back the org's slot

	// The cut-off run is still there, holding the old token; the next attempt is claimed.
	if _, err := d.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	if kinds := runKinds(t, f, job); !slices.Contains(kinds, "claim@2") {
		t.Fatalf("the next cycle did not claim the job again: %v\n%s", kinds, f.logs.String())
	}
	old, err := sartiq.New(f.cfg.APIURL, cut.token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Heartbeat(ctx, job, nil); !sartiq.IsConflict(err) && !sartiq.IsUnauthorized(err) {
		t.Errorf("a heartbeat with the cut-off run's token after the next claim: %v, want refused", err)
	}
	if _, err := old.AddEvent(ctx, job, sartiq.EventRequest{Kind: "note", Message: "late"}); err == nil {
		t.Error("an event with the cut-off run's token was accepted after the next claim")
	}
	if _, err := old.Complete(ctx, job, map[string]any{"late": true}); err == nil {
		t.Error("a completion with the cut-off run's token was accepted after the next claim")
	}
	// Refused at its next heartbeat, the cut-off worker stops its agent and exits.
	select {
	case <-cut.ended:
	case <-time.After(20 * time.Second):
		t.Fatal("the cut-off run-job did not exit after its token was revoked")
	}
	d.Wait()
	cycleUntilDone(t, f, d, 40*time.Second)

	events, err := f.cfg.Bot.ListEvents(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	released := slices.IndexFunc(events, func(e sartiq.Event) bool { return e.Kind == sartiq.EventRelease && e.Attempt == 1 })
	for _, e := range events[released+1:] {
		if e.Attempt == 1 {
			t.Errorf("the backend accepted %s from attempt 1 after it was released: %+v", e.Kind, e)
		}
	}
	var completes []string
	for _, e := range events {
		if e.Kind == sartiq.EventComplete {
			completes = append(completes, e.Kind)
		}
	}
	if len(completes) != 1 || jobStatus(t, f, job) != sartiq.StatusCompleted {
		t.Errorf("the job completed %d times, status %s; want once, COMPLETED", len(completes), jobStatus(t, f, job))
	}
	last := events[len(events)-1].Attempt
	if n := func() int {
		c := 0
		for _, e := range events {
			if e.Kind == sartiq.EventCrash {
				c++
			}
		}
		return c
	}(); n != 1 {
		t.Errorf("%d crash events, want 1 (the broken stream's)", n)
	}
	// Attempts after the first either completed or were released uncounted (a claim that
	// found the cut-off run still holding the home's lock releases the job).
	for _, a := range attemptsOf(t, f, job) {
		if a.Attempt == 1 {
			continue
		}
		if a.Outcome != "completed" && !(a.Outcome == "released" && strings.Contains(a.Reason, "another agent is running")) {
			t.Errorf("attempt %d of the job: %+v, want completed (or released while the home was locked)", a.Attempt, a)
		}
		if a.Outcome == "completed" && a.Attempt != last {
			t.Errorf("attempt %d completed, but the job's last attempt is %d", a.Attempt, last)
		}
	}
	checkOneRunPerOrg(t, f.backend.DB)
}
