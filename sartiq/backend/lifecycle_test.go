package backend

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"hermeshost/sartiq"
)

func eventKinds(b *backendUnderTest, id string) []string {
	b.t.Helper()
	events := b.bot().GET("/agent-jobs/{id}/events", id).Expect().Status(http.StatusOK).JSON().Object().Value("events").Array()
	var kinds []string
	for _, e := range events.Iter() {
		o := e.Object()
		kinds = append(kinds, fmt.Sprintf("%s@%v", o.Value("kind").String().Raw(), o.Value("attempt").Number().Raw()))
	}
	return kinds
}

func TestProductIngestLifecycle(t *testing.T) {
	b := startBackend(t)
	id := b.demoJob("acme", sartiq.TypeProductIngest)

	queued := b.bot().GET("/agent-jobs").WithQuery("status", "QUEUED").Expect().Status(http.StatusOK).JSON().Object().Value("jobs").Array()
	queued.Length().IsEqual(2) // acme and globex, product_ingest is the default type
	b.bot().GET("/agent-jobs").WithQuery("type", "guidelines_extraction").Expect().Status(http.StatusOK).
		JSON().Object().Value("jobs").Array().Length().IsEqual(2)

	claim := b.bot().POST("/agent-jobs/{id}/claim", id).Expect().Status(http.StatusOK).JSON().Object()
	claim.Value("organization_id").IsEqual("acme")
	claim.Value("job").Object().Value("status").IsEqual(sartiq.StatusClaimed)
	claim.Value("job").Object().Value("attempt").IsEqual(1)
	token := claim.Value("job_token").String().Raw()
	if len(token) < 43 {
		t.Fatalf("job token is only %d characters", len(token))
	}
	manifestURL := claim.Value("manifest_url").String().Raw()
	if manifestURL != b.url+"/manifests/"+id {
		t.Fatalf("manifest_url %s", manifestURL)
	}
	job := b.expect(token)

	manifest := job.GET("/manifests/{id}", id).Expect().Status(http.StatusOK).JSON().Object()
	manifest.Value("job_id").IsEqual(id)
	manifest.Value("organization_id").IsEqual("acme")
	manifest.Value("sources").Array().Value(0).Object().Value("name").IsEqual("catalog.csv")

	job.POST("/agent-jobs/{id}/start", id).Expect().Status(http.StatusOK).JSON().Object().
		Value("job").Object().Value("status").IsEqual(sartiq.StatusRunning)
	// A start whose answer was lost can be repeated.
	job.POST("/agent-jobs/{id}/start", id).Expect().Status(http.StatusOK)

	job.POST("/agent-jobs/{id}/heartbeat", id).WithJSON(map[string]any{"progress": map[string]any{"step": "reading"}}).
		Expect().Status(http.StatusOK).JSON().Object().Value("job").Object().Value("progress").Object().Value("step").IsEqual("reading")
	job.POST("/agent-jobs/{id}/heartbeat", id).Expect().Status(http.StatusOK)
	job.POST("/agent-jobs/{id}/events", id).WithJSON(map[string]any{"kind": "note", "message": "three rows", "data": map[string]any{"rows": 3}}).
		Expect().Status(http.StatusCreated).JSON().Object().Value("attempt").IsEqual(1)

	job.GET("/organizations/{org}/products", "acme").Expect().Status(http.StatusOK).
		JSON().Object().Value("products").Array().Length().IsEqual(3)

	proposals := job.POST("/organizations/{org}/product-proposals", "acme").WithJSON(map[string]any{"products": []map[string]any{
		{"sku": "acme-101", "name": "Trail Shoe", "attributes": map[string]any{"price": "89.00"}},
		{"sku": "acme-102", "name": "Rain Shell"},
	}}).Expect().Status(http.StatusCreated).JSON().Object().Value("proposals").Array()
	proposals.Length().IsEqual(2)
	proposals.Value(0).Object().Value("status").IsEqual("pending_review")
	proposals.Value(0).Object().Value("revision").IsEqual(1)
	// Proposing a SKU again replaces this job's proposal.
	job.POST("/organizations/{org}/product-proposals", "acme").WithJSON(map[string]any{"products": []map[string]any{
		{"sku": "acme-101", "name": "Trail Shoe II"},
	}}).Expect().Status(http.StatusCreated).JSON().Object().Value("proposals").Array().Value(0).Object().Value("revision").IsEqual(2)
	var proposalRows int
	if err := b.db.QueryRow(t.Context(), `SELECT count(*) FROM product_proposals WHERE job_id = $1`, id).Scan(&proposalRows); err != nil {
		t.Fatal(err)
	}
	if proposalRows != 2 {
		t.Fatalf("%d proposal rows, want 2", proposalRows)
	}

	pre := job.POST("/uploads/presign").WithJSON(map[string]any{"filename": "report.txt", "content_type": "text/plain", "size": 11}).
		Expect().Status(http.StatusCreated).JSON().Object()
	uploadURL := pre.Value("url").String().Raw()
	b.expect("").PUT(strings.TrimPrefix(uploadURL, b.url)).WithHeader("Content-Type", "text/plain").WithBytes([]byte("hello world")).
		Expect().Status(http.StatusCreated).JSON().Object().Value("size").IsEqual(11)

	done := job.POST("/agent-jobs/{id}/complete", id).WithJSON(map[string]any{"result": map[string]any{"proposed": 2}}).
		Expect().Status(http.StatusOK).JSON().Object().Value("job").Object()
	done.Value("status").IsEqual(sartiq.StatusCompleted)
	done.Value("result").Object().Value("proposed").IsEqual(2)

	// The token died with the job: the worker is told to stop.
	job.POST("/agent-jobs/{id}/heartbeat", id).Expect().Status(http.StatusConflict).JSON().Object().Value("error").IsEqual("token_revoked")

	want := []string{"claim@1", "start@1", "progress@1", "heartbeat@1", "note@1", "proposal@1", "proposal@1", "complete@1"}
	if got := eventKinds(b, id); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("events %v, want %v", got, want)
	}
}

