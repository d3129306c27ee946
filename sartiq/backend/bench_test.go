package backend

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkClaim: 16 claimants race through a queue of 10,000 jobs (more if b.N asks for
// more), each claim a real HTTP request to the real server and Postgres. Reports claims
// per second and the 99th percentile claim latency.
func BenchmarkClaim(b *testing.B) {
	const claimants, queue = 16, 10000
	be := startBackend(b)
	n := max(b.N, queue)
	ctx := context.Background()
	if _, err := be.db.Exec(ctx, `
		INSERT INTO agent_jobs (type, organization_id, manifest, created_at)
		SELECT 'product_ingest', 'acme', '{}', $1::timestamptz + g * interval '1 microsecond' FROM generate_series(1, $2) g`,
		be.clock.Now(), n); err != nil {
		b.Fatal(err)
	}
	rows, err := be.db.Query(ctx, `SELECT id::text FROM agent_jobs WHERE seed_key IS NULL ORDER BY created_at LIMIT $1`, b.N)
	if err != nil {
		b.Fatal(err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			b.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	work := make(chan string, len(ids))
	for _, id := range ids {
		work <- id
	}
	close(work)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: claimants}}
	defer client.CloseIdleConnections()
	latencies := make([][]time.Duration, claimants)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for c := range claimants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				req, _ := http.NewRequest(http.MethodPost, be.url+"/agent-jobs/"+id+"/claim", nil)
				req.Header.Set("Authorization", "Bearer "+testBotToken)
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				resp.Body.Close()
				latencies[c] = append(latencies[c], time.Since(t0))
				if resp.StatusCode != http.StatusOK {
					b.Errorf("claim %s: %d", id, resp.StatusCode)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(latencies...)
	slices.Sort(all)
	if len(all) == 0 {
		return
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "claims/s")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99_ms")
	b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50_ms")
}
