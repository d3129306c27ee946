package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"hermeshost/orgid"
	"hermeshost/service"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	testSecret  = "test-gateway-secret"
	testHostKey = "test-host-internal-key"
)

// lockedBuffer collects a logger's lines from many goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type harness struct {
	url string
	ops *service.Ops
}

func newOps() (*service.Ops, *lockedBuffer) {
	logs := &lockedBuffer{}
	return service.NewOps(service.NewLogger(logs, slog.LevelDebug, "gateway-test")), logs
}

// startGateway serves a gateway in front of upstream; edit changes the defaults.
func startGateway(t *testing.T, upstream string, ops *service.Ops, edit func(*Config)) *harness {
	t.Helper()
	if ops == nil {
		ops, _ = newOps()
	}
	cfg := Config{
		UpstreamURL: upstream, Secret: testSecret, HostKey: testHostKey,
		OrgRPS: 1000, OrgBurst: 1000, OrgConcurrency: 100, MaxRequestBytes: 1 << 20, Ops: ops,
	}
	if edit != nil {
		edit(&cfg)
	}
	return serveGateway(t, cfg, nil)
}

// serveGateway serves a gateway built from cfg, its handler wrapped by wrap if given.
func serveGateway(t *testing.T, cfg Config, wrap func(http.Handler) http.Handler) *harness {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &harness{url: srv.URL, ops: cfg.Ops}
}

func orgKey(t *testing.T, org string) string {
	t.Helper()
	k, err := OrgKey(testSecret, org)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// call sends one request with Authorization set to auth (none when empty).
func call(t *testing.T, method, url, auth, body string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

const smallChat = `{"model":"demo-worker","messages":[{"role":"user","content":"hello there"}]}`

// openAIError is the error shape of every /v1 answer.
func openAIError(t *testing.T, body []byte) (typ, code string) {
	t.Helper()
	var e struct {
		Error struct {
			Message, Type, Code string
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" || e.Error.Code == "" {
		t.Fatalf("not an OpenAI-shaped error: %s", body)
	}
	return e.Error.Type, e.Error.Code
}

func TestOrgKeyFormatAndBadOrgs(t *testing.T) {
	k := orgKey(t, "acme-1")
	if !regexp.MustCompile(`^hgw_acme-1_[A-Za-z0-9_-]{43}$`).MatchString(k) {
		t.Fatalf("key %q is not hgw_<org>_<base64url HMAC-SHA256>", k)
	}
	if k2 := orgKey(t, "acme-1"); k2 != k {
		t.Fatal("OrgKey is not deterministic")
	}
	if other, _ := OrgKey("another-secret", "acme-1"); other == k {
		t.Fatal("the key does not depend on the secret")
	}
	for _, bad := range []string{"", "Acme", "a_b", "-a", "a/b", strings.Repeat("a", 64)} {
		if _, err := OrgKey(testSecret, bad); !errors.Is(err, orgid.ErrInvalid) {
			t.Errorf("OrgKey(%q): want orgid.ErrInvalid, got %v", bad, err)
		}
	}
	if _, err := OrgKey("", "acme"); err == nil {
		t.Fatal("an empty secret must not mint keys")
	}
}

func TestKeysAreBearerPerOrgAndUnforgeable(t *testing.T) {
	p := newFakeProvider(t, "acct")
	ops, _ := newOps()
	g := startGateway(t, p.baseURL(), ops, func(c *Config) { c.APIKey = "secret-access-0" })
	keyA, keyB := orgKey(t, "org-a"), orgKey(t, "org-b")
	_, macA, _ := strings.Cut(strings.TrimPrefix(keyA, keyPrefix), "_")
	tampered := []byte(keyA)
	tampered[len(tampered)-1] ^= 1

	for name, auth := range map[string]string{
		"no header":              "",
		"key without Bearer":     keyA,
		"Basic":                  "Basic " + keyA,
		"Basic user:pass":        "Basic b3JnLWE6" + macA,
		"org B with org A's MAC": "Bearer hgw_org-b_" + macA,
		"tampered":               "Bearer " + string(tampered),
		"empty bearer":           "Bearer ",
		"key of another secret":  "Bearer hgw_org-a_" + orgMAC("another-secret", "org-a"),
		"invalid org":            "Bearer hgw_ORG_" + orgMAC(testSecret, "ORG"),
		"provider's own token":   "Bearer secret-access-0",
	} {
		resp, body := call(t, "GET", g.url+"/v1/models", auth, "")
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: want 401, got %d %s", name, resp.StatusCode, body)
			continue
		}
		if _, code := openAIError(t, body); code != "invalid_api_key" {
			t.Errorf("%s: code %q", name, code)
		}
	}
	for _, auth := range []string{"Bearer " + keyA, "bearer " + keyB, "Bearer " + testHostKey} {
		if resp, body := call(t, "GET", g.url+"/v1/models", auth, ""); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", auth[:12], resp.StatusCode, body)
		}
	}
	m := ops.Registry
	counts := map[string]float64{}
	fams, err := m.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "gateway_requests_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			counts[labels["org"]+"/"+labels["outcome"]] += s.GetCounter().GetValue()
		}
	}
	want := map[string]float64{"org-a/ok": 1, "org-b/ok": 1, "_host/ok": 1, "_unauthenticated/unauthorized": 10}
	for k, v := range want {
		if counts[k] != v {
			t.Errorf("gateway_requests_total %s = %v, want %v (all: %v)", k, counts[k], v, counts)
		}
	}
}

