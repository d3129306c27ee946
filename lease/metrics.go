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
		// A process's Stores count together: one registered before gives its collectors.
		m.events = register(reg, m.events)
		m.refused = register(reg, m.refused)
		m.contended = register(reg, m.contended)
		m.wait = register(reg, m.wait)
	}
	return m
}

// register registers c with reg, or returns the collector registered already under the
// same name and labels.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	if are, ok := err.(prometheus.AlreadyRegisteredError); ok {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	if err != nil {
		panic(err) // a name taken by another kind of metric: a programming error, as MustRegister's
	}
	return c
}

func (m *metrics) event(kind, key string) { m.events.WithLabelValues(kind, Namespace(key)).Inc() }
