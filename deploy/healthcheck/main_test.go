package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestCheckPassesOnlyOn200(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			w.Write([]byte("ok\n"))
			return
		}
		http.Error(w, "database: connection refused\nsecond line", http.StatusServiceUnavailable)
	}))
	defer srv.Close()

	if err := check([]string{srv.URL + "/healthz"}); err != nil {
		t.Fatalf("a 200: %v", err)
	}
	err := check([]string{srv.URL + "/sick"})
	if err == nil || !strings.Contains(err.Error(), "503 Service Unavailable: database: connection refused") || strings.Contains(err.Error(), "second line") {
		t.Fatalf("a 503: %v", err)
	}
	for _, args := range [][]string{nil, {"a", "b"}, {"https://example.invalid/healthz"}, {"/healthz"}} {
		if err := check(args); err == nil {
			t.Errorf("check(%q) passed", args)
		}
	}
	srv.Close()
	if err := check([]string{srv.URL + "/healthz"}); err == nil {
		t.Error("a closed server passed")
	}
}
