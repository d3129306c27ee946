package control

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/gavv/httpexpect/v2"
)

func TestJobsAreScopedToTheKeysOrgAndPagedOnce(t *testing.T) {
	f := newFixture(t)
	base := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	var wantA []string
	// Interleaved updates, with ties on updated_at so that the keyset needs its job_id.
	for i := range 23 {
		at := base.Add(time.Duration(i/2) * time.Second)
		a, b := fmt.Sprintf("a-%02d", i), fmt.Sprintf("b-%02d", i)
		f.addJob(orgA, a, at, 0)
		f.addJob(orgB, b, at, 0)
		wantA = append(wantA, a)
	}
	slices.Reverse(wantA) // newest first; within a tie, the higher id first
	a := f.as(orgA)

	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("pagination does not end")
		}
		req := a.GET("/v1/jobs").WithQuery("limit", 5)
		if cursor != "" {
			req = req.WithQuery("cursor", cursor)
		}
		var page JobsPage
		req.Expect().Status(http.StatusOK).JSON().Decode(&page)
		if len(page.Jobs) > 5 {
			t.Fatalf("page of %d", len(page.Jobs))
		}
		for _, j := range page.Jobs {
			got = append(got, j.ID)
			if j.Type != "sync_catalog" || j.Status != "COMPLETED" || j.Attempt != 1 || string(j.Result) != `{"ok":true}` {
				t.Fatalf("job row: %+v", j)
			}
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	if !slices.Equal(got, wantA) {
		t.Fatalf("A's pages:\n got %v\nwant %v", got, wantA)
	}

	// The default page, and B's view of the same table.
	a.GET("/v1/jobs").Expect().Status(http.StatusOK).JSON().Object().Value("jobs").Array().Length().IsEqual(23)
	f.as(orgB).GET("/v1/jobs").WithQuery("limit", 200).Expect().Status(http.StatusOK).
		JSON().Object().Value("jobs").Array().Every(func(_ int, v *httpexpect.Value) {
		v.Object().Value("job_id").String().HasPrefix("b-")
	})

	// B's job is, to A, exactly an unknown job.
	notFound := map[string]string{"error": "not_found", "message": "no such job"}
	a.GET("/v1/jobs/{id}", "b-03").Expect().Status(http.StatusNotFound).JSON().Object().IsEqual(notFound)
	a.GET("/v1/jobs/{id}", "no-such-job").Expect().Status(http.StatusNotFound).JSON().Object().IsEqual(notFound)
	a.GET("/v1/jobs/{id}", "a-03").Expect().Status(http.StatusOK).JSON().Object().Value("job").Object().HasValue("job_id", "a-03")
}

func TestEmptyJobsPage(t *testing.T) {
	f := newFixture(t)
	f.as(orgA).GET("/v1/jobs").Expect().Status(http.StatusOK).JSON().Object().
		IsEqual(map[string]any{"jobs": []any{}})
}

func TestJobShowsItsEventsInOrderAndTruncatesToTheNewest(t *testing.T) {
	f := newFixture(t)
	at := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	f.addJob(orgA, "long", at, MaxJobEvents+3)
	f.addJob(orgA, "short", at, 2)
	f.addJob(orgA, "bare", at, 0)
	f.exec(`UPDATE mirror_jobs SET status = 'FAILED', error = 'agent crashed', result = NULL WHERE job_id = 'bare'`)
	a := f.as(orgA)

	var long JobDetail
	a.GET("/v1/jobs/{id}", "long").Expect().Status(http.StatusOK).JSON().Decode(&long)
	if !long.Truncated || len(long.Events) != MaxJobEvents {
		t.Fatalf("long: truncated %v with %d events", long.Truncated, len(long.Events))
	}
	// The oldest three are left out; the rest are oldest first.
	if string(long.Events[0].Data) != `{"n":4}` || string(long.Events[MaxJobEvents-1].Data) != fmt.Sprintf(`{"n":%d}`, MaxJobEvents+3) {
		t.Fatalf("long: first %s, last %s", long.Events[0].Data, long.Events[MaxJobEvents-1].Data)
	}
	for i := 1; i < len(long.Events); i++ {
		if long.Events[i].ID <= long.Events[i-1].ID {
			t.Fatalf("events out of order at %d", i)
		}
	}

	// ?events=N: only the newest N.
	var newest JobDetail
	a.GET("/v1/jobs/{id}", "long").WithQuery("events", 2).Expect().Status(http.StatusOK).JSON().Decode(&newest)
	if !newest.Truncated || len(newest.Events) != 2 || string(newest.Events[1].Data) != fmt.Sprintf(`{"n":%d}`, MaxJobEvents+3) {
		t.Fatalf("the newest 2: %+v", newest)
	}
	for _, bad := range []any{0, -1, MaxJobEvents + 1, "x"} {
		a.GET("/v1/jobs/{id}", "long").WithQuery("events", bad).Expect().Status(http.StatusBadRequest)
	}

	short := a.GET("/v1/jobs/{id}", "short").Expect().Status(http.StatusOK).JSON().Object()
	short.HasValue("truncated", false)
	ev := short.Value("events").Array()
	ev.Length().IsEqual(2)
	ev.Value(0).Object().ContainsKey("id").ContainsKey("at").HasValue("attempt", 1).HasValue("kind", "progress").HasValue("data", map[string]any{"n": 1})

	bare := a.GET("/v1/jobs/{id}", "bare").Expect().Status(http.StatusOK).JSON().Object()
	bare.HasValue("events", []any{}).HasValue("truncated", false)
	bare.Value("job").Object().HasValue("status", "FAILED").HasValue("error", "agent crashed").NotContainsKey("result")
}
