package lease

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	events    *prometheus.CounterVec
	refused   *prometheus.CounterVec
	contended *prometheus.CounterVec
	wait      *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hermes_lease_events_total", Help: "Lease events written, by kind and key namespace.",
		}, []string{"kind", "namespace"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hermes_lease_refused_total", Help: "Refreshes, releases and fenced writes refused because the lease was lost.",
		}, []string{"op", "namespace"}),
		contended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hermes_lease_contended_total", Help: "Acquire attempts that found the key held.",
		}, []string{"namespace"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "hermes_lease_acquire_wait_seconds", Help: "How long a waiting Acquire waited.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"namespace"}),
	}
	if reg != nil {
		reg.MustRegister(m.events, m.refused, m.contended, m.wait)
	}
	return m
}

func (m *metrics) event(kind, key string) { m.events.WithLabelValues(kind, Namespace(key)).Inc() }
