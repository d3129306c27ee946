package backend

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	claims    *prometheus.CounterVec
	conflicts *prometheus.CounterVec
	denials   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sartiq_backend_claims_total", Help: "Claims and re-claims won, by kind.",
		}, []string{"kind"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sartiq_backend_claim_conflicts_total", Help: "Claims and re-claims refused with 409, by kind.",
		}, []string{"kind"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sartiq_backend_token_denials_total", Help: "Requests refused by the token gate, by reason.",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.claims, m.conflicts, m.denials)
	return m
}
