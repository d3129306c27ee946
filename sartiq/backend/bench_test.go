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
// per second and the claim latency percentiles, and, as a baseline from the same run, the
// same load of /healthz requests (HTTP plus one database ping).
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
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: claimants}}
	defer client.CloseIdleConnections()
	send := func(method, path string) {
		req, _ := http.NewRequest(method, be.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+testBotToken)
		resp, err := client.Do(req)
		if err != nil {
			b.Error(err)
			return
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Errorf("%s %s: %d", method, path, resp.StatusCode)
		}
	}

	b.ResetTimer()
	rate, lat := load(claimants, ids, func(id string) { send(http.MethodPost, "/agent-jobs/"+id+"/claim") })
	b.StopTimer()
	b.ReportMetric(rate, "claims/s")
	b.ReportMetric(ms(lat[len(lat)/2]), "p50_ms")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "p99_ms")

	rate, lat = load(claimants, ids, func(string) { send(http.MethodGet, "/healthz") })
	b.ReportMetric(rate, "baseline_healthz/s")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "baseline_healthz_p99_ms")
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

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
