package pg

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// poolCollector reports a pool's pgxpool statistics at each scrape. A pool that is often
// empty when asked makes every query of the process wait: a dispatcher's lease refreshes
// queue behind its steps and its mirror, and leases lapse while they wait.
type poolCollector struct {
	pool                                  *pgxpool.Pool
	max, acquired, idle                   *prometheus.Desc
	acquires, emptyAcquires, emptyWaitSec *prometheus.Desc
}

// Pool names, the pool label of hermes_db_pool_*.
const (
	// MainPool is a process's pool for all its queries but those a smaller pool is kept for.
	MainPool = "main"
	// LeasePool is a dispatcher's pool for keeping its own leases (lease.Options.KeepPool).
	LeasePool = "leases"
)

// RegisterPoolMetrics registers pool's statistics with reg as hermes_db_pool_*{pool=name}:
// its size and the connections in use and idle, and the acquires, those that found the
// pool empty and waited, and the seconds they waited in all. A process with two pools
// registers each under its own name.
func RegisterPoolMetrics(reg prometheus.Registerer, name string, pool *pgxpool.Pool) error {
	l := prometheus.Labels{"pool": name}
	return reg.Register(&poolCollector{
		pool:          pool,
		max:           prometheus.NewDesc("hermes_db_pool_max_conns", "Connections the Postgres pool may open.", nil, l),
		acquired:      prometheus.NewDesc("hermes_db_pool_acquired_conns", "Pool connections in use now.", nil, l),
		idle:          prometheus.NewDesc("hermes_db_pool_idle_conns", "Pool connections open and idle now.", nil, l),
		acquires:      prometheus.NewDesc("hermes_db_pool_acquires_total", "Connections taken from the pool.", nil, l),
		emptyAcquires: prometheus.NewDesc("hermes_db_pool_empty_acquires_total", "Acquires that found no idle connection and waited for one (to be opened or given back).", nil, l),
		emptyWaitSec:  prometheus.NewDesc("hermes_db_pool_empty_acquire_wait_seconds_total", "Seconds acquires that found the pool empty waited, in all.", nil, l),
	})
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.max, c.acquired, c.idle, c.acquires, c.emptyAcquires, c.emptyWaitSec} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, float64(s.MaxConns()))
	ch <- prometheus.MustNewConstMetric(c.acquired, prometheus.GaugeValue, float64(s.AcquiredConns()))
	ch <- prometheus.MustNewConstMetric(c.idle, prometheus.GaugeValue, float64(s.IdleConns()))
	ch <- prometheus.MustNewConstMetric(c.acquires, prometheus.CounterValue, float64(s.AcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.emptyAcquires, prometheus.CounterValue, float64(s.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.emptyWaitSec, prometheus.CounterValue, s.EmptyAcquireWaitTime().Seconds())
}
