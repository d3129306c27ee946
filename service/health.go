package service

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"sync"
	"time"
)

// Health answers /healthz: 200 when every check passes, 503 with each failing check's
// reason otherwise. Checks are either probes run on each request (a database ping) or
// alarms a component raises and clears itself (a credential write that keeps failing).
type Health struct {
	mu     sync.Mutex
	probes map[string]func(context.Context) error
	alarms map[string]string
}

// NewHealth is an empty, healthy Health.
func NewHealth() *Health {
	return &Health{probes: map[string]func(context.Context) error{}, alarms: map[string]string{}}
}

// Probe registers a check that runs on every /healthz request.
func (h *Health) Probe(name string, check func(context.Context) error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.probes[name] = check
}

// Alarm raises (reason != "") or clears (reason == "") a named alarm.
func (h *Health) Alarm(name, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if reason == "" {
		delete(h.alarms, name)
		return
	}
	h.alarms[name] = reason
}

// Report is what /healthz answers.
type Report struct {
	Status  string            `json:"status"`
	Reasons map[string]string `json:"reasons,omitempty"`
	Checks  []string          `json:"checks"`
}

// Check runs every probe (each bounded by timeout) and collects the alarms.
func (h *Health) Check(ctx context.Context, timeout time.Duration) Report {
	h.mu.Lock()
	probes := make(map[string]func(context.Context) error, len(h.probes))
	for k, v := range h.probes {
		probes[k] = v
	}
	r := Report{Status: "ok", Reasons: map[string]string{}}
	for k, v := range h.alarms {
		r.Reasons[k] = v
		r.Checks = append(r.Checks, k)
	}
	h.mu.Unlock()

	for name, probe := range probes {
		r.Checks = append(r.Checks, name)
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := probe(pctx)
		cancel()
		if err != nil {
			r.Reasons[name] = err.Error()
		}
	}
	sort.Strings(r.Checks)
	if len(r.Reasons) > 0 {
		r.Status = "unhealthy"
	}
	return r
}

// ServeHTTP writes the report as JSON.
func (h *Health) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rep := h.Check(r.Context(), 2*time.Second)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if rep.Status != "ok" {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(rep)
}
