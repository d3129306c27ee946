package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func unixClient(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
}

func TestTokenProxyAddsTheTokenAndReportsAcceptedWrites(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization")+" cookie="+r.Header.Get("Cookie"))
		mu.Unlock()
		if strings.Contains(r.URL.Path, "imagery") {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		w.Write([]byte(`{"ok":true}`)) //nolint:errcheck
	}))
	defer backend.Close()
	api, _ := url.Parse(backend.URL)
	socket := filepath.Join(t.TempDir(), "sartiq.sock")
	var accepted []Accepted
	proxy, err := StartTokenProxy(socket, api, "job-token-secret", slog.New(slog.DiscardHandler), func(a Accepted) {
		mu.Lock()
		accepted = append(accepted, a)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(socket); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode: %v %v", st, err)
	}
	c := unixClient(socket)
	for _, req := range []struct{ method, path string }{
		{"PUT", "/organizations/acme/guidelines/typography/proposal"},
		{"PUT", "/organizations/acme/guidelines/imagery/proposal"},
		{"POST", "/organizations/acme/product-proposals"},
		{"GET", "/organizations/acme/products"},
	} {
		r, _ := http.NewRequest(req.method, "http://sartiq"+req.path, strings.NewReader("{}"))
		r.Header.Set("Authorization", "Bearer agent-supplied")
		r.Header.Set("Cookie", "session=operator")
		resp, err := c.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
	}
	c.CloseIdleConnections()
	if err := proxy.Close(); err != nil {
		t.Fatal(err)
	}
	for _, s := range seen {
		if !strings.Contains(s, "Bearer job-token-secret") || strings.Contains(s, "agent-supplied") || !strings.HasSuffix(s, "cookie=") {
			t.Errorf("backend saw %q", s)
		}
	}
	if len(accepted) != 2 || accepted[0] != (Accepted{"proposeGuidelines", "typography"}) || accepted[1].Operation != "proposeProducts" {
		t.Fatalf("accepted writes: %+v (a 422 must not count)", accepted)
	}
	if _, err := os.Stat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after Close: %v", err)
	}
}

func TestHomeLockIsExclusive(t *testing.T) {
	home := t.TempDir()
	first, err := LockHome(home)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LockHome(home); !errors.Is(err, ErrHomeBusy) {
		t.Fatalf("second lock: %v", err)
	}
	if err := first.Unlock(); err != nil {
		t.Fatal(err)
	}
	again, err := LockHome(home)
	if err != nil {
		t.Fatalf("after unlock: %v", err)
	}
	again.Unlock() //nolint:errcheck
}

func TestCheckpointIsDurableAndStrict(t *testing.T) {
	ws := t.TempDir()
	c, err := OpenCheckpoint(ws, "job-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Add("tone-of-voice", "logo-usage", "tone-of-voice"); err != nil {
		t.Fatal(err)
	}
	again, err := OpenCheckpoint(ws, "job-1")
	if err != nil || strings.Join(again.Categories(), ",") != "tone-of-voice,logo-usage" {
		t.Fatalf("reopened: %v %v", again.Categories(), err)
	}
	if _, err := OpenCheckpoint(ws, "job-2"); err == nil || !strings.Contains(err.Error(), "is of job job-1") {
		t.Fatalf("another job's checkpoint: %v", err)
	}
	path := filepath.Join(ws, CheckpointFile)
	if err := os.WriteFile(path, []byte(`{"job_id":"job-1","categ`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenCheckpoint(ws, "job-1"); err == nil {
		t.Fatal("a truncated checkpoint was taken as empty")
	}
	if b, _ := os.ReadFile(path); string(b) != `{"job_id":"job-1","categ` {
		t.Fatalf("loading changed the file: %q", b)
	}
}

// With the API under a base path (SARTIQ_API_URL=https://host/api/v2) the proxy still
// forwards below it and still recognises the accepted writes.
func TestTokenProxyUnderABasePathReportsAcceptedWrites(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.Path)
		mu.Unlock()
		w.Write([]byte(`{"ok":true}`)) //nolint:errcheck
	}))
	defer backend.Close()
	api, _ := url.Parse(backend.URL + "/api/v2/")
	socket := filepath.Join(t.TempDir(), "sartiq.sock")
	var accepted []Accepted
	proxy, err := StartTokenProxy(socket, api, "job-token-secret", slog.New(slog.DiscardHandler), func(a Accepted) {
		mu.Lock()
		accepted = append(accepted, a)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	c := unixClient(socket)
	for _, req := range []struct{ method, path string }{
		{"PUT", "/organizations/acme/guidelines/typography/proposal"},
		{"POST", "/organizations/acme/product-proposals"},
	} {
		r, _ := http.NewRequest(req.method, "http://sartiq"+req.path, strings.NewReader("{}"))
		resp, err := c.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
	}
	c.CloseIdleConnections()
	if err := proxy.Close(); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || seen[0] != "/api/v2/organizations/acme/guidelines/typography/proposal" {
		t.Fatalf("the backend saw %q", seen)
	}
	if len(accepted) != 2 || accepted[0] != (Accepted{"proposeGuidelines", "typography"}) || accepted[1].Operation != "proposeProducts" {
		t.Fatalf("accepted writes under a base path: %+v", accepted)
	}
}
