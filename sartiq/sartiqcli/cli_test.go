package sartiqcli_test

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"hermeshost/pg/pgtest"
	"hermeshost/sartiq"
	"hermeshost/sartiq/backend"
	"hermeshost/sartiq/backend/backendtest"
)

// sartiqBin is hermes-host built under the name sartiq, as the agent's shell finds it.
var sartiqBin string

func TestMain(m *testing.M) {
	code := pgtest.Run(m)
	if sartiqDir != "" {
		os.RemoveAll(sartiqDir)
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	sartiqDir string
	buildErr  error
)

// buildSartiq builds hermes-host under the name sartiq, once, for the tests that run it; the
// fuzz workers, which run TestMain too, never pay for it.
func buildSartiq(t *testing.T) {
	t.Helper()
	buildOnce.Do(func() {
		if sartiqDir, buildErr = os.MkdirTemp("", "sartiq-bin"); buildErr != nil {
			return
		}
		sartiqBin = filepath.Join(sartiqDir, "sartiq")
		build := exec.Command("go", "build", "-o", sartiqBin, "hermeshost/cmd/hermes-host")
		build.Stderr = os.Stderr
		buildErr = build.Run()
	})
	if buildErr != nil {
		t.Fatalf("build sartiq: %v", buildErr)
	}
}

type result struct {
	code           int
	stdout, stderr string
}

func sartiqCmd(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	buildSartiq(t)
	cmd := exec.Command(sartiqBin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{code, out.String(), errb.String()}
}

func (r result) has(t *testing.T, token string) {
	t.Helper()
	if token != "" && (strings.Contains(r.stdout, token) || strings.Contains(r.stderr, token)) {
		t.Fatalf("the token is in the output:\n%s\n%s", r.stdout, r.stderr)
	}
}

func claimed(t *testing.T, b *backendtest.Backend, org, typ string) (string, *sartiq.Claim) {
	t.Helper()
	bot, err := sartiq.New(b.URL, backendtest.BotToken)
	if err != nil {
		t.Fatal(err)
	}
	id := b.DemoJob(t, org, typ)
	c, err := bot.Claim(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return id, c
}

func TestOpsListsMatchingOperations(t *testing.T) {
	b := backendtest.Start(t, backend.Config{})
	env := map[string]string{"SARTIQ_API_URL": b.URL}
	r := sartiqCmd(t, env, "ops", "guidelines")
	if r.code != 0 || !strings.Contains(r.stdout, "proposeGuidelines") || !strings.Contains(r.stdout, "PUT") ||
		!strings.Contains(r.stdout, "/organizations/{org}/guidelines/{category}/proposal") || strings.Contains(r.stdout, "claimAgentJob") {
		t.Fatalf("%+v", r)
	}
	r = sartiqCmd(t, env, "ops")
	if r.code != 0 || strings.Count(r.stdout, "\n") < 19 {
		t.Fatalf("all operations: %+v", r)
	}
	if r = sartiqCmd(t, env, "ops", "no-such-thing"); r.code != 1 || !strings.Contains(r.stderr, `no operation matches "no-such-thing"`) {
		t.Fatalf("%+v", r)
	}
}

func TestCallRunsAJobAndKeepsTheTokenOut(t *testing.T) {
	b := backendtest.Start(t, backend.Config{})
	id, claim := claimed(t, b, "acme", sartiq.TypeGuidelinesExtraction)
	token := claim.JobToken
	env := map[string]string{"SARTIQ_API_URL": b.URL, "SARTIQ_TOKEN": token}

	r := sartiqCmd(t, env, "call", "startAgentJob", "--path", "id="+id)
	r.has(t, token)
	var started sartiq.JobResponse
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &started) != nil || started.Job.Status != sartiq.StatusRunning {
		t.Fatalf("start: %+v", r)
	}
	// Flags may come before the operation too.
	r = sartiqCmd(t, env, "call", "--path", "org=acme", "--path=category=typography", "proposeGuidelines",
		"--json", `{"content": "Inter Bold for headlines", "sources": ["brand-book.md"]}`)
	r.has(t, token)
	if r.code != 0 || !strings.Contains(r.stdout, `"status": "pending_review"`) {
		t.Fatalf("propose: %+v", r)
	}
	r = sartiqCmd(t, env, "call", "listAgentJobEvents", "--path", "id="+id, "--query", "limit=1")
	if r.code != 0 || !strings.Contains(r.stdout, `"kind": "claim"`) || !strings.Contains(r.stdout, `"next_cursor"`) {
		t.Fatalf("events: %+v", r)
	}

	// HTTP errors: exit 1 with a one-line reason.
	r = sartiqCmd(t, env, "call", "proposeProducts", "--path", "org=acme", "--json", `{"products": [{"sku": "a", "name": "b"}]}`)
	r.has(t, token)
	if r.code != 1 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || !strings.Contains(r.stderr, "proposeProducts: 403 not_allowed") {
		t.Fatalf("not allowed: %+v", r)
	}
	r = sartiqCmd(t, env, "call", "listProducts", "--path", "org=globex")
	if r.code != 1 || !strings.Contains(r.stderr, "403 other_org") {
		t.Fatalf("other org: %+v", r)
	}
	r = sartiqCmd(t, env, "call", "listProducts", "--path", "org=../../agent-jobs")
	if r.code != 1 || !strings.Contains(r.stderr, "400") {
		t.Fatalf("traversal: %+v", r)
	}
}

func TestCallMistakesAreUsageErrors(t *testing.T) {
	b := backendtest.Start(t, backend.Config{})
	id, claim := claimed(t, b, "globex", sartiq.TypeProductIngest)
	env := map[string]string{"SARTIQ_API_URL": b.URL, "SARTIQ_TOKEN": claim.JobToken}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"call"}, "name the operation"},
		{[]string{"call", "frobnicateJob"}, `unknown operationId "frobnicateJob"`},
		{[]string{"call", "startAgentJob"}, "startAgentJob needs --path id=VALUE"},
		{[]string{"call", "startAgentJob", "--path", "id=" + id, "--path", "org=x"}, `no path parameter "org"`},
		{[]string{"call", "listProducts", "--path", "org=globex", "--query", "page=2"}, `no query parameter "page"`},
		{[]string{"call", "startAgentJob", "--path", "id=" + id, "--json", "{}"}, "takes no request body"},
		{[]string{"call", "failAgentJob", "--path", "id=" + id}, "needs a request body"},
		{[]string{"call", "failAgentJob", "--path", "id=" + id, "--json", "{not json"}, "--json is not valid JSON"},
		{[]string{"call", "startAgentJob", "--path", "id"}, `"id" is not name=value`},
		{[]string{"call", "startAgentJob", "listProducts"}, "one operation at a time"},
		{[]string{"call", "--token", "x", "startAgentJob"}, "flag provided but not defined: -token"},
	}
	before := snapshot(t, b)
	for _, c := range cases {
		r := sartiqCmd(t, env, c.args...)
		r.has(t, claim.JobToken)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: want exit 2 and %q, got %+v", c.args, c.want, r)
		}
	}
	if after := snapshot(t, b); after != before {
		t.Fatal("a usage error changed the backend")
	}
}