func TestGuidelinesLifecycle(t *testing.T) {
	b := startBackend(t)
	id := b.demoJob("globex", sartiq.TypeGuidelinesExtraction)
	job := b.expect(b.claim(id))

	categories := job.GET("/manifests/{id}", id).Expect().Status(http.StatusOK).JSON().Object().Value("categories").Array()
	categories.Length().IsEqual(len(DemoCategories))

	// Writes wait for the start.
	job.PUT("/organizations/{org}/guidelines/{category}/proposal", "globex", "typography").WithJSON(map[string]any{"content": "x"}).
		Expect().Status(http.StatusConflict).JSON().Object().Value("error").IsEqual("wrong_status")
	job.POST("/agent-jobs/{id}/start", id).Expect().Status(http.StatusOK)

	for _, c := range DemoCategories {
		job.PUT("/organizations/{org}/guidelines/{category}/proposal", "globex", c).
			WithJSON(map[string]any{"content": "## " + c + "\nRules.", "sources": []string{"brand-book.md"}}).
			Expect().Status(http.StatusOK).JSON().Object().Value("proposal").Object().Value("revision").IsEqual(1)
	}
	job.PUT("/organizations/{org}/guidelines/{category}/proposal", "globex", "typography").WithJSON(map[string]any{"content": "better"}).
		Expect().Status(http.StatusOK).JSON().Object().Value("proposal").Object().Value("revision").IsEqual(2)
	job.PUT("/organizations/{org}/guidelines/{category}/proposal", "globex", "pricing").WithJSON(map[string]any{"content": "x"}).
		Expect().Status(http.StatusUnprocessableEntity).JSON().Object().Value("error").IsEqual("unknown_category")

	var stored int
	var content string
	if err := b.db.QueryRow(t.Context(), `SELECT count(*), max(content) FILTER (WHERE category = 'typography')
		FROM guidelines_proposals WHERE job_id = $1 AND status = 'pending_review'`, id).Scan(&stored, &content); err != nil {
		t.Fatal(err)
	}
	if stored != len(DemoCategories) || content != "better" {
		t.Fatalf("stored %d proposals, typography %q", stored, content)
	}

	job.POST("/agent-jobs/{id}/complete", id).WithJSON(map[string]any{"result": map[string]any{"categories": DemoCategories}}).
		Expect().Status(http.StatusOK)
	kinds := eventKinds(b, id)
	if kinds[0] != "claim@1" || kinds[len(kinds)-1] != "complete@1" || len(kinds) != 2+len(DemoCategories)+1+1 {
		t.Fatalf("events %v", kinds)
	}
}

