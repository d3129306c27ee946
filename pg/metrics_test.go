package pg_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/pg"
	"hermeshost/pg/pgtest"
)

// withParam adds a query parameter to a Postgres URL (for a URL that says its pool's size).
func withParam(url, param string) string {
	if strings.Contains(url, "?") {
		return url + "&" + param
	}
	return url + "?" + param
}

// The pool's metrics show an acquire that found the pool empty and how long it waited: a
// pool of one connection, held while a second query asks for it.
func TestPoolMetricsCountAcquiresThatWaited(t *testing.T) {
	ctx := t.Context()
	pool, _, err := pg.OpenWith(ctx, pgtest.URL(t), pgtest.SharedSchema, pg.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	reg := prometheus.NewPedanticRegistry()
	if err := pg.RegisterPoolMetrics(reg, pg.MainPool, pool); err != nil {
		t.Fatal(err)
	}
	// Open's ping made the connection, an acquire that found the pool empty: the counts
	// start from here. The held acquire finds that connection idle and does not count.
	base := pool.Stat()
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		var one int
		waited <- pool.QueryRow(context.Background(), `SELECT 1`).Scan(&one)
	}()
	// pgxpool counts a wait only once it ends, so nothing says the query has begun to
	// wait: the release comes 200 ms after the query's start, and the query's wait is
	// counted at 50 ms or more unless it took 150 ms to begin. A query that began only
	// after the release would find the connection idle and count no empty acquire at all.
	time.Sleep(200 * time.Millisecond)
	held.Release()
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "pool" || l[0].GetValue() != pg.MainPool {
			t.Errorf("%s: labels %v, want pool=%q", mf.GetName(), l, pg.MainPool)
		}
		got[mf.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
	}
	if got["hermes_db_pool_max_conns"] != 1 || got["hermes_db_pool_acquired_conns"] != 0 || got["hermes_db_pool_acquires_total"] < float64(base.AcquireCount()+2) {
		t.Errorf("pool size, in use and acquires: %v", got)
	}
	if n := got["hermes_db_pool_empty_acquires_total"] - float64(base.EmptyAcquireCount()); n != 1 {
		t.Errorf("empty acquires since the ping: %v, want the query's alone (%v)", n, got)
	}
	if w := got["hermes_db_pool_empty_acquire_wait_seconds_total"] - base.EmptyAcquireWaitTime().Seconds(); w < 0.05 {
		t.Errorf("the query waited %.3f s in the metrics, want 50 ms or more (%v)", w, got)
	}
}

// OpenWith sizes a pool whatever the URL says, and names its connections.
func TestOpenWithSizesAndNamesAPool(t *testing.T) {
	ctx := t.Context()
	pool, _, err := pg.OpenWith(ctx, withParam(pgtest.URL(t), "pool_max_conns=30"), pgtest.SharedSchema, pg.Options{MaxConns: 3, Name: pg.LeasePool})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if got := pool.Config().MaxConns; got != 3 {
		t.Errorf("MaxConns = %d, want 3 over the URL's 30", got)
	}
	var app string
	if err := pool.QueryRow(ctx, `SELECT current_setting('application_name')`).Scan(&app); err != nil {
		t.Fatal(err)
	}
	if app != "hermes-host-leases" {
		t.Errorf("application_name = %q, want hermes-host-leases", app)
	}
	main, _, err := pg.Open(ctx, withParam(pgtest.URL(t), "pool_max_conns=30"), pgtest.SharedSchema)
	if err != nil {
		t.Fatal(err)
	}
	defer main.Close()
	if got := main.Config().MaxConns; got != 30 {
		t.Errorf("Open: MaxConns = %d, want the URL's 30", got)
	}
}
