package subagent

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"hermeshost/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type fixture struct {
	store *Store
	pool  *pgxpool.Pool
	reg   *prometheus.Registry
}

func newFixture(t *testing.T, opts Options) fixture {
	t.Helper()
	_, pool := pgtest.Schema(t)
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	s := New(pool, opts)
	t.Cleanup(s.Close)
	return fixture{store: s, pool: pool, reg: reg}
}

func (f fixture) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (f fixture) start(t *testing.T, org string, st Start) Handle {
	t.Helper()
	h, created, err := f.store.Start(context.Background(), org, st)
	if err != nil || !created {
		t.Fatalf("Start(%s, %s) = created %v, %v", org, st.ID, created, err)
	}
	return h
}

func TestStartIsIdempotentForTheSameChildAndRefusesAnother(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	st := Start{ID: "sa-1", JobID: "job-1", Session: "s1", ParentSession: "s0", Goal: "read the catalogue", Role: "researcher"}
	h := f.start(t, "acme", st)
	if h.Status != Running || h.Goal != st.Goal || h.JobID != "job-1" || h.ParentSession != "s0" || h.EndedAt != nil || !h.Live() {
		t.Fatalf("started handle = %+v", h)
	}
	again, created, err := f.store.Start(ctx, "acme", st)
	if err != nil || created || again.StartedAt != h.StartedAt {
		t.Fatalf("repeated start = %+v created %v, %v; want the same handle back", again, created, err)
	}
	other := st
	other.Goal = "something else"
	if _, _, err := f.store.Start(ctx, "acme", other); !errors.Is(err, ErrConflict) {
		t.Fatalf("start with the same id and another goal: %v, want ErrConflict", err)
	}
	if got, _ := f.store.Get(ctx, "acme", "sa-1"); got.Goal != st.Goal {
		t.Fatalf("a refused start changed the handle: %+v", got)
	}
	if n := testutil.ToFloat64(f.store.metrics.transitions.WithLabelValues(Running)); n != 1 {
		t.Fatalf("running transitions = %v, want 1", n)
	}
}

func TestBadInputIsRefusedAndWritesNothing(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	good := Start{ID: "sa-1", Goal: "g"}
	bad := []struct {
		name string
		org  string
		st   Start
	}{
		{"empty id", "acme", Start{Goal: "g"}},
		{"id with a slash", "acme", Start{ID: "a/b", Goal: "g"}},
		{"id too long", "acme", Start{ID: strings.Repeat("a", MaxIDLen+1), Goal: "g"}},
		{"no goal", "acme", Start{ID: "sa-1"}},
		{"goal too long", "acme", Start{ID: "sa-1", Goal: strings.Repeat("é", MaxGoalLen+1)}},
		{"goal with NUL", "acme", Start{ID: "sa-1", Goal: "a\x00b"}},
		{"goal not UTF-8", "acme", Start{ID: "sa-1", Goal: "\xff"}},
		{"bad job id", "acme", Start{ID: "sa-1", JobID: "../x", Goal: "g"}},
		{"bad org", "Acme Corp", good},
		{"empty org", "", good},
	}
	for _, c := range bad {
		if _, _, err := f.store.Start(ctx, c.org, c.st); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Start = %v, want ErrInvalid", c.name, err)
		}
	}
	f.start(t, "acme", good)
	if _, err := f.store.Send(ctx, "acme", "sa-1", "op", ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty message: %v", err)
	}
	if _, err := f.store.Send(ctx, "acme", "sa-1", "op", strings.Repeat("x", MaxBodyLen+1)); !errors.Is(err, ErrInvalid) {
		t.Errorf("huge message: %v", err)
	}
	if _, err := f.store.Send(ctx, "acme", "sa-1", "", "hi"); !errors.Is(err, ErrInvalid) {
		t.Errorf("no sender: %v", err)
	}
	if _, err := f.store.Stop(ctx, "acme", "sa-1", Cancelled, ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("stop as cancelled: %v (a child reports done or failed)", err)
	}
	if _, err := f.store.Cancel(ctx, "acme", "sa-1", "", ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("cancel without an actor: %v", err)
	}
	if _, err := f.store.Drain(ctx, "acme", "sa-1", MaxWait+time.Second); !errors.Is(err, ErrInvalid) {
		t.Errorf("drain waiting too long: %v", err)
	}
	if _, err := f.store.Ack(ctx, "acme", "sa-1", nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty ack: %v", err)
	}
	if _, err := f.store.List(ctx, "acme", ListParams{Status: "zombie"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("list by an unknown status: %v", err)
	}
	if _, err := f.store.List(ctx, "acme", ListParams{Limit: MaxListLimit + 1}); !errors.Is(err, ErrInvalid) {
		t.Errorf("list with a huge limit: %v", err)
	}
	if n := f.count(t, "subagents"); n != 1 {
		t.Fatalf("%d handles after the refusals, want the one good start", n)
	}
	if n := f.count(t, "subagent_messages"); n != 0 {
		t.Fatalf("%d messages after refused sends", n)
	}
	if h, _ := f.store.Get(ctx, "acme", "sa-1"); h.Status != Running {
		t.Fatalf("refused calls changed the handle: %+v", h)
	}
}

