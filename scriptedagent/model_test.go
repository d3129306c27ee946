package scriptedagent

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"hermeshost/gateway"
)

// cuttingEndpoint is the demo model behind an endpoint that cuts the first cuts completion
// streams after their first chunk, as a connection lost mid-answer does.
func cuttingEndpoint(t *testing.T, cuts int32) (*httptest.Server, *atomic.Int32) {
	demo := gateway.Demo()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" || calls.Add(1) > cuts {
			demo.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"half\"}}]}\n\n"))
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

// A completion whose stream breaks is tried again, as the real CLI tries a failed API call
// three more times: two cuts are survived, the answer is the whole one; four cuts fail the
// call after the fourth try, saying why.
func TestABrokenModelStreamIsRetriedThreeTimes(t *testing.T) {
	for _, c := range []struct {
		cuts      int32
		wantErr   bool
		wantCalls int32
	}{{cuts: 2, wantCalls: 3}, {cuts: 4, wantErr: true, wantCalls: 4}} {
		srv, calls := cuttingEndpoint(t, c.cuts)
		var errb bytes.Buffer
		r := &run{ctx: context.Background(), stderr: &errb, ep: endpoint{baseURL: srv.URL + "/v1", model: gateway.DemoWorkerModel}}
		text, _, err := r.complete([]map[string]string{{"role": "user", "content": "hello"}})
		if got := calls.Load(); got != c.wantCalls {
			t.Errorf("%d cuts: %d calls, want %d", c.cuts, got, c.wantCalls)
		}
		if c.wantErr {
			if err == nil || !strings.Contains(err.Error(), "model stream") {
				t.Errorf("%d cuts: error %v, want the broken stream", c.cuts, err)
			}
			continue
		}
		if err != nil || text == "" || strings.HasPrefix(text, "half") {
			t.Errorf("%d cuts: answer %q, error %v; want the whole answer", c.cuts, text, err)
		}
	}
}

// An answer the endpoint gives (an HTTP status) is not a broken connection: no retry.
func TestAModelRefusalIsNotRetried(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, "no such key", http.StatusUnauthorized)
	}))
	t.Cleanup(srv.Close)
	r := &run{ctx: context.Background(), stderr: &bytes.Buffer{}, ep: endpoint{baseURL: srv.URL + "/v1", model: "m"}}
	if _, _, err := r.complete(nil); err == nil || !strings.Contains(err.Error(), "401") || calls.Load() != 1 {
		t.Fatalf("error %v after %d calls, want the 401 once", err, calls.Load())
	}
}
