package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"hermeshost/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type fixture struct {
	t     *testing.T
	store *Store
	pool  *pgxpool.Pool
}

func newFixture(t *testing.T, opts Options) fixture {
	t.Helper()
	_, pool := pgtest.Schema(t)
	s := New(pool, opts)
	t.Cleanup(s.Close)
	return fixture{t: t, store: s, pool: pool}
}

func (f fixture) job(id string) Job {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT `+jobColumns+` FROM mirror_jobs WHERE job_id = $1`, id)
	if err != nil {
		f.t.Fatal(err)
	}
	j, err := pgx.CollectExactlyOneRow(rows, scanJob)
	if err != nil {
		f.t.Fatalf("job %s: %v", id, err)
	}
	return j
}

func (f fixture) claim(org, job string, attempt int) int64 {
	f.t.Helper()
	id, err := f.store.Claimed(context.Background(), nil, Claim{JobID: job, Org: org, Type: "sync", Attempt: attempt, Kind: "claim", Data: map[string]string{"instance": "i1"}})
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

func (f fixture) event(org, job, kind string) int64 {
	f.t.Helper()
	id, err := f.store.Event(context.Background(), nil, org, job, 1, kind, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

func ids(events []Event) []int64 {
	out := []int64{}
	for _, e := range events {
		out = append(out, e.ID)
	}
	return out
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestWritesOfAJobsLife(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	claim := f.claim("acme", "j1", 1)
	if j := f.job("j1"); j.Org != "acme" || j.Type != "sync" || j.Status != "CLAIMED" || j.Attempt != 1 {
		t.Fatalf("claimed: %+v", j)
	}
	if err := f.store.Running(ctx, nil, "j1"); err != nil {
		t.Fatal(err)
	}
	if j := f.job("j1"); j.Status != "RUNNING" {
		t.Fatalf("running: %+v", j)
	}
	progress, err := f.store.Event(ctx, nil, "acme", "j1", 1, "progress", json.RawMessage(`{"step": 2}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.store.Finished(ctx, nil, "j1", "COMPLETED", "", []byte(`{"ok": true}`)); err != nil {
		t.Fatal(err)
	}
	if j := f.job("j1"); j.Status != "COMPLETED" || j.Error != "" || string(j.Result) != `{"ok": true}` {
		t.Fatalf("finished: %+v", j)
	}
	// An outcome without a result keeps the one recorded; a reason is the error.
	if err := f.store.Finished(ctx, nil, "j1", "FAILED", "gave up", nil); err != nil {
		t.Fatal(err)
	}
	if j := f.job("j1"); j.Status != "FAILED" || j.Error != "gave up" || string(j.Result) != `{"ok": true}` {
		t.Fatalf("failed: %+v", j)
	}
	// A re-claim resets the status and error, at the new attempt.
	reclaim, err := f.store.Claimed(ctx, nil, Claim{JobID: "j1", Org: "acme", Type: "sync", Attempt: 2, Kind: "reclaim"})
	if err != nil {
		t.Fatal(err)
	}
	if j := f.job("j1"); j.Status != "CLAIMED" || j.Error != "" || j.Attempt != 2 {
		t.Fatalf("re-claimed: %+v", j)
	}
	// Reconciling an older attempt, or with no status, leaves the latest alone.
	for _, r := range []struct {
		attempt int
		status  string
	}{{1, "COMPLETED"}, {2, ""}} {
		if err := f.store.Reconciled(ctx, nil, "j1", r.attempt, r.status); err != nil {
			t.Fatal(err)
		}
		if j := f.job("j1"); j.Status != "CLAIMED" {
			t.Fatalf("reconciled attempt %d to %q: %+v", r.attempt, r.status, j)
		}
	}
	if err := f.store.Reconciled(ctx, nil, "j1", 2, "QUEUED"); err != nil {
		t.Fatal(err)
	}
	if j := f.job("j1"); j.Status != "QUEUED" {
		t.Fatalf("reconciled: %+v", j)
	}

	_, events, truncated, err := f.store.Job(ctx, "acme", "j1", 10)
	if err != nil || truncated {
		t.Fatal(truncated, err)
	}
	if !equal(ids(events), []int64{claim, progress, reclaim}) {
		t.Fatalf("events %v", ids(events))
	}
	want := []struct{ kind, data string }{{"claim", `{"instance": "i1"}`}, {"progress", `{"step": 2}`}, {"reclaim", `{}`}}
	for i, e := range events {
		if e.Kind != want[i].kind || string(e.Data) != want[i].data || e.JobID != "j1" {
			t.Fatalf("event %d: %+v", i, e)
		}
	}
}

