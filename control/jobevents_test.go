package control

import (
	"context"
	"net/http"
	"testing"
	"time"

	"hermeshost/mirror"
)

// mirrorJob records, as the dispatcher does, a claim of job for org and then one progress
// event per kind; it returns the ids of all its events.
func (f *fixture) mirrorJob(org, job string, kinds ...string) []int64 {
	f.t.Helper()
	ctx := context.Background()
	id, err := f.server.mirror.Claimed(ctx, nil, mirror.Claim{JobID: job, Org: org, Type: "sync_catalog", Attempt: 1, Kind: "claim"})
	if err != nil {
		f.t.Fatal(err)
	}
	ids := []int64{id}
	for _, k := range kinds {
		id, err := f.server.mirror.Event(ctx, nil, org, job, 1, k, map[string]string{"job": job})
		if err != nil {
			f.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func TestJobEventsAreTheKeysOrgsOldestFirstAndResumable(t *testing.T) {
	f := newFixture(t)
	a1 := f.mirrorJob(orgA, "a-1", "start", "progress")
	b1 := f.mirrorJob(orgB, "b-1", "start")
	a2 := f.mirrorJob(orgA, "a-2", "start")
	wantA := append(append([]int64{}, a1...), a2...)

	var all JobEventFeed
	f.as(orgA).GET("/v1/jobs/events").Expect().Status(http.StatusOK).JSON().Decode(&all)
	if len(all.Events) != len(wantA) || all.Last != wantA[len(wantA)-1] {
		t.Fatalf("A's feed: %+v, want ids %v", all, wantA)
	}
	for i, e := range all.Events {
		if e.ID != wantA[i] {
			t.Fatalf("event %d is %d, want %d", i, e.ID, wantA[i])
		}
	}
	first := all.Events[0]
	if first.JobID != "a-1" || first.Attempt != 1 || first.Kind != "claim" || string(first.Data) != `{}` || first.At.IsZero() {
		t.Fatalf("first event: %+v", first)
	}
	if e := all.Events[1]; e.Kind != "start" || string(e.Data) != `{"job":"a-1"}` {
		t.Fatalf("second event: %+v", e)
	}

	// Resuming from an id gives what came after it, and from the last id nothing.
	var rest JobEventFeed
	f.as(orgA).GET("/v1/jobs/events").WithQuery("after", a1[len(a1)-1]).Expect().Status(http.StatusOK).JSON().Decode(&rest)
	if len(rest.Events) != len(a2) || rest.Events[0].ID != a2[0] || rest.Events[0].JobID != "a-2" {
		t.Fatalf("A after a-1: %+v", rest)
	}
	f.as(orgA).GET("/v1/jobs/events").WithQuery("after", all.Last).Expect().Status(http.StatusOK).JSON().Object().
		IsEqual(map[string]any{"events": []any{}, "last": all.Last})

	// B sees its own and nothing of A's, even from before A's ids.
	var bFeed JobEventFeed
	f.as(orgB).GET("/v1/jobs/events").Expect().Status(http.StatusOK).JSON().Decode(&bFeed)
	if len(bFeed.Events) != len(b1) || bFeed.Events[0].ID != b1[0] || bFeed.Events[1].ID != b1[1] {
		t.Fatalf("B's feed: %+v, want ids %v", bFeed, b1)
	}
	for _, e := range bFeed.Events {
		if e.JobID != "b-1" {
			t.Fatalf("B sees %+v", e)
		}
	}
}

func TestJobEventsWaitForTheNextEvent(t *testing.T) {
	f := newFixture(t)
	c := f.client(f.key(orgA))
	ctx := context.Background()
	before := f.mirrorJob(orgA, "a-1")

	// Nothing new: the wait ends empty, and the cursor stays where it was.
	feed, err := c.JobEvents(ctx, before[0], 20*time.Millisecond)
	if err != nil || len(feed.Events) != 0 || feed.Last != before[0] {
		t.Fatalf("empty wait: %+v, %v", feed, err)
	}

	got := make(chan JobEventFeed, 1)
	errs := make(chan error, 1)
	go func() {
		feed, err := c.JobEvents(ctx, before[0], testMaxWait)
		errs <- err
		got <- feed
	}()
	// Another org's event does not answer A's wait; A's own does.
	f.mirrorJob(orgB, "b-1")
	after := f.mirrorJob(orgA, "a-2")
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	feed = <-got
	if len(feed.Events) == 0 || feed.Events[0].ID != after[0] || feed.Events[0].JobID != "a-2" {
		t.Fatalf("woken with %+v, want event %d of a-2", feed, after[0])
	}
}

func TestJobEventsRefuseBadInput(t *testing.T) {
	f := newFixture(t)
	f.mirrorJob(orgA, "a-1")
	before := f.snapshot()
	for _, q := range []map[string]string{
		{"after": "-1"}, {"after": "x"}, {"after": "1.5"},
		{"wait_ms": "-1"}, {"wait_ms": "soon"}, {"wait_ms": "5001"},
	} {
		req := f.as(orgA).GET("/v1/jobs/events")
		for k, v := range q {
			req = req.WithQuery(k, v)
		}
		req.Expect().Status(http.StatusBadRequest).JSON().Object().HasValue("error", CodeInvalid)
	}
	f.bearer("").GET("/v1/jobs/events").Expect().Status(http.StatusUnauthorized)
	if after := f.snapshot(); after != before {
		t.Fatalf("a refused request wrote:\n%s\nthen\n%s", before, after)
	}
}
