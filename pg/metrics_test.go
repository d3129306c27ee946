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

// The pool's metrics show an acquire that found the pool empty and how long it waited: a
// pool of one connection, held while a second query asks for it.
func TestPoolMetricsCountAcquiresThatWaited(t *testing.T) {
	url := pgtest.URL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	ctx := t.Context()
	pool, _, err := pg.Open(ctx, url+sep+"pool_max_conns=1", pgtest.SharedSchema)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	reg := prometheus.NewPedanticRegistry()
	if err := pg.RegisterPoolMetrics(reg, pool); err != nil {
		t.Fatal(err)
	}
	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		var one int
		waited <- pool.QueryRow(context.Background(), `SELECT 1`).Scan(&one)
	}()
	for deadline := time.Now().Add(30 * time.Second); pool.Stat().EmptyAcquireCount() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second query never waited for the pool")
		}
	}
	time.Sleep(50 * time.Millisecond) // a wait long enough to be seen
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
		got[mf.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
	}
	if got["hermes_db_pool_max_conns"] != 1 || got["hermes_db_pool_acquired_conns"] != 0 || got["hermes_db_pool_acquires_total"] < 2 {
		t.Errorf("pool size, in use and acquires: %v", got)
	}
	// The query waited from before the sleep until the release.
	if got["hermes_db_pool_empty_acquires_total"] < 1 || got["hermes_db_pool_empty_acquire_wait_seconds_total"] < 0.05 {
		t.Errorf("empty acquires and their wait: %v; want the query's, 50 ms or more", got)
	}
}