// rawRequest writes a request line and headers as given, byte for byte, and returns the
// status code the gateway answered.
func rawRequest(t *testing.T, base, text string) int {
	t.Helper()
	u, _ := url.Parse(base)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, text); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", strings.SplitN(text, "\r\n", 2)[0], err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestNeverAnOpenProxy(t *testing.T) {
	var evilHits []string
	var evilMu sync.Mutex
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		evilMu.Lock()
		evilHits = append(evilHits, r.Method+" "+r.URL.String())
		evilMu.Unlock()
		writeJSON(w, 200, map[string]any{"object": "list", "data": []any{}})
	}))
	defer evil.Close()
	evilHost := strings.TrimPrefix(evil.URL, "http://")

	p := newFakeProvider(t, "acct")
	// The provider redirects embeddings to the evil host: the gateway must not follow.
	redirecting := http.NewServeMux()
	redirecting.HandleFunc("/v1/embeddings", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, evil.URL+"/v1/embeddings", http.StatusTemporaryRedirect)
	})
	redirecting.Handle("/", p.srv.Config.Handler)
	p.srv.Config.Handler = redirecting

	g := startGateway(t, p.baseURL(), nil, func(c *Config) { c.APIKey = "secret-access-0" })
	key := orgKey(t, "org-a")
	auth := "Authorization: Bearer " + key + "\r\n"
	gwHost := strings.TrimPrefix(g.url, "http://")
	body := smallChat
	post := func(target, host string) string {
		return "POST " + target + " HTTP/1.1\r\nHost: " + host + "\r\n" + auth +
			"Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\nConnection: close\r\n\r\n" + body
	}
	get := func(target, host string) string {
		return "GET " + target + " HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "Connection: close\r\n\r\n"
	}
	cases := []struct {
		name, text string
		want       int
	}{
		{"absolute-form request line", get("http://"+evilHost+"/v1/models", evilHost), 200},
		{"absolute-form chat", post("http://"+evilHost+"/v1/chat/completions", evilHost), 200},
		{"Host header of another host", get("/v1/models", evilHost), 200},
		{"dot segments", get("/v1/../../x", gwHost), 404},
		{"dot segments to a real route", get("/x/../v1/models", gwHost), 404},
		{"scheme-relative path", get("//"+evilHost+"/v1/models", gwHost), 404},
		{"encoded slashes", get("/v1%2F..%2F..%2Fmodels", gwHost), 404},
		{"encoded slash in a route", get("/v1/models%2F..%2F..%2Fx", gwHost), 404},
		{"encoded host", get("/%2F%2F"+evilHost+"/v1/models", gwHost), 404},
		{"query string", get("/v1/models?url=http://"+evilHost, gwHost), 200},
		{"CONNECT", "CONNECT " + evilHost + " HTTP/1.1\r\nHost: " + evilHost + "\r\n" + auth + "\r\n", 404},
	}
	for _, c := range cases {
		if got := rawRequest(t, g.url, c.text); got != c.want {
			t.Errorf("%s: status %d, want %d", c.name, got, c.want)
		}
	}
	// A redirect from the upstream is passed back, never followed.
	if resp, _ := call(t, "POST", g.url+"/v1/embeddings", "Bearer "+key, `{"model":"m","input":"x"}`); resp.StatusCode != http.StatusTemporaryRedirect {
		t.Errorf("redirecting upstream: got %d", resp.StatusCode)
	}

	// Client headers that must never travel upstream.
	req, _ := http.NewRequest("POST", g.url+"/v1/chat/completions", strings.NewReader(smallChat))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Cookie", "session=operator-cookie")
	req.Header.Set("Proxy-Authorization", "Basic c2VjcmV0")
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "hop-by-hop")
	req.Header.Set("X-Forwarded-Host", evilHost)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	evilMu.Lock()
	defer evilMu.Unlock()
	if len(evilHits) > 0 {
		t.Fatalf("the evil host received %v", evilHits)
	}
	allowed := map[string]bool{"/v1/models": true, "/v1/chat/completions": true, "/v1/embeddings": true}
	upstreamHost := strings.TrimPrefix(p.srv.URL, "http://")
	for _, r := range p.recorded() {
		if !allowed[r.Path] || r.RawPath != "" || r.Host != upstreamHost {
			t.Errorf("the provider got %s %s (raw %q) for host %q", r.Method, r.Path, r.RawPath, r.Host)
		}
		if got := r.Header.Get("Authorization"); got != "Bearer secret-access-0" {
			t.Errorf("upstream Authorization is %q, want only the gateway's upstream key", got)
		}
		for _, h := range []string{"Cookie", "Proxy-Authorization", "X-Hop", "X-Forwarded-Host"} {
			if r.Header.Get(h) != "" {
				t.Errorf("client header %s reached the provider", h)
			}
		}
	}
}

