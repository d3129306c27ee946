package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"hermeshost/atomicfile"
	"hermeshost/service"
)

// fakeClock is a clock the test moves by hand, so expiry is decided by the test.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// writeAuth writes an auth.json whose access token is the provider's current one and
// expires a minute after the clock's now.
func writeAuth(t *testing.T, path string, p *fakeProvider, clock *fakeClock) []byte {
	t.Helper()
	access, refresh, _ := p.state()
	c := Credentials{Version: 1, Identity: p.identity, AccessToken: access, RefreshToken: refresh,
		ExpiresAt: clock.Now().Add(time.Minute), UpdatedAt: clock.Now()}
	if err := writeCredentials(path, c); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type loginRig struct {
	login *Login
	ops   *service.Ops
	logs  *lockedBuffer
	g     *harness
}

// startLoginGateway opens the login at path and serves a gateway with it in front of p.
func startLoginGateway(t *testing.T, path string, p *fakeProvider, clock *fakeClock, wrap func(http.Handler) http.Handler) *loginRig {
	t.Helper()
	ops, logs := newOps()
	l, err := OpenLogin(LoginOptions{
		Path: path, OAuth: OAuthConfig{TokenURL: p.tokenURL(), ClientID: "hermes-test"},
		Log: ops.Log, Health: ops.Health, Registry: ops.Registry, Now: clock.Now,
		RetryMin: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	g := serveGateway(t, Config{
		UpstreamURL: p.baseURL(), Login: l, Secret: testSecret, HostKey: testHostKey,
		OrgRPS: 1000, OrgBurst: 1000, OrgConcurrency: 100, MaxRequestBytes: 1 << 20, Ops: ops,
	}, wrap)
	return &loginRig{login: l, ops: ops, logs: logs, g: g}
}

func health(t *testing.T, g *harness) (int, service.Report) {
	t.Helper()
	resp, body := call(t, "GET", g.url+"/healthz", "", "")
	var rep service.Report
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatalf("healthz %s: %v", body, err)
	}
	return resp.StatusCode, rep
}

func onDisk(t *testing.T, path string) Credentials {
	t.Helper()
	c, err := loadCredentials(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// noTokensLogged fails if any token of the fake provider's reached a log line.
func noTokensLogged(t *testing.T, logs *lockedBuffer) {
	t.Helper()
	if s := logs.String(); strings.Contains(s, "secret-access") || strings.Contains(s, "secret-refresh") {
		t.Fatalf("a token reached the logs:\n%s", s)
	}
}

func TestConcurrentRequestsAtExpiryShareOneRefresh(t *testing.T) {
	p := newFakeProvider(t, "acct-1")
	clock := newFakeClock()
	path := filepath.Join(t.TempDir(), "auth.json")
	writeAuth(t, path, p, clock)

	const n = 50
	var arrived atomic.Int32
	allArrived := make(chan struct{})
	count := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if arrived.Add(1) == n {
				close(allArrived)
			}
			next.ServeHTTP(w, r)
		})
	}
	// The token endpoint answers only once all requests are in, so they all meet the
	// expired token together.
	p.onRefresh = func() { <-allArrived }
	rig := startLoginGateway(t, path, p, clock, count)
	clock.Advance(2 * time.Minute)

	key := "Bearer " + orgKey(t, "org-a")
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", rig.g.url+"/v1/chat/completions", strings.NewReader(smallChat))
			req.Header.Set("Authorization", key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Fatalf("a request got %d", c)
		}
	}
	if _, _, refreshes := p.state(); refreshes != 1 {
		t.Fatalf("%d refreshes reached the token endpoint, want 1", refreshes)
	}
	if got := testutil.ToFloat64(rig.login.metrics.refreshes.WithLabelValues("ok")); got != 1 {
		t.Fatalf("gateway_token_refreshes_total{ok} = %v", got)
	}
	chats := 0
	for _, r := range p.recorded() {
		if r.Path == "/v1/chat/completions" {
			chats++
			if r.Header.Get("Authorization") != "Bearer secret-access-1" {
				t.Fatalf("a chat went upstream with %q", r.Header.Get("Authorization"))
			}
		}
	}
	if chats != n {
		t.Fatalf("%d chats reached the provider, want %d", chats, n)
	}
	if c := onDisk(t, path); c.RefreshToken != "secret-refresh-1" {
		t.Fatalf("auth.json holds %q", c.RefreshToken)
	}
	noTokensLogged(t, rig.logs)
}

