// Package service holds what every hermes-host server shares: JSON logs, /healthz with
// reasons, Prometheus /metrics, and a listener that drains in-flight requests on shutdown.
package service