func TestWritesInARolledBackTransactionLeaveNothing(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	f.claim("acme", "j1", 1)
	refused := errors.New("fence refused")
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		if err := f.store.Running(ctx, tx, "j1"); err != nil {
			return err
		}
		if _, err := f.store.Event(ctx, tx, "acme", "j1", 1, "start", nil); err != nil {
			return err
		}
		if _, err := f.store.Claimed(ctx, tx, Claim{JobID: "j2", Org: "acme", Type: "sync", Attempt: 1, Kind: "claim"}); err != nil {
			return err
		}
		return refused
	})
	if !errors.Is(err, refused) {
		t.Fatal(err)
	}
	if j := f.job("j1"); j.Status != "CLAIMED" {
		t.Fatalf("status written: %+v", j)
	}
	events, err := f.store.Since(ctx, "acme", 0, MaxPage, 0)
	if err != nil || len(events) != 1 {
		t.Fatalf("events %+v, %v", events, err)
	}
	if _, _, _, err := f.store.Job(ctx, "acme", "j2", 10); !errors.Is(err, ErrNotFound) {
		t.Fatalf("j2: %v", err)
	}
}

func TestSinceIsTheOrgsEventsResumableFromAnID(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	var acme, globex []int64
	acme = append(acme, f.claim("acme", "a1", 1))
	globex = append(globex, f.claim("globex", "g1", 1))
	for range 4 {
		acme = append(acme, f.event("acme", "a1", "progress"))
		globex = append(globex, f.event("globex", "g1", "progress"))
	}
	got, err := f.store.Since(ctx, "acme", 0, MaxPage, 0)
	if err != nil || !equal(ids(got), acme) {
		t.Fatalf("acme from 0: %v, %v; want %v", ids(got), err, acme)
	}
	// Pages of two, each resuming from the last id seen, give every event once.
	var paged []int64
	var after int64
	for {
		page, err := f.store.Since(ctx, "globex", after, 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		paged = append(paged, ids(page)...)
		after = page[len(page)-1].ID
	}
	if !equal(paged, globex) {
		t.Fatalf("globex paged %v, want %v", paged, globex)
	}
	if got, err := f.store.Since(ctx, "initech", 0, MaxPage, 0); err != nil || len(got) != 0 {
		t.Fatalf("an org without jobs: %v, %v", got, err)
	}
	for _, bad := range []struct {
		limit int
		wait  time.Duration
	}{{0, 0}, {MaxPage + 1, 0}, {1, -time.Millisecond}, {1, MaxWait + time.Millisecond}} {
		if _, err := f.store.Since(ctx, "acme", 0, bad.limit, bad.wait); err == nil {
			t.Fatalf("limit %d wait %s accepted", bad.limit, bad.wait)
		}
	}
}

// The poll is an hour, so only the notification of the insert can end the wait in time.
func TestSinceIsWokenByTheNotifyOfItsOrgsEvent(t *testing.T) {
	f := newFixture(t, Options{Poll: time.Hour})
	ctx := context.Background()
	last := f.claim("acme", "a1", 1)
	f.claim("globex", "g1", 1)

	type answer struct {
		events []Event
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		events, err := f.store.Since(ctx, "acme", last, MaxPage, 30*time.Second)
		done <- answer{events, err}
	}()
	l := f.store.ensureListener(ctx)
	for !l.Subscribed("acme") {
		select {
		case a := <-done:
			t.Fatalf("returned before waiting: %+v", a)
		case <-time.After(time.Millisecond):
		}
	}
	// Another org's event neither wakes it into an answer nor shows in it.
	f.event("globex", "g1", "progress")
	start := time.Now()
	want := f.event("acme", "a1", "start")
	a := <-done
	if a.err != nil || !equal(ids(a.events), []int64{want}) {
		t.Fatalf("woken with %v, %v; want [%d]", ids(a.events), a.err, want)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("woken after %s", waited)
	}
}

func TestSinceEndsEmptyWithTheWaitOrTheContext(t *testing.T) {
	f := newFixture(t, Options{Poll: 5 * time.Millisecond})
	last := f.claim("acme", "a1", 1)
	events, err := f.store.Since(context.Background(), "acme", last, MaxPage, 20*time.Millisecond)
	if err != nil || len(events) != 0 {
		t.Fatalf("%v, %v", events, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.store.Since(ctx, "acme", last, MaxPage, time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestJobsAreTheOrgsKeysetPaged(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	at := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	for _, j := range []struct {
		org, id string
		sec     int
	}{{"acme", "a1", 0}, {"acme", "a2", 1}, {"acme", "a3", 1}, {"globex", "g1", 2}, {"acme", "a4", 3}} {
		f.claim(j.org, j.id, 1)
		if _, err := f.pool.Exec(ctx, `UPDATE mirror_jobs SET updated_at = $2 WHERE job_id = $1`, j.id, at.Add(time.Duration(j.sec)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	var after *Cursor
	for {
		page, err := f.store.Jobs(ctx, "acme", after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, j := range page {
			got = append(got, j.ID)
		}
		last := page[len(page)-1]
		after = &Cursor{UpdatedAt: last.UpdatedAt, JobID: last.ID}
	}
	if want := []string{"a4", "a3", "a2", "a1"}; len(got) != len(want) || got[0] != "a4" || got[1] != "a3" || got[2] != "a2" || got[3] != "a1" {
		t.Fatalf("acme's jobs %v, want %v", got, want)
	}
	if _, _, _, err := f.store.Job(ctx, "acme", "g1", 10); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another org's job: %v", err)
	}
}

func TestJobKeepsTheNewestEvents(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	f.claim("acme", "a1", 1)
	var newest []int64
	for i := range 5 {
		id := f.event("acme", "a1", "progress")
		if i >= 2 {
			newest = append(newest, id)
		}
	}
	_, events, truncated, err := f.store.Job(ctx, "acme", "a1", 3)
	if err != nil || !truncated || !equal(ids(events), newest) {
		t.Fatalf("%v truncated %v, %v; want %v", ids(events), truncated, err, newest)
	}
	if _, events, truncated, err := f.store.Job(ctx, "acme", "a1", 6); err != nil || truncated || len(events) != 6 {
		t.Fatalf("%d events, truncated %v, %v", len(events), truncated, err)
	}
}

func TestCountsOfOrgs(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	f.claim("acme", "a1", 1)
	f.claim("acme", "a2", 1)
	f.claim("acme", "a3", 1)
	f.claim("globex", "g1", 1)
	f.claim("initech", "i1", 1)
	if err := errors.Join(
		f.store.Running(ctx, nil, "a2"),
		f.store.Finished(ctx, nil, "a3", "FAILED", "no", nil),
		f.store.Finished(ctx, nil, "g1", "COMPLETED", "", nil),
	); err != nil {
		t.Fatal(err)
	}
	counts, err := f.store.CountsOf(ctx, []string{"acme", "globex", "nobody"})
	if err != nil {
		t.Fatal(err)
	}
	a, g := counts["acme"], counts["globex"]
	if len(counts) != 2 || a.Claimed != 1 || a.Running != 1 || a.Failed != 1 || a.Completed != 0 || a.LastUpdatedAt == nil {
		t.Fatalf("counts %+v", counts)
	}
	if g.Completed != 1 || g.Claimed != 0 || g.LastUpdatedAt == nil {
		t.Fatalf("globex %+v", g)
	}
	orgs, err := f.store.Orgs(ctx)
	if err != nil || len(orgs) != 3 || orgs[0] != "acme" || orgs[1] != "globex" || orgs[2] != "initech" {
		t.Fatalf("orgs %v, %v", orgs, err)
	}
}

// A note is an event of the org's own job at its current attempt, waking the org's waiters
// as the worker's events do; another org's job, or one the mirror does not hold, takes none.
func TestANoteGoesOnTheOrgsJobAtItsAttemptOnly(t *testing.T) {
	f := newFixture(t, Options{Poll: time.Hour})
	ctx := context.Background()
	f.claim("acme", "a1", 1)
	last := f.claim("acme", "a1", 3) // a re-claim: attempt 3 now
	f.claim("globex", "g1", 1)

	done := make(chan []Event, 1)
	go func() {
		events, _ := f.store.Since(ctx, "acme", last, MaxPage, 30*time.Second)
		done <- events
	}()
	for l := f.store.ensureListener(ctx); !l.Subscribed("acme"); {
		time.Sleep(time.Millisecond)
	}
	id, err := f.store.Note(ctx, "acme", "a1", "subagent_cancel", map[string]string{"id": "sub-1", "actor": "operator:ada"})
	if err != nil {
		t.Fatal(err)
	}
	events := <-done
	var data map[string]string
	if len(events) == 1 {
		_ = json.Unmarshal(events[0].Data, &data)
	}
	if len(events) != 1 || events[0].ID != id || events[0].Attempt != 3 || events[0].Kind != "subagent_cancel" || data["actor"] != "operator:ada" {
		t.Fatalf("the note as the org's waiters saw it: %+v", events)
	}
	for _, c := range []struct{ org, job string }{{"acme", "g1"}, {"globex", "a1"}, {"acme", "nope"}} {
		if _, err := f.store.Note(ctx, c.org, c.job, "subagent_cancel", nil); !errors.Is(err, ErrNotFound) {
			t.Errorf("a note by %s on %s: %v, want ErrNotFound", c.org, c.job, err)
		}
	}
	var n int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM mirror_job_events WHERE kind = 'subagent_cancel'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d notes written (%v), want 1", n, err)
	}
}