func TestRotatedRefreshTokenSurvivesACrashBeforeUse(t *testing.T) {
	p := newFakeProvider(t, "acct-1")
	clock := newFakeClock()
	path := filepath.Join(t.TempDir(), "auth.json")
	original := writeAuth(t, path, p, clock)

	// At the first use of the new access token, auth.json must already hold the rotated
	// refresh token: a crash at that moment loses nothing.
	var atFirstUse string
	var once sync.Once
	p.onModel = func(*http.Request) {
		once.Do(func() {
			if c, err := loadCredentials(path); err == nil {
				atFirstUse = c.RefreshToken
			}
		})
	}
	first := startLoginGateway(t, path, p, clock, nil)
	clock.Advance(2 * time.Minute)
	if resp, body := call(t, "POST", first.g.url+"/v1/chat/completions", "Bearer "+orgKey(t, "org-a"), smallChat); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if atFirstUse != "secret-refresh-1" {
		t.Fatalf("when the new access token was first used auth.json held %q", atFirstUse)
	}
	receipts, err := atomicfile.Receipts(path)
	if err != nil || len(receipts) != 1 {
		t.Fatalf("receipts %v %v", receipts, err)
	}
	if kept, _ := os.ReadFile(receipts[0].Path); !bytes.Equal(kept, original) {
		t.Fatal("the receipt is not the previous auth.json")
	}

	// The restarted gateway is a new instance loading the same file, long after; the
	// provider has invalidated secret-refresh-0, so only the rotated token can refresh.
	clock.Advance(3 * time.Hour)
	second := startLoginGateway(t, path, p, clock, nil)
	if resp, body := call(t, "POST", second.g.url+"/v1/chat/completions", "Bearer "+orgKey(t, "org-a"), smallChat); resp.StatusCode != 200 {
		t.Fatalf("after the restart: %d %s", resp.StatusCode, body)
	}
	access, refresh, refreshes := p.state()
	if refreshes != 2 || refresh != "secret-refresh-2" || onDisk(t, path).AccessToken != access {
		t.Fatalf("refreshes %d, provider's refresh token %q, on disk %+v", refreshes, refresh, onDisk(t, path))
	}
}

// tinyDisk mounts a 64 KiB tmpfs, so a test can fill it.
func tinyDisk(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs to fill (needs root and mount(8)): %v: %s", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a file at path until the disk is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	block := bytes.Repeat([]byte{'x'}, 1024)
	for {
		if _, err := f.Write(block); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the disk: %v", err)
			}
			return
		}
	}
}

