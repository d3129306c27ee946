package dashboards

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	transitions *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hermes_dashboards_transitions_total",
			Help: "Dashboard rows entering a state (requested by the launcher; starting, running, failed, stopped by a dispatcher).",
		}, []string{"state"}),
	}
	if reg != nil {
		reg.MustRegister(m.transitions)
	}
	return m
}
