package dispatch

import (
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/atomicfile"
)

type metrics struct {
	cycle           prometheus.Histogram
	gateClosed      prometheus.Counter
	claims          *prometheus.CounterVec
	outcomes        *prometheus.CounterVec
	inFlight        prometheus.Gauge
	owned           prometheus.Gauge
	attemptMismatch prometheus.Counter
	claimToAgent    prometheus.Histogram
	skillsDisabled  prometheus.Counter
	outputDropped   *prometheus.CounterVec
	wrongOrg        prometheus.Counter
	crashesEnded    *prometheus.CounterVec
	gaveUp          prometheus.Counter
	readySteps      prometheus.Counter
	workerWrites    *prometheus.CounterVec
	keepRound       prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		cycle: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hermes_dispatch_cycle_seconds",
			Help: "Duration of one poll cycle.", Buckets: prometheus.DefBuckets}),
		gateClosed: prometheus.NewCounter(prometheus.CounterOpts{Name: "hermes_dispatch_gate_closed_total",
			Help: "Cycles skipped because the gateway did not serve both models."}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_dispatch_claims_total",
			Help: "Jobs claimed (kind claim) and stale jobs re-claimed (kind reclaim)."}, []string{"kind"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_dispatch_outcomes_total",
			Help: "Job runs by how they ended."}, []string{"outcome"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hermes_dispatch_jobs_in_flight",
			Help: "Jobs running now, at most one per org."}),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hermes_dispatch_orgs_owned",
			Help: "Organizations whose org: lease this dispatcher holds."}),
		attemptMismatch: prometheus.NewCounter(prometheus.CounterOpts{Name: "hermes_dispatch_attempt_mismatch_total",
			Help: "Recoveries where claim_attempts disagreed with the backend's job log."}),
		claimToAgent: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hermes_dispatch_claim_to_agent_seconds",
			Help: "From a claim to its agent's start.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
		skillsDisabled: prometheus.NewCounter(prometheus.CounterOpts{Name: "hermes_dispatch_skills_disabled_total",
			Help: "Authored skills the cap (SKILLS_MAX_AUTHORED) disabled before an agent start, never deleted."}),
		outputDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_dispatch_worker_output_dropped_total",
			Help: "What the dispatcher did not keep of its workers' output: stderr bytes past the kept tail, progress lines past a job's limit or too long."},
			[]string{"what"}),
		wrongOrg: prometheus.NewCounter(prometheus.CounterOpts{Name: "hermes_dispatch_wrong_org_claims_total",
			Help: "Claims the backend answered for another organization than the one reserved, released unrun."}),
		crashesEnded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_dispatch_crashed_attempts_ended_total",
			Help: "Runs that ended without an outcome (worker or container died, OOM, broken exec stream) whose attempt the dispatcher ended at once, by what became of the job: released (queued to run again) or failed (at MAX_ATTEMPTS)."},
			[]string{"job"}),
		gaveUp: prometheus.NewCounter(prometheus.CounterOpts{Name: "hermes_dispatch_attempts_exhausted_total",
			Help: "Jobs failed for good because their crashed attempts reached MAX_ATTEMPTS."}),
		readySteps: prometheus.NewCounter(prometheus.CounterOpts{Name: "hermes_dispatch_ready_steps_total",
			Help: "Steps taken for an org at once when its run here ended (its next job claimed without waiting for the next cycle)."}),
		workerWrites: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hermes_dispatch_worker_file_write_errors_total",
			Help: "Failed file writes (a job's checkpoint, the org home's files) that workers' run-job, which is never scraped, reported in their outcomes, by cause as hermes_file_write_errors_total counts them: a disk under ORGS_ROOT."},
			[]string{"cause"}),
		keepRound: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hermes_dispatch_org_lease_refresh_round_seconds",
			Help: "Duration of one round refreshing every owned org: lease (it must stay well under a third of LEASE_TTL).", Buckets: prometheus.DefBuckets}),
	}
	for _, c := range atomicfile.WriteErrorCauses() {
		m.workerWrites.WithLabelValues(c)
	}
	if reg != nil {
		reg.MustRegister(m.cycle, m.gateClosed, m.claims, m.outcomes, m.inFlight, m.owned, m.attemptMismatch, m.claimToAgent, m.skillsDisabled, m.outputDropped, m.wrongOrg,
			m.crashesEnded, m.gaveUp, m.readySteps, m.workerWrites, m.keepRound)
	}
	return m
}

// maxWorkerWriteErrors bounds what one run adds to a cause: more failed writes than a run
// makes is a worker that lies, and must not swamp the counter.
const maxWorkerWriteErrors = 1e6

// countWorkerWriteErrors adds the failed writes an outcome (the data of a worker's outcome
// event) reports to hermes_dispatch_worker_file_write_errors_total. The worker runs in the
// org's unit, so the report is untrusted: a cause atomicfile does not count by is "other",
// what is not a positive number is ignored, each cause takes at most maxWorkerWriteErrors a
// run, and a report that does not parse adds nothing. It answers what it added, by cause.
func (m *metrics) countWorkerWriteErrors(outcome json.RawMessage) map[string]float64 {
	var reported struct {
		FileWriteErrors map[string]json.RawMessage `json:"file_write_errors"`
	}
	if json.Unmarshal(outcome, &reported) != nil {
		return nil
	}
	causes := atomicfile.WriteErrorCauses()
	sums := make(map[string]float64)
	for cause, raw := range reported.FileWriteErrors {
		// Only a JSON number parses as a float (not a string, object or literal); one past
		// float64's range is ±Inf, which the bounds below take care of.
		n, err := strconv.ParseFloat(string(raw), 64)
		if (err != nil && !errors.Is(err, strconv.ErrRange)) || !(n >= 1) {
			continue
		}
		if !slices.Contains(causes, cause) {
			cause = "other"
		}
		sums[cause] = min(sums[cause]+math.Floor(min(n, maxWorkerWriteErrors)), maxWorkerWriteErrors)
	}
	for cause, n := range sums {
		m.workerWrites.WithLabelValues(cause).Add(n)
	}
	return sums
}