func TestFullDiskDuringRotationKeepsServingAndAlarmsUntilWritten(t *testing.T) {
	dir := tinyDisk(t)
	p := newFakeProvider(t, "acct-1")
	clock := newFakeClock()
	path := filepath.Join(dir, "auth.json")
	original := writeAuth(t, path, p, clock)
	filler := filepath.Join(dir, "filler")
	fill(t, filler)

	rig := startLoginGateway(t, path, p, clock, nil)
	clock.Advance(2 * time.Minute)
	key := "Bearer " + orgKey(t, "org-a")
	for i := range 3 {
		if resp, body := call(t, "POST", rig.g.url+"/v1/chat/completions", key, smallChat); resp.StatusCode != 200 {
			t.Fatalf("request %d on a full disk: %d %s", i, resp.StatusCode, body)
		}
	}
	if _, _, refreshes := p.state(); refreshes != 1 {
		t.Fatalf("%d refreshes; the in-memory token should have served every request", refreshes)
	}
	if now, _ := os.ReadFile(path); !bytes.Equal(now, original) {
		t.Fatalf("auth.json changed on a full disk:\n%s", now)
	}
	code, rep := health(t, rig.g)
	if code != http.StatusServiceUnavailable || !strings.Contains(rep.Reasons[alarmPersist], "disk full") {
		t.Fatalf("healthz %d %+v", code, rep)
	}
	if got := testutil.ToFloat64(rig.login.metrics.persistPending); got != 1 {
		t.Fatalf("gateway_auth_persist_pending = %v", got)
	}
	if got := testutil.ToFloat64(rig.login.metrics.persistFailed); got < 1 {
		t.Fatalf("gateway_auth_persist_failures_total = %v", got)
	}
	if !strings.Contains(rig.logs.String(), "could not write the rotated login") {
		t.Fatal("no log line for the failed write")
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rig.login.Synced():
	case <-time.After(30 * time.Second):
		t.Fatal("the rotated login was not written after space was freed")
	}
	if c := onDisk(t, path); c.RefreshToken != "secret-refresh-1" || c.AccessToken != "secret-access-1" {
		t.Fatalf("auth.json after the retry: %+v", c)
	}
	if code, rep := health(t, rig.g); code != 200 {
		t.Fatalf("healthz after the write: %d %+v", code, rep)
	}
	if got := testutil.ToFloat64(rig.login.metrics.persistPending); got != 0 {
		t.Fatalf("gateway_auth_persist_pending = %v after the write", got)
	}
	noTokensLogged(t, rig.logs)
}

func TestCorruptAuthFileIsALoudErrorAndLeftAlone(t *testing.T) {
	valid, err := json.Marshal(Credentials{Version: 1, Identity: "acct-1", AccessToken: "secret-access-0", RefreshToken: "secret-refresh-0"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		content []byte
		kind    error
	}{
		{"empty", nil, atomicfile.ErrEmpty},
		{"whitespace", []byte("  \n"), atomicfile.ErrEmpty},
		{"truncated", valid[:len(valid)/2], atomicfile.ErrTruncated},
		{"garbage", []byte("\x7fELF garbage"), atomicfile.ErrSyntax},
		{"no refresh token", []byte(`{"version":1,"identity":"acct-1"}`), ErrInvalidCredentials},
		{"not a login", []byte(`{}`), ErrInvalidCredentials},
	}
	p := newFakeProvider(t, "acct-1")
	for _, c := range cases {
		path := filepath.Join(t.TempDir(), "auth.json")
		if err := os.WriteFile(path, c.content, 0o600); err != nil {
			t.Fatal(err)
		}
		ops, _ := newOps()
		_, err := OpenLogin(LoginOptions{Path: path, OAuth: OAuthConfig{TokenURL: p.tokenURL()},
			Log: ops.Log, Health: ops.Health, Registry: ops.Registry})
		if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: want an error naming %s and matching %v, got %v", c.name, path, c.kind, err)
		}
		if now, _ := os.ReadFile(path); !bytes.Equal(now, c.content) {
			t.Errorf("%s: auth.json changed", c.name)
		}
		if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
			t.Errorf("%s: something was written beside auth.json: %v", c.name, entries)
		}
	}
	ops, _ := newOps()
	if _, err := OpenLogin(LoginOptions{Path: filepath.Join(t.TempDir(), "auth.json"), OAuth: OAuthConfig{TokenURL: p.tokenURL()},
		Log: ops.Log, Health: ops.Health, Registry: ops.Registry}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing auth.json: %v", err)
	}
	if n := len(p.recorded()); n != 0 {
		t.Fatalf("the provider got %d requests; nothing may be minted", n)
	}
}

