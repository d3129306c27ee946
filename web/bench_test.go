package web_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"hermeshost/internal/latency"

	"golang.org/x/crypto/bcrypt"

	"hermeshost/operator"
	"hermeshost/pg/pgtest"
	"hermeshost/service"
	"hermeshost/web"
)

// BenchmarkIndex is one logged-in operator's org table (the fragment htmx reloads), with
// 50 granted orgs of 20 mirrored jobs each, beside /healthz (one database ping) on the same
// server and client.
func BenchmarkIndex(b *testing.B) {
	_, pool := pgtest.Schema(b)
	ops, err := operator.New(pool, bcrypt.MinCost)
	if err != nil {
		b.Fatal(err)
	}
	svc := service.NewOps(slog.New(slog.DiscardHandler))
	svc.Health.Probe("database", pool.Ping)
	l, err := web.NewLauncher(svc, web.LauncherConfig{DB: pool, Operators: ops})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	srv := httptest.NewServer(l.Handler())
	defer srv.Close()
	ctx := context.Background()
	if err := ops.Add(ctx, "ada", password, "bench"); err != nil {
		b.Fatal(err)
	}
	for i := range 50 {
		org := fmt.Sprintf("org-%02d", i)
		if err := ops.Grant(ctx, "ada", org, "bench"); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO mirror_jobs (job_id, org, type, status, attempt)
SELECT $1 || '-' || n, $1, 'product_ingest', (ARRAY['RUNNING','COMPLETED','FAILED','CLAIMED'])[1 + n % 4], 1 FROM generate_series(1, 20) n`, org); err != nil {
			b.Fatal(err)
		}
	}
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Transport: srv.Client().Transport}
	resp, err := client.PostForm(srv.URL+"/login", url.Values{"name": {"ada"}, "password": {password}})
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	get := func(b *testing.B, path string) {
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			resp, err := client.Get(srv.URL + path)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("%s: %d", path, resp.StatusCode)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		latency.Report(b, lat)
	}
	b.Run("orgs", func(b *testing.B) { get(b, "/orgs") })
	b.Run("healthz", func(b *testing.B) { get(b, "/healthz") })
}