func TestAnOrgCannotReachAnotherOrgsChild(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	f.start(t, "acme", Start{ID: "sa-1", JobID: "job-a", Goal: "acme's"})
	// The same id in another org is another child.
	f.start(t, "globex", Start{ID: "sa-1", JobID: "job-b", Goal: "globex's"})
	if _, err := f.store.Send(ctx, "acme", "sa-1", "op", "for acme"); err != nil {
		t.Fatal(err)
	}
	box, err := f.store.Drain(ctx, "globex", "sa-1", 0)
	if err != nil || len(box.Messages) != 0 {
		t.Fatalf("globex's child drained %+v, %v: acme's message leaked", box, err)
	}
	if _, err := f.store.Cancel(ctx, "globex", "sa-1", "op", ""); err != nil {
		t.Fatal(err)
	}
	if h, _ := f.store.Get(ctx, "acme", "sa-1"); h.Status != Running || h.Goal != "acme's" {
		t.Fatalf("globex's cancel reached acme's child: %+v", h)
	}
	if n, err := f.store.FailJob(ctx, "globex", "job-a", "gone"); err != nil || n != 0 {
		t.Fatalf("globex failing acme's job ended %d children, %v", n, err)
	}
	for _, call := range []func() error{
		func() error { _, err := f.store.Get(ctx, "initech", "sa-1"); return err },
		func() error { _, err := f.store.Send(ctx, "initech", "sa-1", "op", "x"); return err },
		func() error { _, err := f.store.Cancel(ctx, "initech", "sa-1", "op", ""); return err },
		func() error { _, err := f.store.Stop(ctx, "initech", "sa-1", Done, ""); return err },
		func() error { _, err := f.store.Drain(ctx, "initech", "sa-1", 0); return err },
		func() error { _, err := f.store.Ack(ctx, "initech", "sa-1", []int64{1}); return err },
		func() error { _, err := f.store.Messages(ctx, "initech", "sa-1", 10); return err },
	} {
		if err := call(); !errors.Is(err, ErrNotFound) {
			t.Errorf("an org without the child got %v, want ErrNotFound", err)
		}
	}
	if hs, _ := f.store.List(ctx, "acme", ListParams{}); len(hs) != 1 || hs[0].Goal != "acme's" {
		t.Fatalf("acme lists %+v", hs)
	}
}