func TestAuthFileGoingBadLaterShowsOnHealth(t *testing.T) {
	p := newFakeProvider(t, "acct-1")
	clock := newFakeClock()
	path := filepath.Join(t.TempDir(), "auth.json")
	good := writeAuth(t, path, p, clock)
	rig := startLoginGateway(t, path, p, clock, nil)
	if code, _ := health(t, rig.g); code != 200 {
		t.Fatalf("healthz with a good file: %d", code)
	}
	if err := os.WriteFile(path, good[:10], 0o600); err != nil {
		t.Fatal(err)
	}
	code, rep := health(t, rig.g)
	if code != http.StatusServiceUnavailable || !strings.Contains(rep.Reasons["auth_file"], "truncated") {
		t.Fatalf("healthz with a truncated file: %d %+v", code, rep)
	}
	other := Credentials{Version: 1, Identity: "acct-2", RefreshToken: "x"}
	if err := writeCredentials(path, other); err != nil {
		t.Fatal(err)
	}
	if code, rep := health(t, rig.g); code != 503 || !strings.Contains(rep.Reasons["auth_file"], `"acct-2"`) {
		t.Fatalf("healthz with another identity's file: %d %+v", code, rep)
	}
}

func TestUpstream401RefreshesOnceAndRetriesOnce(t *testing.T) {
	p := newFakeProvider(t, "acct-1")
	clock := newFakeClock()
	path := filepath.Join(t.TempDir(), "auth.json")
	writeAuth(t, path, p, clock)
	rig := startLoginGateway(t, path, p, clock, nil)
	key := "Bearer " + orgKey(t, "org-a")

	// The provider revokes the (unexpired) access token early: one refresh, one retry.
	p.mu.Lock()
	p.reject401 = 1
	p.mu.Unlock()
	if resp, body := call(t, "POST", rig.g.url+"/v1/chat/completions", key, smallChat); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if _, _, refreshes := p.state(); refreshes != 1 {
		t.Fatalf("refreshes %d", refreshes)
	}

	// A provider that refuses every token: still only one refresh and one retry, then
	// the client learns that the gateway's upstream credential was refused (not its key).
	before := len(p.recorded())
	p.mu.Lock()
	p.reject401 = 1000
	p.mu.Unlock()
	resp, body := call(t, "POST", rig.g.url+"/v1/chat/completions", key, smallChat)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if _, code := openAIError(t, body); code != "upstream_unauthorized" {
		t.Fatalf("code %q", code)
	}
	var paths []string
	for _, r := range p.recorded()[before:] {
		paths = append(paths, r.Path)
	}
	if strings.Join(paths, " ") != "/v1/chat/completions /oauth/token /v1/chat/completions" {
		t.Fatalf("the provider saw %v, want one request, one refresh, one retry", paths)
	}
}

func TestRefreshForAnotherIdentityIsRefused(t *testing.T) {
	p := newFakeProvider(t, "acct-1")
	clock := newFakeClock()
	path := filepath.Join(t.TempDir(), "auth.json")
	original := writeAuth(t, path, p, clock)
	rig := startLoginGateway(t, path, p, clock, nil)
	p.answerAs = "acct-intruder"
	clock.Advance(2 * time.Minute)

	resp, body := call(t, "POST", rig.g.url+"/v1/chat/completions", "Bearer "+orgKey(t, "org-a"), smallChat)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if _, code := openAIError(t, body); code != "upstream_login_failed" {
		t.Fatalf("code %q", code)
	}
	if now, _ := os.ReadFile(path); !bytes.Equal(now, original) {
		t.Fatal("auth.json was overwritten with another identity's login")
	}
	code, rep := health(t, rig.g)
	if code != 503 || !strings.Contains(rep.Reasons[alarmLogin], "another identity") {
		t.Fatalf("healthz %d %+v", code, rep)
	}
	if got := testutil.ToFloat64(rig.login.metrics.refreshes.WithLabelValues("identity_mismatch")); got != 1 {
		t.Fatalf("identity_mismatch refreshes = %v", got)
	}
	if !strings.Contains(rig.logs.String(), `"answered_for":"acct-intruder"`) {
		t.Fatalf("the refusal is not logged loudly:\n%s", rig.logs.String())
	}
}