func TestRequestBodyIsSizeLimited(t *testing.T) {
	p := newFakeProvider(t, "acct")
	g := startGateway(t, p.baseURL(), nil, func(c *Config) { c.APIKey = "secret-access-0"; c.MaxRequestBytes = 1024 })
	big := `{"model":"demo-worker","messages":[{"role":"user","content":"` + strings.Repeat("x", 2048) + `"}]}`
	resp, body := call(t, "POST", g.url+"/v1/chat/completions", "Bearer "+orgKey(t, "org-a"), big)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
	if _, code := openAIError(t, body); code != "request_too_large" {
		t.Fatalf("code %q", code)
	}
	if n := len(p.recorded()); n != 0 {
		t.Fatalf("an oversized request reached the provider (%d requests)", n)
	}
}

func TestRateLimitedOrgDoesNotSlowAnother(t *testing.T) {
	p := newFakeProvider(t, "acct")
	g := startGateway(t, p.baseURL(), nil, func(c *Config) { c.APIKey = "secret-access-0"; c.OrgRPS = 0.001; c.OrgBurst = 1 })
	a, b := "Bearer "+orgKey(t, "org-a"), "Bearer "+orgKey(t, "org-b")
	if resp, body := call(t, "POST", g.url+"/v1/chat/completions", a, smallChat); resp.StatusCode != 200 {
		t.Fatalf("org A's first request: %d %s", resp.StatusCode, body)
	}
	resp, body := call(t, "POST", g.url+"/v1/chat/completions", a, smallChat)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("org A over its rate: %d %s", resp.StatusCode, body)
	}
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
	}
	if typ, code := openAIError(t, body); typ != "rate_limit_error" || code != "rate_limit_exceeded" {
		t.Fatalf("error %s/%s", typ, code)
	}
	if resp, body := call(t, "POST", g.url+"/v1/chat/completions", b, smallChat); resp.StatusCode != 200 {
		t.Fatalf("org B while org A is limited: %d %s", resp.StatusCode, body)
	}
}

func TestBusyOrgDoesNotBlockAnother(t *testing.T) {
	p := newFakeProvider(t, "acct")
	held, release := make(chan struct{}), make(chan struct{})
	p.onStream = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		close(held)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}
	g := startGateway(t, p.baseURL(), nil, func(c *Config) { c.APIKey = "secret-access-0"; c.OrgConcurrency = 1 })
	a, b := "Bearer "+orgKey(t, "org-a"), "Bearer "+orgKey(t, "org-b")

	first := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("POST", g.url+"/v1/chat/completions", strings.NewReader(smallChat))
		req.Header.Set("Authorization", a)
		req.Header.Set("Accept", "text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			first <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	<-held
	resp, body := call(t, "POST", g.url+"/v1/chat/completions", a, smallChat)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("org A beyond its concurrency: %d %s", resp.StatusCode, body)
	}
	if _, code := openAIError(t, body); code != "concurrency_limit_exceeded" {
		t.Fatalf("code %q", code)
	}
	if resp, body := call(t, "POST", g.url+"/v1/chat/completions", b, smallChat); resp.StatusCode != 200 {
		t.Fatalf("org B while org A is at its cap: %d %s", resp.StatusCode, body)
	}
	close(release)
	if code := <-first; code != 200 {
		t.Fatalf("org A's held request: %d", code)
	}
}