func TestUnacknowledgedMessagesAreRedeliveredUntilAcked(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	f.start(t, "acme", Start{ID: "sa-1", Goal: "g"})
	m1, err := f.store.Send(ctx, "acme", "sa-1", "operator:ada", "first")
	if err != nil {
		t.Fatal(err)
	}
	m2, err := f.store.Send(ctx, "acme", "sa-1", "operator:ada", "second")
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := f.store.Get(ctx, "acme", "sa-1"); h.Pending != 2 {
		t.Fatalf("pending = %d, want 2", h.Pending)
	}
	box, err := f.store.Drain(ctx, "acme", "sa-1", 0)
	if err != nil || box.Stop || len(box.Messages) != 2 || box.Messages[0].ID != m1.ID || box.Messages[1].Body != "second" ||
		box.Messages[0].Deliveries != 1 || box.Messages[0].Sender != "operator:ada" {
		t.Fatalf("first drain = %+v, %v", box, err)
	}
	// Not acknowledged (the child died before it could): handed out again, same ids.
	box, err = f.store.Drain(ctx, "acme", "sa-1", 0)
	if err != nil || len(box.Messages) != 2 || box.Messages[0].ID != m1.ID || box.Messages[0].Deliveries != 2 {
		t.Fatalf("second drain = %+v, %v; want both again", box, err)
	}
	if n := testutil.ToFloat64(f.store.metrics.redeliveries); n != 2 {
		t.Fatalf("redeliveries = %v, want 2", n)
	}
	if n, err := f.store.Ack(ctx, "acme", "sa-1", []int64{m1.ID}); err != nil || n != 1 {
		t.Fatalf("ack = %d, %v", n, err)
	}
	if n, err := f.store.Ack(ctx, "acme", "sa-1", []int64{m1.ID, 999999}); err != nil || n != 0 {
		t.Fatalf("repeated ack = %d, %v; want 0 new", n, err)
	}
	box, err = f.store.Drain(ctx, "acme", "sa-1", 0)
	if err != nil || len(box.Messages) != 1 || box.Messages[0].ID != m2.ID {
		t.Fatalf("drain after the ack = %+v, %v; want only the second", box, err)
	}
	all, err := f.store.Messages(ctx, "acme", "sa-1", 10)
	if err != nil || len(all) != 2 || all[0].AckedAt == nil || all[1].AckedAt != nil || all[1].Deliveries != 3 {
		t.Fatalf("mailbox = %+v, %v", all, err)
	}
	if h, _ := f.store.Get(ctx, "acme", "sa-1"); h.Pending != 1 {
		t.Fatalf("pending = %d, want 1", h.Pending)
	}
}

