package chat

import "github.com/prometheus/client_golang/prometheus"

// SweepMetrics count the sweeps of a dashboard's unit after its chat turns (Config.Sweep),
// on the dashboard's /metrics, which its dispatcher serves with the org's label at
// /metrics/dashboards.
type SweepMetrics struct {
	// Sweeps counts sweeps by result: clean (nothing left), killed (processes left were
	// killed), failed (some outlived it and the dashboard exited).
	Sweeps *prometheus.CounterVec
	// Swept counts the processes the sweeps killed.
	Swept prometheus.Counter
}

// NewSweepMetrics makes the sweep metrics and registers them on reg.
func NewSweepMetrics(reg prometheus.Registerer) SweepMetrics {
	m := SweepMetrics{
		Sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hermes_chat_sweeps_total",
			Help: "Sweeps of the dashboard's unit after a chat turn's agent exited, by result (clean: nothing left, " +
				"killed: processes left were killed, failed: some outlived it and the dashboard exited).",
		}, []string{"result"}),
		Swept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hermes_chat_swept_processes_total",
			Help: "Processes a chat turn's agent left running, killed by the sweep after the turn.",
		}),
	}
	reg.MustRegister(m.Sweeps, m.Swept)
	return m
}
