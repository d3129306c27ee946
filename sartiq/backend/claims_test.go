package backend

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"hermeshost/sartiq"
)

func TestConcurrentClaimsHaveExactlyOneWinner(t *testing.T) {
	b := startBackend(t)
	id := b.demoJob("acme", sartiq.TypeGuidelinesExtraction)
	const claimants = 24
	codes := make([]int, claimants)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range claimants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req, _ := http.NewRequest(http.MethodPost, b.url+"/agent-jobs/"+id+"/claim", nil)
			req.Header.Set("Authorization", "Bearer "+testBotToken)
			resp, err := b.checked.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		}()
	}
	close(start)
	wg.Wait()
	won, lost := 0, 0
	for _, c := range codes {
		switch c {
		case http.StatusOK:
			won++
		case http.StatusConflict:
			lost++
		default:
			t.Errorf("a claimant got %d", c)
		}
	}
	if won != 1 || lost != claimants-1 {
		t.Fatalf("%d won, %d got 409; want exactly one winner", won, lost)
	}
	if got := strings.Join(eventKinds(b, id), " "); got != "claim@1" {
		t.Fatalf("events %s", got)
	}
	var tokens int
	if err := b.db.QueryRow(t.Context(), `SELECT count(*) FROM job_tokens WHERE job_id = $1`, id).Scan(&tokens); err != nil {
		t.Fatal(err)
	}
	if tokens != 1 {
		t.Fatalf("%d tokens minted", tokens)
	}
	metrics := b.expect("").GET("/metrics").Expect().Status(http.StatusOK).Body().Raw()
	for _, want := range []string{`sartiq_backend_claims_total{kind="claim"} 1`, fmt.Sprintf(`sartiq_backend_claim_conflicts_total{kind="claim"} %d`, claimants-1)} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestReclaimOnlyAfterHeartbeatsStop(t *testing.T) {
	b := startBackend(t)
	id := b.demoJob("acme", sartiq.TypeProductIngest)
	oldToken := b.claim(id)
	old := b.expect(oldToken)
	old.POST("/agent-jobs/{id}/start", id).Expect().Status(http.StatusOK)

	// Heartbeats keep it fresh, however long the job runs.
	for range 3 {
		b.clock.Advance(testStaleAfter - time.Second)
		b.bot().POST("/agent-jobs/{id}/reclaim", id).Expect().Status(http.StatusConflict).JSON().Object().Value("error").IsEqual("not_stale")
		old.POST("/agent-jobs/{id}/heartbeat", id).Expect().Status(http.StatusOK)
	}
	b.bot().GET("/agent-jobs").WithQuery("status", "RUNNING").Expect().Status(http.StatusOK).
		JSON().Object().Value("jobs").Array().Value(0).Object().Value("stale").IsEqual(false)

	b.clock.Advance(testStaleAfter + time.Second)
	b.bot().GET("/agent-jobs").WithQuery("status", "CLAIMED,RUNNING").Expect().Status(http.StatusOK).
		JSON().Object().Value("jobs").Array().Value(0).Object().Value("stale").IsEqual(true)
	fresh := b.bot().POST("/agent-jobs/{id}/reclaim", id).Expect().Status(http.StatusOK).JSON().Object()
	fresh.Value("job").Object().Value("attempt").IsEqual(2)
	fresh.Value("job").Object().Value("status").IsEqual(sartiq.StatusClaimed)
	newToken := fresh.Value("job_token").String().Raw()
	if newToken == oldToken {
		t.Fatal("re-claim handed out the old token")
	}
	// A second re-claim right away is refused: the new claim is fresh.
	b.bot().POST("/agent-jobs/{id}/reclaim", id).Expect().Status(http.StatusConflict)

	// Every write with the superseded token is refused and changes nothing.
	before := b.snapshot()
	writes := []struct {
		method, path string
		body         any
	}{
		{"POST", "/agent-jobs/" + id + "/start", nil},
		{"POST", "/agent-jobs/" + id + "/heartbeat", map[string]any{"progress": map[string]any{"late": true}}},
		{"POST", "/agent-jobs/" + id + "/events", map[string]any{"kind": "note"}},
		{"POST", "/agent-jobs/" + id + "/complete", map[string]any{"result": map[string]any{}}},
		{"POST", "/agent-jobs/" + id + "/fail", map[string]any{"reason": "late"}},
		{"POST", "/agent-jobs/" + id + "/release", nil},
		{"POST", "/uploads/presign", map[string]any{"filename": "a.txt", "content_type": "text/plain", "size": 1}},
		{"POST", "/organizations/acme/product-proposals", map[string]any{"products": []map[string]any{{"sku": "x1", "name": "X"}}}},
		{"GET", "/agent-jobs/" + id + "/events", nil},
		{"GET", "/manifests/" + id, nil},
		{"GET", "/organizations/acme/products", nil},
	}
	for _, w := range writes {
		req := old.Request(w.method, w.path)
		if w.body != nil {
			req = req.WithJSON(w.body)
		}
		req.Expect().Status(http.StatusConflict).JSON().Object().Value("error").IsEqual("token_revoked")
	}
	b.unchanged(before)

	// The new attempt works, and the log counts the attempts.
	b.expect(newToken).POST("/agent-jobs/{id}/start", id).Expect().Status(http.StatusOK)
	want := "claim@1 start@1 heartbeat@1 heartbeat@1 heartbeat@1 reclaim@2 start@2"
	if got := strings.Join(eventKinds(b, id), " "); got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
	var revoked int
	if err := b.db.QueryRow(t.Context(), `SELECT count(*) FROM job_tokens WHERE job_id = $1 AND revoked_reason = 'reclaim'`, id).Scan(&revoked); err != nil {
		t.Fatal(err)
	}
	if revoked != 1 {
		t.Fatalf("%d tokens marked revoked by the re-claim", revoked)
	}
}

