package runtime

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts what runtimes do. One Metrics may serve several runtimes: each series is
// labelled with the runtime's kind.
type Metrics struct {
	ensures    *prometheus.CounterVec
	execs      *prometheus.CounterVec
	exitCodes  *prometheus.CounterVec
	reaped     *prometheus.CounterVec
	sweeps     *prometheus.CounterVec
	sweptProcs *prometheus.CounterVec
}

// NewMetrics makes the runtime metrics and registers them on reg; a nil reg leaves them
// unregistered.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ensures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hermes_runtime_ensures_total",
			Help: "Ensures of an org's unit, by runtime, role and start (cold: started, warm: found running).",
		}, []string{"runtime", "role", "start"}),
		execs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hermes_runtime_execs_total",
			Help: "Execs in org workers, by runtime and outcome (exited, out_of_memory, canceled, worker_gone, not_started, failed).",
		}, []string{"runtime", "outcome"}),
		exitCodes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hermes_runtime_exec_exit_codes_total",
			Help: "Exit codes of execs that ran to an end, by runtime and code.",
		}, []string{"runtime", "code"}),
		reaped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hermes_runtime_reaped_total",
			Help: "Units removed by reaping, by runtime and reason (idle, exited, stale).",
		}, []string{"runtime", "reason"}),
		sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hermes_runtime_sweeps_total",
			Help: "Sweeps of a worker after its execs, by runtime and result (nothing_left: the engine's process list showed nothing of the units' user, so no sweep ran; clean: the sweep found nothing, killed: processes left were killed, failed: the worker was removed instead).",
		}, []string{"runtime", "result"}),
		sweptProcs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hermes_runtime_swept_processes_total",
			Help: "Processes an exec left behind in its worker, killed by a sweep, by runtime.",
		}, []string{"runtime"}),
	}
	if reg != nil {
		reg.MustRegister(m.ensures, m.execs, m.exitCodes, m.reaped, m.sweeps, m.sweptProcs)
	}
	return m
}

func (m *Metrics) ensured(kind string, role Role, cold bool) {
	start := "warm"
	if cold {
		start = "cold"
	}
	m.ensures.WithLabelValues(kind, string(role), start).Inc()
}

// execEnded counts one exec; its exit code counts only when the program ran to an end.
func (m *Metrics) execEnded(kind string, status ExitStatus, outcome string) {
	m.execs.WithLabelValues(kind, outcome).Inc()
	if outcome == outcomeExited || outcome == outcomeOutOfMemory {
		m.exitCodes.WithLabelValues(kind, strconv.Itoa(status.Code)).Inc()
	}
}

func (m *Metrics) reapedUnits(kind, reason string, n int) {
	if n > 0 {
		m.reaped.WithLabelValues(kind, reason).Add(float64(n))
	}
}

// Outcomes of an exec, as metric label values.
const (
	outcomeExited      = "exited"
	outcomeOutOfMemory = "out_of_memory"
	outcomeCanceled    = "canceled"
	outcomeWorkerGone  = "worker_gone"
	outcomeNotStarted  = "not_started"
	outcomeFailed      = "failed"
)

// nothingLeft counts one end of a worker's execs that left nothing to sweep.
func (m *Metrics) nothingLeft(kind string) {
	m.sweeps.WithLabelValues(kind, "nothing_left").Inc()
}

// swept counts one sweep of a worker and the processes it killed.
func (m *Metrics) swept(kind string, killed int, ok bool) {
	result := "clean"
	switch {
	case !ok:
		result = "failed"
	case killed > 0:
		result = "killed"
		m.sweptProcs.WithLabelValues(kind).Add(float64(killed))
	}
	m.sweeps.WithLabelValues(kind, result).Inc()
}
