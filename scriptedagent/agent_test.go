package scriptedagent

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"hermeshost/gateway"
)

// endpointLog is an OpenAI-compatible endpoint (the gateway's demo model) that records each
// request's method, path and whether it carried a key.
type endpointLog struct {
	mu   sync.Mutex
	seen []string
}

func (l *endpointLog) start(t *testing.T) *httptest.Server {
	demo := gateway.Demo()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.seen = append(l.seen, r.Method+" "+r.URL.Path+" auth="+r.Header.Get("Authorization"))
		l.mu.Unlock()
		demo.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func (l *endpointLog) requests() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.seen...)
}

// workspace makes a home and a product_ingest workspace with an empty catalogue, and moves
// the test into the workspace, where Hermes is started.
func workspace(t *testing.T) string {
	home := t.TempDir()
	ws := filepath.Join(home, "workspaces", "job-1")
	if err := os.MkdirAll(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	manifest := `{"job_id": "job-1", "type": "product_ingest", "organization_id": "acme", "sources": []}`
	if err := os.WriteFile(filepath.Join(ws, "manifest.json"), []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(ws)
	t.Setenv(EnvHome, home)
	return home
}

// configureProvider writes home's config.yaml as the host does: a provider at baseURL
// whose key is in the environment.
func configureProvider(t *testing.T, home, baseURL string) {
	t.Helper()
	config := "model:\n  provider: hermes-host\n  default: demo-worker\nproviders:\n  hermes-host:\n    base_url: " + baseURL + "\n    key_env: TEST_GATEWAY_KEY\n"
	if err := os.WriteFile(filepath.Join(home, "config.yaml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEST_GATEWAY_KEY", "the-org-key")
}

// A run configured the way the real CLI ignores (OPENAI_BASE_URL, OPENAI_API_KEY,
// HERMES_MODEL) fails as the real one does offline, and never calls that endpoint.
func TestEnvironmentAloneConfiguresNoEndpoint(t *testing.T) {
	var log endpointLog
	srv := log.start(t)
	workspace(t)
	t.Setenv("OPENAI_BASE_URL", srv.URL+"/v1")
	t.Setenv("OPENAI_API_KEY", "k")
	t.Setenv("HERMES_MODEL", "demo-worker")
	var out, errb bytes.Buffer
	code := Main(context.Background(), []string{"chat", "-q", "go", "-Q", "--source", "tool", "--max-turns", "3"}, &out, &errb)
	if code != ExitFailed || !strings.Contains(errb.String(), "no model provider configured in config.yaml") {
		t.Fatalf("exit %d\n%s", code, errb.String())
	}
	if got := log.requests(); len(got) != 0 {
		t.Fatalf("the endpoint from the environment was called: %v", got)
	}
}

func TestConfigYAMLProviderIsProbedThenStreamed(t *testing.T) {
	var log endpointLog
	srv := log.start(t)
	home := workspace(t)
	configureProvider(t, home, srv.URL+"/v1")
	var out, errb bytes.Buffer
	code := Main(context.Background(), []string{"chat", "-q", "go", "-Q", "--source", "tool", "--max-turns", "3"}, &out, &errb)
	// With an empty catalogue nothing is proposed; listProducts fails without a sartiq on
	// PATH, which is the run's only failure here.
	if code != ExitFailed || !strings.Contains(errb.String(), "sartiq") {
		t.Fatalf("exit %d\n%s", code, errb.String())
	}
	got := log.requests()
	want := []string{"GET /v1/models auth=", "GET /api/v1/models auth=", "POST /api/show auth=", "GET /v1/models/demo-worker auth="}
	if len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
		t.Fatalf("start-up probes %v, want %v first", got, want)
	}
	if !strings.Contains(errb.String(), "session_id: ") {
		t.Fatalf("no session_id line on stderr:\n%s", errb.String())
	}
}

// The start-up probe is best effort, as the real CLI's is: legs whose connection drops are
// passed over, and the run goes on.
func TestAProbeThatCannotConnectDoesNotFailTheRun(t *testing.T) {
	var log endpointLog
	demo := gateway.Demo()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.mu.Lock()
		log.seen = append(log.seen, r.Method+" "+r.URL.Path)
		log.mu.Unlock()
		if strings.Contains(r.URL.Path, "/models") || strings.HasPrefix(r.URL.Path, "/api/") {
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				c.Close()
			}
			return
		}
		demo.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	home := workspace(t)
	configureProvider(t, home, srv.URL+"/v1")
	var out, errb bytes.Buffer
	code := Main(context.Background(), []string{"chat", "-q", "go", "-Q", "--source", "tool", "--max-turns", "3"}, &out, &errb)
	// The run goes on past the probe to the job's own work: listProducts fails without a
	// sartiq on PATH, as in the test above.
	if code != ExitFailed || !strings.Contains(errb.String(), "sartiq") || strings.Contains(errb.String(), "model endpoint") {
		t.Fatalf("exit %d\n%s", code, errb.String())
	}
	// Each leg failed and the next was tried, as the real CLI does for a failure other than
	// a connect timeout.
	want := []string{"GET /v1/models", "GET /api/v1/models", "POST /api/show", "GET /v1/models/demo-worker"}
	if got := log.requests(); len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
		t.Fatalf("probes %v, want %v first", got, want)
	}
}