func TestFailAndReleaseRevokeTheToken(t *testing.T) {
	b := startBackend(t)
	id := b.demoJob("acme", sartiq.TypeProductIngest)
	job := b.expect(b.claim(id))
	job.POST("/agent-jobs/{id}/release", id).WithJSON(map[string]any{"reason": "not for this worker's org"}).
		Expect().Status(http.StatusOK).JSON().Object().Value("job").Object().Value("status").IsEqual(sartiq.StatusQueued)
	job.POST("/agent-jobs/{id}/start", id).Expect().Status(http.StatusConflict).JSON().Object().Value("error").IsEqual("token_revoked")

	second := b.bot().POST("/agent-jobs/{id}/claim", id).Expect().Status(http.StatusOK).JSON().Object()
	second.Value("job").Object().Value("attempt").IsEqual(2)
	job2 := b.expect(second.Value("job_token").String().Raw())
	job2.POST("/agent-jobs/{id}/fail", id).WithJSON(map[string]any{"reason": "the catalog is unreadable"}).
		Expect().Status(http.StatusOK).JSON().Object().Value("job").Object().Value("error").IsEqual("the catalog is unreadable")
	job2.POST("/agent-jobs/{id}/release", id).Expect().Status(http.StatusConflict)
	b.bot().POST("/agent-jobs/{id}/claim", id).Expect().Status(http.StatusConflict).JSON().Object().Value("error").IsEqual("not_queued")

	want := "claim@1 release@1 claim@2 fail@2"
	if got := strings.Join(eventKinds(b, id), " "); got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
}

func TestSeedIsIdempotent(t *testing.T) {
	b := startBackend(t)
	before := b.snapshot()
	if err := SeedDemo(t.Context(), b.db, b.clock.Now()); err != nil {
		t.Fatal(err)
	}
	b.unchanged(before)
}

// A local run queues a fresh batch of demo jobs only once every earlier one is done.
func TestADemoBatchIsQueuedOnlyWhenTheEarlierOnesAreDone(t *testing.T) {
	b := startBackend(t)
	ctx := t.Context()
	count := func(status string) int {
		t.Helper()
		var n int
		if err := b.db.QueryRow(ctx, `SELECT count(*) FROM agent_jobs WHERE status = $1`, status).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if queued, err := QueueDemoBatch(ctx, b.db, b.clock.Now(), "run-1"); err != nil || queued {
		t.Fatalf("a batch beside the seeded, still queued jobs: %v %v", queued, err)
	}
	b.claim(b.demoJob("acme", "product_ingest"))
	if _, err := b.db.Exec(ctx, `UPDATE agent_jobs SET status = 'COMPLETED' WHERE status = 'QUEUED'`); err != nil {
		t.Fatal(err)
	}
	if queued, err := QueueDemoBatch(ctx, b.db, b.clock.Now(), "run-1"); err != nil || queued {
		t.Fatalf("a batch while a demo job is claimed: %v %v", queued, err)
	}
	if _, err := b.db.Exec(ctx, `UPDATE agent_jobs SET status = 'COMPLETED', token_hash = NULL, token_expires_at = NULL`); err != nil {
		t.Fatal(err)
	}
	queued, err := QueueDemoBatch(ctx, b.db, b.clock.Now(), "run-1")
	if err != nil || !queued || count("QUEUED") != 2*len(DemoOrganizations) {
		t.Fatalf("a batch after every demo job is done: %v %v, %d queued", queued, err, count("QUEUED"))
	}
	if queued, err := QueueDemoBatch(ctx, b.db, b.clock.Now(), "run-2"); err != nil || queued || count("QUEUED") != 4 {
		t.Fatalf("a second batch beside the first: %v %v", queued, err)
	}
}
