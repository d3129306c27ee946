package web_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"hermeshost/internal/testio"

	"github.com/gavv/httpexpect/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
	"golang.org/x/crypto/bcrypt"

	"hermeshost/operator"
	"hermeshost/pg/pgtest"
	"hermeshost/service"
	"hermeshost/static"
	"hermeshost/web"
)

// scs.New starts a cleanup goroutine for its default in-memory store, which the launcher
// replaces with Postgres at once; the goroutine has no safe stop (its StopCleanup races it).
func TestMain(m *testing.M) {
	pgtest.Main(m, goleak.IgnoreTopFunction("github.com/alexedwards/scs/v2/memstore.(*MemStore).startCleanup"))
}

const password = "a long enough passphrase"

type fixture struct {
	t    *testing.T
	pool *pgxpool.Pool
	ops  *operator.Store
	srv  *httptest.Server
}

// newFixture is the launcher over a fresh schema with operators ada (acme, globex) and bob
// (no grants), and jobs mirrored for acme, globex and initech.
func newFixture(t *testing.T, refreshSeconds int) *fixture {
	t.Helper()
	f := newLauncherFixture(t, func(c *web.LauncherConfig) { c.RefreshSeconds = refreshSeconds })
	f.job("acme", "j1", "RUNNING")
	f.job("acme", "j2", "COMPLETED")
	f.job("acme", "j3", "FAILED")
	f.job("globex", "j4", "COMPLETED")
	f.job("initech", "j5", "RUNNING")
	return f
}

// newLauncherFixture is the launcher over a fresh schema with operators ada (acme, globex)
// and bob (no grants), its configuration changed by edit (nil: as it is).
func newLauncherFixture(t *testing.T, edit func(*web.LauncherConfig)) *fixture {
	t.Helper()
	_, pool := pgtest.Schema(t)
	ops, err := operator.New(pool, bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range []string{"ada", "bob"} {
		if err := ops.Add(ctx, n, password, "test"); err != nil {
			t.Fatal(err)
		}
	}
	for _, org := range []string{"acme", "globex"} {
		if err := ops.Grant(ctx, "ada", org, "test"); err != nil {
			t.Fatal(err)
		}
	}
	cfg := web.LauncherConfig{DB: pool, Operators: ops}
	if edit != nil {
		edit(&cfg)
	}
	l, err := web.NewLauncher(service.NewOps(slog.New(slog.DiscardHandler)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	srv := httptest.NewServer(l.Handler())
	t.Cleanup(srv.Close)
	return &fixture{t: t, pool: pool, ops: ops, srv: srv}
}

func (f *fixture) job(org, id, status string) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), `INSERT INTO mirror_jobs (job_id, org, type, status, attempt) VALUES ($1, $2, 'product_ingest', $3, 1)`, id, org, status); err != nil {
		f.t.Fatal(err)
	}
}

// browser is an httpexpect client that keeps cookies and does not follow redirects.
func (f *fixture) browser() *httpexpect.Expect {
	jar, _ := cookiejar.New(nil)
	return httpexpect.WithConfig(httpexpect.Config{
		BaseURL:  f.srv.URL,
		Reporter: httpexpect.NewAssertReporter(f.t),
		Client: &http.Client{
			Jar:           jar,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			Transport:     testio.ReadWhole{Next: f.srv.Client().Transport},
		},
	})
}

func login(e *httpexpect.Expect, name, pw string) *httpexpect.Response {
	return e.POST("/login").WithFormField("name", name).WithFormField("password", pw).WithFormField("next", "/").Expect()
}