func TestAWaitingDrainIsWokenBySendAndCancel(t *testing.T) {
	// With an hour's poll only a notification can wake the waiter within the test.
	f := newFixture(t, Options{Poll: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f.start(t, "acme", Start{ID: "sa-1", Goal: "g"})
	// An empty mailbox with no wait answers at once.
	if box, err := f.store.Drain(ctx, "acme", "sa-1", 0); err != nil || box.Stop || len(box.Messages) != 0 || box.Status != Running {
		t.Fatalf("empty drain = %+v, %v", box, err)
	}
	type result struct {
		box Mailbox
		err error
	}
	wait := func() chan result {
		out := make(chan result, 1)
		go func() {
			box, err := f.store.Drain(ctx, "acme", "sa-1", MaxWait)
			out <- result{box, err}
		}()
		return out
	}
	// The listener is up once a Drain has subscribed; a first drain starts it.
	f.store.ensureListener(ctx)
	got := wait()
	waitForSubscriber(t, f.store, "acme/sa-1")
	if _, err := f.store.Send(ctx, "acme", "sa-1", "op", "wake up"); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || len(r.box.Messages) != 1 || r.box.Messages[0].Body != "wake up" {
		t.Fatalf("woken drain = %+v, %v", r.box, r.err)
	}
	if _, err := f.store.Ack(ctx, "acme", "sa-1", []int64{r.box.Messages[0].ID}); err != nil {
		t.Fatal(err)
	}
	got = wait()
	waitForSubscriber(t, f.store, "acme/sa-1")
	if _, err := f.store.Cancel(ctx, "acme", "sa-1", "operator:ada", "wrong goal"); err != nil {
		t.Fatal(err)
	}
	r = <-got
	if r.err != nil || !r.box.Stop || r.box.Status != Cancelling || r.box.CancelReason != "wrong goal" {
		t.Fatalf("drain woken by the cancel = %+v, %v", r.box, r.err)
	}
}

// waitForSubscriber returns once a Drain is subscribed to payload (the listener's own
// state, so no sleep guesses at it).
func waitForSubscriber(t *testing.T, s *Store, payload string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !s.listener.Subscribed(payload) {
		if time.Now().After(deadline) {
			t.Fatalf("no drain subscribed to %s", payload)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCancelThenStopEndsCancelled(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	f.start(t, "acme", Start{ID: "sa-1", Goal: "g"})
	h, err := f.store.Cancel(ctx, "acme", "sa-1", "operator:ada", "not needed")
	if err != nil || h.Status != Cancelling || h.CancelledBy != "operator:ada" || h.CancelReason != "not needed" || !h.Live() {
		t.Fatalf("cancel = %+v, %v", h, err)
	}
	if h, err := f.store.Cancel(ctx, "acme", "sa-1", "operator:bob", "again"); err != nil || h.CancelledBy != "operator:ada" {
		t.Fatalf("second cancel = %+v, %v; want a no-op", h, err)
	}
	if _, err := f.store.Send(ctx, "acme", "sa-1", "op", "too late"); !errors.Is(err, ErrNotLive) {
		t.Fatalf("send while cancelling: %v, want ErrNotLive", err)
	}
	box, err := f.store.Drain(ctx, "acme", "sa-1", time.Minute)
	if err != nil || !box.Stop {
		t.Fatalf("drain while cancelling = %+v, %v; want stop at once", box, err)
	}
	// The child reports done as it winds down: it ends cancelled, with its summary.
	h, err = f.store.Stop(ctx, "acme", "sa-1", Done, "stopped half-way")
	if err != nil || h.Status != Cancelled || h.Summary != "stopped half-way" || h.EndedAt == nil || h.Live() {
		t.Fatalf("stop after cancel = %+v, %v", h, err)
	}
	if _, err := f.store.Cancel(ctx, "acme", "sa-1", "op", ""); !errors.Is(err, ErrEnded) {
		t.Fatalf("cancel of an ended child: %v, want ErrEnded", err)
	}
	if h, err := f.store.Stop(ctx, "acme", "sa-1", Done, "stopped half-way"); err != nil || h.Status != Cancelled {
		t.Fatalf("repeated stop hook = %+v, %v; want a no-op", h, err)
	}
}

func TestStopEndsARunningChildOnce(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	f.start(t, "acme", Start{ID: "sa-1", Goal: "g"})
	if _, err := f.store.Send(ctx, "acme", "sa-1", "op", "unread"); err != nil {
		t.Fatal(err)
	}
	h, err := f.store.Stop(ctx, "acme", "sa-1", Done, "found 3 products")
	if err != nil || h.Status != Done || h.Summary != "found 3 products" || h.EndedAt == nil {
		t.Fatalf("stop = %+v, %v", h, err)
	}
	if h, err := f.store.Stop(ctx, "acme", "sa-1", Done, "found 3 products"); err != nil || h.Status != Done {
		t.Fatalf("repeated stop = %+v, %v", h, err)
	}
	if _, err := f.store.Stop(ctx, "acme", "sa-1", Failed, "boom"); !errors.Is(err, ErrEnded) {
		t.Fatalf("a second, different stop: %v, want ErrEnded", err)
	}
	if _, err := f.store.Send(ctx, "acme", "sa-1", "op", "late"); !errors.Is(err, ErrEnded) {
		t.Fatalf("send to an ended child: %v, want ErrEnded", err)
	}
	box, err := f.store.Drain(ctx, "acme", "sa-1", time.Minute)
	if err != nil || !box.Stop || box.Status != Done || len(box.Messages) != 1 {
		t.Fatalf("drain of an ended child = %+v, %v; want stop, with the unread message", box, err)
	}
	if n := testutil.ToFloat64(f.store.metrics.transitions.WithLabelValues(Done)); n != 1 {
		t.Fatalf("done transitions = %v, want 1", n)
	}
}

func TestFailJobEndsOnlyThatJobsLiveChildren(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	f.start(t, "acme", Start{ID: "a", JobID: "job-1", Goal: "g"})
	f.start(t, "acme", Start{ID: "b", JobID: "job-1", ParentSubagent: "a", Goal: "g"})
	f.start(t, "acme", Start{ID: "c", JobID: "job-1", Goal: "g"})
	f.start(t, "acme", Start{ID: "d", JobID: "job-2", Goal: "g"})
	f.start(t, "acme", Start{ID: "e", Session: "chat-1", Goal: "g"})
	if _, err := f.store.Stop(ctx, "acme", "c", Done, "ok"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Cancel(ctx, "acme", "b", "op", ""); err != nil {
		t.Fatal(err)
	}
	n, err := f.store.FailJob(ctx, "acme", "job-1", "the worker of job job-1 died")
	if err != nil || n != 2 {
		t.Fatalf("FailJob = %d, %v; want a and b", n, err)
	}
	want := map[string]string{"a": Failed, "b": Failed, "c": Done, "d": Running, "e": Running}
	for id, status := range want {
		h, err := f.store.Get(ctx, "acme", id)
		if err != nil || h.Status != status {
			t.Errorf("%s = %+v, %v; want %s", id, h, err, status)
		}
		if id == "a" && h.Summary != "the worker of job job-1 died" {
			t.Errorf("a's summary = %q", h.Summary)
		}
	}
	live, err := f.store.List(ctx, "acme", ListParams{Status: "live"})
	if err != nil || len(live) != 2 {
		t.Fatalf("live = %+v, %v", live, err)
	}
	of1, err := f.store.List(ctx, "acme", ListParams{JobID: "job-1"})
	if err != nil || len(of1) != 3 {
		t.Fatalf("job-1's children = %+v, %v", of1, err)
	}
	if n, err := f.store.FailJob(ctx, "acme", "job-1", "again"); err != nil || n != 0 {
		t.Fatalf("second FailJob = %d, %v", n, err)
	}
}

func TestAFullMailboxRefusesMore(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	f.start(t, "acme", Start{ID: "sa-1", Goal: "g"})
	if _, err := f.pool.Exec(ctx, `INSERT INTO subagent_messages (org, subagent_id, sender, body)
SELECT 'acme', 'sa-1', 'op', 'm' || i FROM generate_series(1, $1) i`, MaxPending); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Send(ctx, "acme", "sa-1", "op", "one too many"); !errors.Is(err, ErrMailboxFull) {
		t.Fatalf("send to a full mailbox: %v", err)
	}
	box, err := f.store.Drain(ctx, "acme", "sa-1", 0)
	if err != nil || len(box.Messages) != MaxPending {
		t.Fatalf("drain = %d messages, %v", len(box.Messages), err)
	}
	ids := make([]int64, 0, len(box.Messages))
	for _, m := range box.Messages {
		ids = append(ids, m.ID)
	}
	if n, err := f.store.Ack(ctx, "acme", "sa-1", ids); err != nil || n != MaxPending {
		t.Fatalf("ack = %d, %v", n, err)
	}
	if _, err := f.store.Send(ctx, "acme", "sa-1", "op", "room again"); err != nil {
		t.Fatalf("send after the acks: %v", err)
	}
}

// Sends racing the stop hook: each is either accepted and in the mailbox, or refused as
// ended; once the stop has returned no send is accepted.
func TestSendsRacingAStopAreStoredOrRefused(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	f.start(t, "acme", Start{ID: "sa-1", Goal: "g"})
	var wg sync.WaitGroup
	var mu sync.Mutex
	accepted := map[int64]bool{}
	first := make(chan struct{})
	var once sync.Once
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m, err := f.store.Send(ctx, "acme", "sa-1", "op", "x")
				if errors.Is(err, ErrEnded) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				accepted[m.ID] = true
				mu.Unlock()
				once.Do(func() { close(first) })
			}
		}()
	}
	<-first
	if _, err := f.store.Stop(ctx, "acme", "sa-1", Done, ""); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if _, err := f.store.Send(ctx, "acme", "sa-1", "op", "after"); !errors.Is(err, ErrEnded) {
		t.Fatalf("send after the stop: %v", err)
	}
	all, err := f.store.Messages(ctx, "acme", "sa-1", MaxPending)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(accepted) {
		t.Fatalf("%d messages stored, %d sends accepted", len(all), len(accepted))
	}
	for _, m := range all {
		if !accepted[m.ID] {
			t.Fatalf("message %d stored but its send was refused", m.ID)
		}
	}
}