func TestDeviceLoginAndSaveLoginRefusesAnotherIdentity(t *testing.T) {
	p := newFakeProvider(t, "acct-1")
	cfg := OAuthConfig{TokenURL: p.tokenURL(), DeviceURL: p.srv.URL + "/oauth/device", ClientID: "hermes-test", Scope: "openid offline_access"}
	var shown DeviceCode
	creds, err := cfg.DeviceLogin(context.Background(), func(dc DeviceCode) { shown = dc })
	if err != nil {
		t.Fatal(err)
	}
	if shown.UserCode != "ABCD-EFGH" || creds.Identity != "acct-1" || creds.RefreshToken != "secret-refresh-1" || creds.AccessToken != "secret-access-1" {
		t.Fatalf("shown %+v, login %+v", shown, creds)
	}
	path := filepath.Join(t.TempDir(), "auth.json")
	if err := SaveLogin(path, creds, false); err != nil {
		t.Fatal(err)
	}
	saved, _ := os.ReadFile(path)

	intruder := creds
	intruder.Identity = "acct-2"
	if err := SaveLogin(path, intruder, false); !errors.Is(err, ErrIdentityMismatch) {
		t.Fatalf("another identity without --replace: %v", err)
	}
	if now, _ := os.ReadFile(path); !bytes.Equal(now, saved) {
		t.Fatal("the refused login changed auth.json")
	}
	if err := SaveLogin(path, intruder, true); err != nil {
		t.Fatalf("with replace: %v", err)
	}
	if onDisk(t, path).Identity != "acct-2" {
		t.Fatal("replace did not write")
	}
	if r, err := atomicfile.Receipts(path); err != nil || len(r) != 1 {
		t.Fatalf("the replaced login is not kept as a receipt: %v %v", r, err)
	}

	corrupt := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(corrupt, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := SaveLogin(corrupt, creds, false); err == nil || !strings.Contains(err.Error(), "--replace") {
		t.Fatalf("over a corrupt file: %v", err)
	}

	again, err := cfg.ExchangeRefreshToken(context.Background(), " secret-refresh-1\n")
	if err != nil || again.Identity != "acct-1" || again.RefreshToken != "secret-refresh-2" {
		t.Fatalf("refresh-token login: %+v %v", again, err)
	}
	if _, err := cfg.ExchangeRefreshToken(context.Background(), "secret-refresh-1"); !IsInvalidGrant(err) {
		t.Fatalf("a spent refresh token: %v", err)
	}
}

func TestRefusedRefreshTokenRaisesTheLoginAlarm(t *testing.T) {
	p := newFakeProvider(t, "acct-1")
	clock := newFakeClock()
	path := filepath.Join(t.TempDir(), "auth.json")
	original := writeAuth(t, path, p, clock)
	rig := startLoginGateway(t, path, p, clock, nil)
	p.mu.Lock()
	p.refresh = "revoked-by-the-provider"
	p.mu.Unlock()
	clock.Advance(2 * time.Minute)
	resp, body := call(t, "POST", rig.g.url+"/v1/chat/completions", "Bearer "+orgKey(t, "org-a"), smallChat)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	code, rep := health(t, rig.g)
	if code != 503 || !strings.Contains(rep.Reasons[alarmLogin], "gateway login") {
		t.Fatalf("healthz %d %+v", code, rep)
	}
	if now, _ := os.ReadFile(path); !bytes.Equal(now, original) {
		t.Fatal("a refused refresh changed auth.json")
	}
	if got := testutil.ToFloat64(rig.login.metrics.refreshes.WithLabelValues("failed")); got != 1 {
		t.Fatalf("failed refreshes = %v", got)
	}
}
