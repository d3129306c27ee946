package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The two benchmarks send the same small non-streaming chat completion to the same local
// demo upstream, directly and through the gateway; the difference of their figures is
// what the gateway adds. Each reports p50 and p99 latency and the process's CPU time per
// request (client, gateway and upstream all run in this process, so the gateway's own
// CPU cost is the difference of the two cpu-ns/op).

func BenchmarkDirect(b *testing.B) {
	demo := httptest.NewServer(Demo())
	defer demo.Close()
	benchChat(b, demo.URL+"/v1/chat/completions", "")
}

func BenchmarkProxy(b *testing.B) {
	demo := httptest.NewServer(Demo())
	defer demo.Close()
	ops, _ := newOps()
	s, err := New(Config{
		UpstreamURL: demo.URL + "/v1", Secret: testSecret, OrgRPS: 1e9, OrgBurst: 1e9, OrgConcurrency: 100,
		MaxRequestBytes: 1 << 20, Ops: ops,
	})
	if err != nil {
		b.Fatal(err)
	}
	gw := httptest.NewServer(s.Handler())
	defer gw.Close()
	key, _ := OrgKey(testSecret, "bench-org")
	benchChat(b, gw.URL+"/v1/chat/completions", "Bearer "+key)
}

func benchChat(b *testing.B, url, auth string) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	defer client.CloseIdleConnections()
	send := func() {
		req, _ := http.NewRequest("POST", url, strings.NewReader(smallChat))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	for range 50 { // warm the connection pools
		send()
	}
	var lat []time.Duration
	cpu0 := cpuTime(b)
	for b.Loop() {
		start := time.Now()
		send()
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	cpu := cpuTime(b) - cpu0
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(len(lat)), "cpu-ns/op")
}

// cpuTime is the user and system CPU time this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
