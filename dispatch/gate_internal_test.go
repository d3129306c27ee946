package dispatch

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"hermeshost/gateway"
	"hermeshost/internal/hosttest"
	"hermeshost/pg/pgtest"
	"hermeshost/sartiq"
)

// The gateway gate is asked once for a burst of ready steps and cycles, again once it is
// gateFresh old, and at every step while it is closed: a real gateway behind a proxy that
// counts its model lists and can answer 503 as a gateway that lost its upstream does.
func TestTheGateIsAskedOncePerSecondWhileOpenAndAtEveryStepWhileClosed(t *testing.T) {
	gw, err := url.Parse(hosttest.DemoGateway(t, "gw-secret", "host-key"))
	if err != nil {
		t.Fatal(err)
	}
	var lists atomic.Int64
	var down atomic.Bool
	proxy := httputil.NewSingleHostReverseProxy(gw)
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			lists.Add(1)
		}
		if down.Load() {
			http.Error(w, `{"error":{"message":"upstream unreachable"}}`, http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(counting.Close)

	_, db := pgtest.Schema(t)
	// Nothing listens: each poll fails at once (one try), past the gate.
	bot, err := sartiq.New("http://127.0.0.1:1", "bot-token", sartiq.WithRetry(sartiq.Retry{Attempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	d := New(Config{DB: db, Bot: bot, Instance: "gate-test", ClaimEnabled: true, Log: slog.New(slog.DiscardHandler), Registerer: reg,
		GatewayURL: counting.URL, GatewayKey: "host-key", WorkerModel: gateway.DemoWorkerModel, VisionModel: gateway.DemoVisionModel})
	t.Cleanup(d.Close)
	ctx := t.Context()

	// A burst: 8 ready steps at once and a cycle, as the ready loop's slots and a tick take
	// them. Each passes the gate (and fails at the poll, past it).
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if err := d.readyStep(ctx, "acme"); err == nil || errors.Is(err, ErrGateClosed) {
				t.Errorf("a ready step with the gateway up: %v, want the poll's error past an open gate", err)
			}
		})
	}
	wg.Wait()
	if _, err := d.Cycle(ctx); err == nil || errors.Is(err, ErrGateClosed) {
		t.Errorf("a cycle with the gateway up: %v, want the poll's error", err)
	}
	if n := lists.Load(); n != 1 {
		t.Fatalf("%d model lists for a burst of 9 steps, want 1", n)
	}

	time.Sleep(gateFresh + 100*time.Millisecond)
	if err := d.readyStep(ctx, "acme"); errors.Is(err, ErrGateClosed) {
		t.Fatal(err)
	}
	if n := lists.Load(); n != 2 {
		t.Fatalf("%d model lists once the gate was %s old, want 2", n, gateFresh)
	}

	// The gateway loses its upstream: noticed within gateFresh, and asked at every step.
	down.Store(true)
	time.Sleep(gateFresh + 100*time.Millisecond)
	for i := range 3 {
		if err := d.readyStep(ctx, "acme"); !errors.Is(err, ErrGateClosed) {
			t.Fatalf("step %d with the gateway answering 503: %v, want ErrGateClosed", i, err)
		}
	}
	if _, err := d.Cycle(ctx); !errors.Is(err, ErrGateClosed) {
		t.Fatalf("a cycle with the gateway answering 503: %v, want ErrGateClosed", err)
	}
	if n := lists.Load(); n != 6 {
		t.Fatalf("%d model lists, want 6: each step asks a closed gate again", n)
	}
	if got := testutil.ToFloat64(d.metrics.gateClosed); got != 4 {
		t.Errorf("gate closed counted %v times, want 4", got)
	}
	// Back up: the next step opens it.
	down.Store(false)
	if err := d.readyStep(ctx, "acme"); errors.Is(err, ErrGateClosed) {
		t.Fatalf("the gateway is back: %v", err)
	}
}
