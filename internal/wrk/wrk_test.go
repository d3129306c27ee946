package wrk

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestRunMeasuresAServerInAnotherProcess(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	var seen atomic.Int64
	var header atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		header.Store(r.Header.Get("X-Test"))
		if r.URL.Path == "/missing" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	r, err := Run(t.Context(), srv.URL+"/", Load{Connections: 4, Threads: 1, Duration: time.Second, Headers: map[string]string{"X-Test": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests == 0 || int64(r.Requests) > seen.Load() || r.PerSecond <= 0 || r.P50 <= 0 || r.P99 < r.P50 || r.Non2xx != 0 {
		t.Fatalf("result %+v (server saw %d)", r, seen.Load())
	}
	if header.Load() != "yes" {
		t.Fatal("the header did not reach the server")
	}
	r, err = Run(t.Context(), srv.URL+"/missing", Load{Connections: 2, Duration: time.Second})
	if err != nil || r.Non2xx == 0 {
		t.Fatalf("404s not counted: %+v %v", r, err)
	}
	if _, err := Run(t.Context(), "http://192.0.2.1/", Load{Connections: 1, Duration: time.Second}); err == nil {
		t.Fatal("a URL off this machine was loaded")
	}
}
