package backend

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// BenchmarkClaim: 16 claimants race through a queue of 10,000 jobs (more if b.N asks for
// more; the whole queue whatever b.N, so one call at any -benchtime measures all of it and
// the figures are per claim), each claim a real HTTP request to the real server and
// Postgres, its answer read and checked; afterwards every job must have been claimed
// exactly once. Reports claims
// per second and the claim latency percentiles and, as baselines from the same run with
// the same 16 clients: the claim statement alone (claimSQL through the backend's pool on
// a second queue of the same size, no HTTP, no gate, no JSON), the floor of a claim that
// commits its token and event; and /healthz (HTTP plus one database ping).
func BenchmarkClaim(b *testing.B) {
	const claimants, queue = 16, 10000
	be := startBackend(b)
	ctx := context.Background()
	if _, err := be.db.Exec(ctx, `
		INSERT INTO agent_jobs (type, organization_id, manifest, created_at)
		SELECT 'product_ingest', 'acme', '{}', $1::timestamptz + g * interval '1 microsecond' FROM generate_series(1, $2) g`,
		be.clock.Now(), max(b.N, queue)); err != nil {
		b.Fatal(err)
	}
	ids := queryIDs(b, be, `SELECT id::text FROM agent_jobs WHERE seed_key IS NULL ORDER BY created_at`)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: claimants}}
	defer client.CloseIdleConnections()
	// send makes one request and reads its whole answer, as the host's client does: a body
	// closed unread closes its connection, and every request would then dial a new one.
	send := func(method, path string, check func([]byte) error) {
		req, _ := http.NewRequest(method, be.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+testBotToken)
		resp, err := client.Do(req)
		if err != nil {
			b.Error(err)
			return
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case err != nil:
			b.Errorf("%s %s: read the answer: %v", method, path, err)
		case resp.StatusCode != http.StatusOK:
			b.Errorf("%s %s: %d %s", method, path, resp.StatusCode, body)
		case check != nil:
			if err := check(body); err != nil {
				b.Errorf("%s %s: %v", method, path, err)
			}
		}
	}
	claimed := func(id string) func([]byte) error {
		return func(body []byte) error {
			var c struct {
				Job      struct{ ID string }
				JobToken string `json:"job_token"`
			}
			if err := json.Unmarshal(body, &c); err != nil {
				return fmt.Errorf("answer is not a claim: %v", err)
			}
			if c.Job.ID != id || c.JobToken == "" {
				return fmt.Errorf("answer claims job %q with token %t, want job %s with a token", c.Job.ID, c.JobToken != "", id)
			}
			return nil
		}
	}

	b.ResetTimer()
	rate, lat := load(claimants, ids, func(id string) { send(http.MethodPost, "/agent-jobs/"+id+"/claim", claimed(id)) })
	b.StopTimer()
	checkClaimedOnce(b, be, ids)
	b.ReportMetric(rate, "claims/s")
	b.ReportMetric(ms(lat[len(lat)/2]), "p50_ms")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "p99_ms")

	// The same claims as bare statements, on a second queue in the organization "globex"
	// (seeded), so the HTTP claims above left them alone.
	if _, err := be.db.Exec(ctx, `
		INSERT INTO agent_jobs (type, organization_id, manifest, created_at)
		SELECT 'product_ingest', 'globex', '{}', $1::timestamptz + g * interval '1 microsecond' FROM generate_series(1, $2) g`,
		be.clock.Now(), len(ids)); err != nil {
		b.Fatal(err)
	}
	bare := queryIDs(b, be, `SELECT id::text FROM agent_jobs WHERE seed_key IS NULL AND organization_id = 'globex'`)
	h := &Handler{cfg: be.cfg}
	rate, lat = load(claimants, bare, func(id string) {
		_, hash, err := newSecret()
		if err != nil {
			b.Error(err)
			return
		}
		now := h.now()
		var got string
		var skip [11]any
		dst := []any{&got}
		for i := range skip {
			dst = append(dst, &skip[i])
		}
		if err := be.db.QueryRow(ctx, claimSQL, id, now, hash, now.Add(be.cfg.TokenTTL)).Scan(dst...); err != nil || got != id {
			b.Errorf("claim %s as a bare statement: %q, %v", id, got, err)
		}
	})
	checkClaimedOnce(b, be, bare)
	b.ReportMetric(rate, "baseline_sql_claims/s")
	b.ReportMetric(ms(lat[len(lat)/2]), "baseline_sql_p50_ms")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "baseline_sql_p99_ms")

	rate, lat = load(claimants, ids, func(string) { send(http.MethodGet, "/healthz", nil) })
	b.ReportMetric(rate, "baseline_healthz/s")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "baseline_healthz_p99_ms")
}

// checkClaimedOnce fails the benchmark unless every job in ids was claimed exactly once:
// CLAIMED at attempt 1 with a live token, one minted token and one claim event each, and
// nothing else in the queue touched.
func checkClaimedOnce(b *testing.B, be *backendUnderTest, ids []string) {
	b.Helper()
	var jobs, tokens, events, others int
	err := be.db.QueryRow(context.Background(), `
		SELECT
		  (SELECT count(*) FROM agent_jobs WHERE id = ANY($1::uuid[]) AND status = 'CLAIMED' AND attempt = 1 AND token_hash IS NOT NULL),
		  (SELECT count(*) FROM job_tokens t JOIN agent_jobs j ON j.id = t.job_id AND j.token_hash = t.hash WHERE t.job_id = ANY($1::uuid[])),
		  (SELECT count(*) FROM agent_job_events WHERE job_id = ANY($1::uuid[]) AND kind = 'claim' AND attempt = 1),
		  (SELECT count(*) FROM agent_jobs j WHERE seed_key IS NULL AND NOT id = ANY($1::uuid[]) AND status <> 'QUEUED'
		     AND organization_id = (SELECT organization_id FROM agent_jobs WHERE id = ($1::uuid[])[1]))`,
		ids).Scan(&jobs, &tokens, &events, &others)
	if err != nil {
		b.Fatal(err)
	}
	if n := len(ids); jobs != n || tokens != n || events != n || others != 0 {
		b.Fatalf("of %d jobs claimed once each: %d CLAIMED at attempt 1, %d live tokens, %d claim events; %d other jobs left the queue",
			n, jobs, tokens, events, others)
	}
}

// load runs do once per item with workers goroutines and answers the rate and the sorted
// latencies.
func load(workers int, items []string, do func(string)) (float64, []time.Duration) {
	work := make(chan string, len(items))
	for _, it := range items {
		work <- it
	}
	close(work)
	latencies := make([][]time.Duration, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range work {
				t0 := time.Now()
				do(it)
				latencies[w] = append(latencies[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(latencies...)
	slices.Sort(all)
	return float64(len(all)) / elapsed.Seconds(), all
}

// queryIDs answers the ids a query selects.
func queryIDs(b *testing.B, be *backendUnderTest, query string, args ...any) []string {
	b.Helper()
	rows, err := be.db.Query(context.Background(), query, args...)
	if err != nil {
		b.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.Fatal(err)
	}
	return ids
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