func TestReclaimOfAQueuedOrFinishedJobIsRefused(t *testing.T) {
	b := startBackend(t)
	id := b.demoJob("acme", sartiq.TypeProductIngest)
	b.bot().POST("/agent-jobs/{id}/reclaim", id).Expect().Status(http.StatusConflict).JSON().Object().Value("error").IsEqual("not_claimed")
	b.bot().POST("/agent-jobs/{id}/claim", "00000000-0000-4000-8000-000000000000").Expect().Status(http.StatusNotFound)
}

func TestTokensExpireAndHeartbeatsExtendThem(t *testing.T) {
	b := startBackend(t)
	id := b.demoJob("globex", sartiq.TypeProductIngest)
	claim := b.bot().POST("/agent-jobs/{id}/claim", id).Expect().Status(http.StatusOK).JSON().Object()
	claimedExpiry := claim.Value("token_expires_at").String().AsDateTime().Raw()
	job := b.expect(claim.Value("job_token").String().Raw())

	b.clock.Advance(testTokenTTL - time.Minute)
	hb := job.POST("/agent-jobs/{id}/heartbeat", id).Expect().Status(http.StatusOK).JSON().Object()
	extended := hb.Value("token_expires_at").String().AsDateTime().Raw()
	if want := b.clock.Now().Add(testTokenTTL); !extended.Equal(want) || !extended.After(claimedExpiry) {
		t.Fatalf("heartbeat moved the expiry to %v, want %v", extended, want)
	}
	// Past the first expiry, alive thanks to the heartbeat.
	b.clock.Advance(2 * time.Minute)
	job.GET("/manifests/{id}", id).Expect().Status(http.StatusOK)

	// Silent for a whole TTL: expired, and a heartbeat cannot bring it back.
	b.clock.Advance(testTokenTTL)
	before := b.snapshot()
	job.POST("/agent-jobs/{id}/heartbeat", id).Expect().Status(http.StatusUnauthorized).JSON().Object().Value("error").IsEqual("token_expired")
	job.GET("/manifests/{id}", id).Expect().Status(http.StatusUnauthorized)
	b.unchanged(before)
	metrics := b.expect("").GET("/metrics").Expect().Body().Raw()
	if !strings.Contains(metrics, `sartiq_backend_token_denials_total{reason="token_expired"} 2`) {
		t.Fatalf("metrics lack the expired denials")
	}
}