func TestStreamingPassesChunksThroughAndCancelsOnDisconnect(t *testing.T) {
	p := newFakeProvider(t, "acct")
	firstRead, upstreamDone := make(chan struct{}), make(chan error, 1)
	p.onStream = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"chunk\":1}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-firstRead:
			io.WriteString(w, "data: {\"chunk\":2}\n\ndata: [DONE]\n\n")
			upstreamDone <- nil
		case <-r.Context().Done():
			upstreamDone <- r.Context().Err()
		}
	}
	g := startGateway(t, p.baseURL(), nil, func(c *Config) { c.APIKey = "secret-access-0" })
	stream := func(ctx context.Context) (*http.Response, *bufio.Reader) {
		req, _ := http.NewRequestWithContext(ctx, "POST", g.url+"/v1/chat/completions",
			strings.NewReader(`{"model":"demo-worker","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+orgKey(t, "org-a"))
		req.Header.Set("Accept", "text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("stream answer %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		return resp, bufio.NewReader(resp.Body)
	}

	// The provider does not finish until the test has read the first chunk, so reading
	// it proves it was flushed through on its own.
	resp, rd := stream(context.Background())
	if line, err := rd.ReadString('\n'); err != nil || line != "data: {\"chunk\":1}\n" {
		t.Fatalf("first chunk: %q %v", line, err)
	}
	close(firstRead)
	rest, err := io.ReadAll(rd)
	resp.Body.Close()
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || !strings.Contains(string(rest), `"chunk":2`) {
		t.Fatalf("rest of the stream: %q %v", rest, err)
	}
	if err := <-upstreamDone; err != nil {
		t.Fatalf("the first stream's upstream request ended with %v", err)
	}

	// A client that goes away mid-stream cancels the upstream request.
	firstRead = make(chan struct{}) // never closed: the provider holds until cancelled
	ctx, cancel := context.WithCancel(context.Background())
	resp, rd = stream(ctx)
	if line, err := rd.ReadString('\n'); err != nil || !strings.Contains(line, `"chunk":1`) {
		t.Fatalf("first chunk: %q %v", line, err)
	}
	cancel()
	resp.Body.Close()
	select {
	case err := <-upstreamDone:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("upstream request ended with %v, want its context cancelled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the provider's request was not cancelled after the client disconnected")
	}
}

func TestMissingUpstreamOrKeysIsAStartupError(t *testing.T) {
	ops, _ := newOps()
	base := Config{UpstreamURL: "http://127.0.0.1:1/v1", Secret: "s", OrgRPS: 1, OrgBurst: 1, OrgConcurrency: 1, MaxRequestBytes: 1, Ops: ops}
	for name, edit := range map[string]func(*Config){
		"relative upstream":  func(c *Config) { c.UpstreamURL = "/v1" },
		"upstream with user": func(c *Config) { c.UpstreamURL = "http://u:p@127.0.0.1/v1" },
		"no keys at all":     func(c *Config) { c.Secret = "" },
		"zero concurrency":   func(c *Config) { c.OrgConcurrency = 0 },
	} {
		c := base
		edit(&c)
		if _, err := New(c); err == nil {
			t.Errorf("%s: want an error", name)
		} else if strings.Contains(err.Error(), ":p@") {
			t.Errorf("%s: error shows the upstream's password: %v", name, err)
		}
	}
}

func TestUpstreamDownIs502(t *testing.T) {
	g := startGateway(t, "http://127.0.0.1:1/v1", nil, nil)
	resp, body := call(t, "GET", g.url+"/v1/models", "Bearer "+orgKey(t, "org-a"), "")
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if _, code := openAIError(t, body); code != "upstream_unreachable" {
		t.Fatalf("code %q", code)
	}
}

// orgMAC is the MAC part of a gateway key of org under secret.
func orgMAC(secret, org string) string {
	return base64.RawURLEncoding.EncodeToString(orgid.MAC(secret, keyPurpose, org))
}