func snapshot(t *testing.T, b *backendtest.Backend) string {
	t.Helper()
	var s string
	if err := b.DB.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM agent_job_events)::text || '/' ||
		(SELECT string_agg(status || attempt, ',' ORDER BY id) FROM agent_jobs)`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestUnreachableOrInvalidDocument(t *testing.T) {
	r := sartiqCmd(t, map[string]string{"SARTIQ_API_URL": "http://127.0.0.1:1", "SARTIQ_TOKEN": "tok-not-to-print"}, "ops")
	r.has(t, "tok-not-to-print")
	if r.code != 1 || !strings.Contains(r.stderr, "read the API's operations from http://127.0.0.1:1/openapi.json") {
		t.Fatalf("unreachable: %+v", r)
	}
	bad := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"openapi": "3.0.3", "paths": {"/x": {"get": {"operationId": 5}}}}`)) //nolint:errcheck
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go bad.Serve(ln) //nolint:errcheck // ends with Close
	defer bad.Close()
	r = sartiqCmd(t, map[string]string{"SARTIQ_API_URL": "http://" + ln.Addr().String()}, "call", "x")
	if r.code != 1 || !strings.Contains(r.stderr, "not an OpenAPI document") && !strings.Contains(r.stderr, "not a valid OpenAPI document") {
		t.Fatalf("invalid document: %+v", r)
	}
	if r = sartiqCmd(t, nil, "ops"); r.code != 1 || !strings.Contains(r.stderr, "set SARTIQ_PROXY_SOCKET") {
		t.Fatalf("no configuration: %+v", r)
	}
}

// Inside a job, sartiq talks to the worker's proxy and holds no token at all.
func TestCallThroughTheProxySocket(t *testing.T) {
	b := backendtest.Start(t, backend.Config{})
	id, claim := claimed(t, b, "acme", sartiq.TypeProductIngest)
	target, _ := url.Parse(b.URL)
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		r.Out.Header.Set("Authorization", "Bearer "+claim.JobToken)
	}}
	sock := filepath.Join(t.TempDir(), "p.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: proxy}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	defer srv.Close()
	r := sartiqCmd(t, map[string]string{"SARTIQ_PROXY_SOCKET": sock}, "call", "getAgentJobManifest", "--path", "id="+id)
	r.has(t, claim.JobToken)
	if r.code != 0 || !strings.Contains(r.stdout, `"catalog.csv"`) {
		t.Fatalf("%+v", r)
	}
	if r = sartiqCmd(t, map[string]string{"SARTIQ_PROXY_SOCKET": sock}, "ops", "claim"); r.code != 0 || !strings.Contains(r.stdout, "claimAgentJob") {
		t.Fatalf("ops over the socket: %+v", r)
	}
}

// hermes-host sartiq is the same command.
func TestHermesHostSartiqSubcommand(t *testing.T) {
	b := backendtest.Start(t, backend.Config{})
	buildSartiq(t)
	hh := filepath.Join(t.TempDir(), "hermes-host")
	if err := os.Link(sartiqBin, hh); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(hh, "sartiq", "ops", "reclaim")
	cmd.Env = []string{"SARTIQ_API_URL=" + b.URL}
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), "reclaimAgentJob") {
		t.Fatalf("%v %s", err, out)
	}
}
