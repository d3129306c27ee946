package gateway

import "github.com/prometheus/client_golang/prometheus"

// Request outcomes, the values of gateway_requests_total's outcome label.
const (
	outcomeOK                   = "ok"
	outcomeUpstreamStatus       = "upstream_status" // the upstream answered with an error status
	outcomeUpstreamUnreachable  = "upstream_unreachable"
	outcomeUpstreamUnauthorized = "upstream_unauthorized" // the upstream refused the gateway's credential
	outcomeLoginFailed          = "login_failed"          // no usable upstream access token
	outcomeUnauthorized         = "unauthorized"
	outcomeRateLimited          = "rate_limited"
	outcomeBusy                 = "busy"
	outcomeTooLarge             = "too_large"
	outcomeClientGone           = "client_gone"
)

// unauthenticated labels requests without a valid key; like hostCaller it is outside the
// org id alphabet.
const unauthenticated = "_unauthenticated"

type proxyMetrics struct {
	requests *prometheus.CounterVec
	upstream *prometheus.HistogramVec
}

func newProxyMetrics(reg prometheus.Registerer) *proxyMetrics {
	m := &proxyMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_requests_total",
			Help: "Gateway requests by caller (org id, _host or _unauthenticated), endpoint and outcome.",
		}, []string{"org", "endpoint", "outcome"}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gateway_upstream_duration_seconds",
			Help:    "Time from sending a request upstream to its response headers, by endpoint.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"endpoint"}),
	}
	reg.MustRegister(m.requests, m.upstream)
	return m
}

type loginMetrics struct {
	refreshes      *prometheus.CounterVec
	persistFailed  prometheus.Counter
	persistPending prometheus.Gauge
}

func newLoginMetrics(reg prometheus.Registerer) *loginMetrics {
	m := &loginMetrics{
		refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_token_refreshes_total",
			Help: "Refresh-token grants sent to the provider, by result (ok, failed, identity_mismatch).",
		}, []string{"result"}),
		persistFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gateway_auth_persist_failures_total",
			Help: "Failed attempts to write a rotated login to auth.json.",
		}),
		persistPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gateway_auth_persist_pending",
			Help: "1 while the login in memory is newer than auth.json (the alarm), else 0.",
		}),
	}
	reg.MustRegister(m.refreshes, m.persistFailed, m.persistPending)
	return m
}