func (f *fixture) sessions() int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM sessions`).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func TestTheIndexNeedsALoginAndShowsOnlyGrantedOrgs(t *testing.T) {
	f := newFixture(t, 5)
	e := f.browser()
	e.GET("/").Expect().Status(http.StatusSeeOther).Header("Location").IsEqual("/login?next=%2F")
	e.GET("/orgs").WithHeader("HX-Request", "true").Expect().Status(http.StatusUnauthorized).Header("HX-Redirect").IsEqual("/login")
	e.GET("/login").Expect().Status(http.StatusOK).Body().Contains(`data-testid="login-form"`)

	r := login(e, "ada", password)
	r.Status(http.StatusSeeOther).Header("Location").IsEqual("/")
	c := r.Cookie("hermes_launcher")
	c.Value().NotEmpty()
	if raw := r.Raw().Header.Get("Set-Cookie"); !strings.Contains(raw, "HttpOnly") || !strings.Contains(raw, "SameSite=Lax") {
		t.Fatalf("session cookie: %s", raw)
	}
	page := e.GET("/").Expect().Status(http.StatusOK)
	page.Header("Content-Security-Policy").Contains("script-src 'self'")
	page.Header("Cache-Control").IsEqual("no-store")
	body := page.Body()
	body.Contains(`data-testid="operator">ada<`)
	body.Contains(`data-testid="org-acme"`).Contains(`data-testid="org-globex"`).NotContains("initech")
	body.Contains(`hx-get="/orgs"`).Contains(`hx-trigger="every 5s"`).Contains(`src="/static/vendor/htmx.min.js"`)
	body.Contains(`1 more on this host, not granted to you.`)
	// Each org's name opens its dashboard, under the prefix the launcher proxies.
	body.Contains(`<a href="/orgs/acme/" data-testid="open-acme">acme</a>`).Contains(`href="/orgs/globex/"`)
	frag := e.GET("/orgs").WithHeader("HX-Request", "true").Expect().Status(http.StatusOK).Body()
	frag.NotContains("<html").Contains(`id="orgs"`)
	// acme: one running, one completed, one failed.
	for _, want := range []string{`data-testid="running">1<`, `data-testid="completed">1<`, `data-testid="failed" class="bad">1<`} {
		frag.Contains(want)
	}

	// bob has no grants: nothing but the count.
	e2 := f.browser()
	login(e2, "bob", password).Status(http.StatusSeeOther)
	e2.GET("/").Expect().Status(http.StatusOK).Body().Contains(`data-testid="no-orgs"`).
		NotContains("acme").NotContains("initech").Contains("3 more on this host")
}

func TestAWrongLoginIsRefusedAlikeAndLeavesNoSession(t *testing.T) {
	f := newFixture(t, 5)
	e := f.browser()
	for _, c := range [][2]string{{"ada", "wrong password here"}, {"nobody", password}, {"", ""}, {"ada", strings.Repeat("x", 5000)}} {
		login(e, c[0], c[1]).Status(http.StatusUnauthorized).Body().Contains("Wrong name or password.")
	}
	if n := f.sessions(); n != 0 {
		t.Fatalf("%d sessions after refused logins", n)
	}
	if err := f.ops.SetDisabled(context.Background(), "bob", true, "test"); err != nil {
		t.Fatal(err)
	}
	login(e, "bob", password).Status(http.StatusUnauthorized)
	// Ten failures for a name throttle it, the right password included, with Retry-After.
	for range operator.MaxLoginFailures {
		login(e, "carol", "not carol's password").Status(http.StatusUnauthorized)
	}
	r := login(e, "carol", "a long enough passphrase")
	r.Status(http.StatusTooManyRequests).Body().Contains("Too many failed logins for this name")
	r.Header("Retry-After").NotEmpty()
	// A huge form is refused without a login attempt.
	e.POST("/login").WithFormField("name", strings.Repeat("a", 20000)).WithFormField("password", "x").Expect().Status(http.StatusBadRequest)
	e.GET("/").Expect().Status(http.StatusSeeOther)
}

func TestLoginRenewsTheSessionTokenAndLogoutEndsIt(t *testing.T) {
	f := newFixture(t, 5)
	e := f.browser()
	// A token planted before the login (session fixation) is not the one that logs in.
	u, _ := url.Parse(f.srv.URL)
	planted := &http.Cookie{Name: "hermes_launcher", Value: "planted-by-an-attacker", Path: "/"}
	jar, _ := cookiejar.New(nil)
	jar.SetCookies(u, []*http.Cookie{planted})
	client := &http.Client{Jar: jar, Transport: f.srv.Client().Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.PostForm(f.srv.URL+"/login", url.Values{"name": {"ada"}, "password": {password}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var token string
	for _, c := range jar.Cookies(u) {
		if c.Name == "hermes_launcher" {
			token = c.Value
		}
	}
	if resp.StatusCode != http.StatusSeeOther || token == "" || token == planted.Value {
		t.Fatalf("login with a planted token: %d, token %q", resp.StatusCode, token)
	}

	r := login(e, "ada", password)
	stolen := r.Cookie("hermes_launcher").Value().Raw()
	e.POST("/logout").Expect().Status(http.StatusSeeOther).Header("Location").IsEqual("/login")
	// The session is gone from the database: the old cookie no longer opens anything.
	thief := f.browser().Builder(func(r *httpexpect.Request) { r.WithCookie("hermes_launcher", stolen) })
	thief.GET("/").Expect().Status(http.StatusSeeOther)
	if n := f.sessions(); n != 1 {
		t.Fatalf("%d sessions left, want only the first login's", n)
	}
}

func TestRevokingOrDisablingTakesEffectOnTheNextRequest(t *testing.T) {
	f := newFixture(t, 5)
	ctx := context.Background()
	e := f.browser()
	login(e, "ada", password).Status(http.StatusSeeOther)
	e.GET("/orgs").Expect().Status(http.StatusOK).Body().Contains(`data-testid="org-globex"`)
	if err := f.ops.Revoke(ctx, "ada", "globex", "test"); err != nil {
		t.Fatal(err)
	}
	e.GET("/orgs").Expect().Status(http.StatusOK).Body().NotContains(`data-testid="org-globex"`).Contains(`data-testid="org-acme"`)
	if err := f.ops.SetDisabled(ctx, "ada", true, "test"); err != nil {
		t.Fatal(err)
	}
	e.GET("/").Expect().Status(http.StatusSeeOther).Header("Location").HasPrefix("/login")
	if n := f.sessions(); n != 0 {
		t.Fatalf("a disabled operator's session is still stored (%d)", n)
	}
	// Enabled again, the old session does not come back: a new login is needed.
	if err := f.ops.SetDisabled(ctx, "ada", false, "test"); err != nil {
		t.Fatal(err)
	}
	e.GET("/").Expect().Status(http.StatusSeeOther)
}

func TestCrossOriginPostsAndOpenRedirectsAreRefused(t *testing.T) {
	f := newFixture(t, 5)
	e := f.browser()
	// A form on another site posting to the launcher, as a browser would send it.
	e.POST("/login").WithHeader("Sec-Fetch-Site", "cross-site").WithHeader("Origin", "https://evil.example").
		WithFormField("name", "ada").WithFormField("password", password).Expect().Status(http.StatusForbidden)
	e.POST("/login").WithHeader("Origin", "https://evil.example").
		WithFormField("name", "ada").WithFormField("password", password).Expect().Status(http.StatusForbidden)
	if n := f.sessions(); n != 0 {
		t.Fatalf("a cross-origin login made a session")
	}
	for _, next := range []string{"//evil.example/", "https://evil.example/", "/\\evil.example", "javascript:alert(1)", "/\nx"} {
		e.POST("/login").WithFormField("name", "ada").WithFormField("password", password).WithFormField("next", next).
			Expect().Status(http.StatusSeeOther).Header("Location").IsEqual("/")
	}
	e.POST("/login").WithFormField("name", "ada").WithFormField("password", password).WithFormField("next", "/orgs").
		Expect().Status(http.StatusSeeOther).Header("Location").IsEqual("/orgs")
	// The login page is never framed elsewhere.
	e.GET("/login").Expect().Header("Content-Security-Policy").Contains("frame-ancestors 'none'")
}

func TestStaticFilesAndOps(t *testing.T) {
	f := newFixture(t, 5)
	e := f.browser()
	if !static.HasHTMX() {
		t.Fatal("htmx was not copied in: run make build (it runs npm ci)")
	}
	e.GET("/static/vendor/htmx.min.js").Expect().Status(http.StatusOK).Body().Contains("htmx")
	e.GET("/static/app.css").Expect().Status(http.StatusOK).Header("Content-Type").HasPrefix("text/css")
	e.GET("/static/static.go").Expect().Status(http.StatusNotFound)
	e.GET("/static/../go.mod").Expect().Status(http.StatusNotFound)
	e.GET("/healthz").Expect().Status(http.StatusOK)
	e.GET("/metrics").Expect().Status(http.StatusOK).Body().Contains("http_requests_total")
}

// A login session unused for the idle timeout ends; its use is written at most once a
// minute, not on every request.
func TestAnIdleLoginSessionEndsAndUseIsWrittenSparingly(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	f := newLauncherFixture(t, func(c *web.LauncherConfig) { c.IdleTimeout, c.Now = time.Hour, clock })
	pool, ctx := f.pool, context.Background()
	e := f.browser()
	login(e, "ada", password).Status(http.StatusSeeOther)
	stored := func() string {
		var data []byte
		if err := pool.QueryRow(ctx, `SELECT data FROM sessions`).Scan(&data); err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	e.GET("/").Expect().Status(http.StatusOK)
	first := stored()
	for range 5 {
		advance(10 * time.Second)
		e.GET("/orgs").Expect().Status(http.StatusOK)
	}
	if stored() != first {
		t.Fatal("the login session was written again within a minute of its last use")
	}
	advance(59 * time.Minute)
	e.GET("/").Expect().Status(http.StatusOK) // in use within the hour: kept, and its use written
	if stored() == first {
		t.Fatal("the login session's use was not recorded after a minute")
	}
	advance(61 * time.Minute)
	e.GET("/").Expect().Status(http.StatusSeeOther).Header("Location").HasPrefix("/login")
	if n := f.sessions(); n != 0 {
		t.Fatalf("%d login sessions after the idle timeout, want it ended", n)
	}
}

// Over HTTPS (a Secure cookie) the launcher tells browsers to keep to HTTPS; on a local
// plain-HTTP run it does not, which would lock a browser out of it.
func TestTheLauncherSendsHSTSOnlyWithASecureCookie(t *testing.T) {
	secure := newLauncherFixture(t, func(c *web.LauncherConfig) { c.SecureCookie = true })
	secure.browser().GET("/login").Expect().Status(http.StatusOK).Header("Strict-Transport-Security").IsEqual("max-age=31536000")
	plain := newLauncherFixture(t, nil)
	plain.browser().GET("/login").Expect().Status(http.StatusOK).Header("Strict-Transport-Security").IsEmpty()
}

// browserFrom is f.browser whose connections come from the loopback address ip.
func (f *fixture) browserFrom(ip string) *httpexpect.Expect {
	jar, _ := cookiejar.New(nil)
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return httpexpect.WithConfig(httpexpect.Config{
		BaseURL:  f.srv.URL,
		Reporter: httpexpect.NewAssertReporter(f.t),
		Client: &http.Client{
			Jar:           jar,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			Transport:     testio.ReadWhole{Next: &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}},
		},
	})
}

// 40 wrong logins for ada at once from one address: at most the limit get a password check
// (401), the rest 429 unchecked; ada logs in from another address meanwhile, and a new
// password for her ends that login session on its next request.
func TestLoginsUnderAttackNeitherPassTheLimitNorLockTheOperatorOut(t *testing.T) {
	f := newLauncherFixture(t, nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for range 40 {
		wg.Go(func() {
			code := login(f.browserFrom("127.0.0.1"), "ada", "not ada's password at all").Raw().StatusCode
			mu.Lock()
			codes[code]++
			mu.Unlock()
		})
	}
	ada := f.browserFrom("127.0.0.2")
	login(ada, "ada", password).Status(http.StatusSeeOther)
	wg.Wait()
	if codes[http.StatusUnauthorized] > operator.MaxLoginFailures || codes[http.StatusUnauthorized]+codes[http.StatusTooManyRequests] != 40 {
		t.Fatalf("answers to the 40 tries: %v; want at most %d checked (401), the rest 429", codes, operator.MaxLoginFailures)
	}
	ada.GET("/").Expect().Status(http.StatusOK)
	if err := f.ops.SetPassword(context.Background(), "ada", "a brand new long passphrase", "root"); err != nil {
		t.Fatal(err)
	}
	ada.GET("/").Expect().Status(http.StatusSeeOther).Header("Location").HasPrefix("/login")
}
