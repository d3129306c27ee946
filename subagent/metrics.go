package subagent

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	transitions  *prometheus.CounterVec
	messages     prometheus.Counter
	redeliveries prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hermes_subagent_transitions_total", Help: "Subagent handles entering a status (running on start).",
		}, []string{"status"}),
		messages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hermes_subagent_messages_total", Help: "Messages put in subagent mailboxes.",
		}),
		redeliveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hermes_subagent_redeliveries_total", Help: "Mailbox messages handed out again because they were not acknowledged.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.transitions, m.messages, m.redeliveries)
	}
	return m
}
