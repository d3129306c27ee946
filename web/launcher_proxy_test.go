package web_test

import (
	"context"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/gavv/httpexpect/v2"

	"hermeshost/assertion"
	"hermeshost/dashboards"
	"hermeshost/internal/testio"
	"hermeshost/service"
	"hermeshost/web"
)

// tap sits in front of a real dashboard and records what reaches it, as the dashboard
// would see it. Under /orgs/<org>/hostile/ it answers itself, as a dashboard turned
// hostile would: a cookie for the launcher's origin, a script.
type tap struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []*http.Request
}

func newTap(t *testing.T, dashboardURL string) *tap {
	target, _ := url.Parse(dashboardURL)
	next := httputil.NewSingleHostReverseProxy(target)
	tp := &tap{}
	tp.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tp.mu.Lock()
		tp.seen = append(tp.seen, r.Clone(context.Background()))
		tp.mu.Unlock()
		if _, rest, ok := strings.Cut(r.URL.Path, "/hostile/"); ok {
			switch rest {
			case "cookie":
				http.SetCookie(w, &http.Cookie{Name: "hermes_launcher", Value: "planted", Path: "/"})
				w.Header().Set("Content-Type", "text/html; charset=utf-8")
				_, _ = w.Write([]byte("<p>hello</p>"))
			case "script":
				w.Header().Set("Content-Type", "application/javascript")
				_, _ = w.Write([]byte("alert(1)"))
			}
			return
		}
		next.ServeHTTP(w, r)
	}))
	t.Cleanup(tp.srv.Close)
	return tp
}

func (tp *tap) requests() []*http.Request {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]*http.Request(nil), tp.seen...)
}

// proxied is the launcher in front of acme's dashboard: operators ada (acme, globex) and bob
// (nothing), the dashboards table on the launcher's own schema.
type proxied struct {
	t     *testing.T
	srv   *httptest.Server
	store *dashboards.Store
	dash  *dash
	tap   *tap
}

func newProxied(t *testing.T, secret string) *proxied {
	t.Helper()
	acme := newOrgHome(t, t.TempDir(), "acme", 22)
	acme.write("memories/MEMORY.md", "Acme ships on Tuesdays.")
	return newProxiedHome(t, secret, acme)
}

// newProxiedHome is newProxied in front of the dashboard of home.
func newProxiedHome(t *testing.T, secret string, home *orgHome) *proxied {
	t.Helper()
	return proxyFor(t, secret, newDash(t, dashOptions{home: home}))
}

// proxyFor is the launcher in front of the dashboard d.
func proxyFor(t *testing.T, secret string, d *dash) *proxied {
	t.Helper()
	var store *dashboards.Store
	f := newLauncherFixture(t, func(c *web.LauncherConfig) {
		store = dashboards.New(c.DB, dashboards.Options{})
		t.Cleanup(store.Close)
		c.Dashboards, c.DashboardSecret = store, service.Secret(secret)
	})
	return &proxied{t: t, srv: f.srv, store: store, dash: d, tap: newTap(t, d.srv.URL)}
}

// running records acme's dashboard as the dispatcher would: started, answering at url.
func (p *proxied) running(org, url string) {
	p.t.Helper()
	ctx := context.Background()
	if _, err := p.store.Request(ctx, org, "test"); err != nil {
		p.t.Fatal(err)
	}
	if ok, err := p.store.Start(ctx, org, "test-dispatcher"); err != nil || !ok {
		p.t.Fatalf("start: %v %v", ok, err)
	}
	if err := p.store.Running(ctx, org, "test-dispatcher", url); err != nil {
		p.t.Fatal(err)
	}
}

func (p *proxied) browser(name string) *httpexpect.Expect {
	jar, _ := cookiejar.New(nil)
	e := httpexpect.WithConfig(httpexpect.Config{
		BaseURL:  p.srv.URL,
		Reporter: httpexpect.NewAssertReporter(p.t),
		Client: &http.Client{Jar: jar, Transport: testio.ReadWhole{Next: p.srv.Client().Transport},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
	})
	login(e, name, password).Status(http.StatusSeeOther)
	return e
}

func (p *proxied) state(org string) dashboards.State {
	p.t.Helper()
	d, err := p.store.Get(context.Background(), org)
	if err != nil {
		p.t.Fatal(err)
	}
	return d.State
}

func TestTheProxyKeepsTheOperatorsCredentialsAndVouchesWithAnAssertion(t *testing.T) {
	p := newProxied(t, dashSecret)
	p.running("acme", p.tap.srv.URL)
	ada := p.browser("ada")

	page := ada.GET("/orgs/acme/").WithHeader("Authorization", "Basic YWRhOnNlY3JldA==").
		WithCookie("other", "value").Expect().Status(http.StatusOK)
	page.Header("Content-Security-Policy").IsEqual(web.ContentSecurityPolicy)
	body := page.Body().Raw()
	if !strings.Contains(body, `data-testid="operator"`) || !strings.Contains(body, "ada") {
		t.Fatalf("the overview through the proxy:\n%s", body)
	}
	seen := p.tap.requests()
	if len(seen) != 1 {
		t.Fatalf("%d requests reached the dashboard, want 1", len(seen))
	}
	got := seen[0]
	if got.Header.Get("Cookie") != "" || got.Header.Get("Authorization") != "" || len(got.Cookies()) != 0 {
		t.Fatalf("the dashboard saw the operator's credentials: Cookie %q, Authorization %q", got.Header.Get("Cookie"), got.Header.Get("Authorization"))
	}
	key, _ := assertion.OrgKey(dashSecret, "acme")
	v, _ := assertion.NewVerifier("acme", key, nil)
	claims, err := v.Verify(got.Header.Get(assertion.Header))
	if err != nil || claims.Operator != "ada" || claims.Org != "acme" {
		t.Fatalf("the assertion the dashboard got: %+v %v", claims, err)
	}
	if got.URL.Path != "/orgs/acme/" {
		t.Fatalf("the dashboard was asked for %s", got.URL.Path)
	}
	// No key reaches a page.
	for _, secret := range []string{dashSecret, key, string(controlSecret), gatewaySecret} {
		if strings.Contains(body, secret) {
			t.Fatalf("a secret in the overview (%.6s...)", secret)
		}
	}

	// What a hostile dashboard answers is not passed on as it was.
	r := ada.GET("/orgs/acme/hostile/cookie").Expect().Status(http.StatusOK)
	// (The launcher's own session cookie is renewed on every answer; only it may be set.)
	for _, sc := range r.Raw().Header.Values("Set-Cookie") {
		if strings.Contains(sc, "planted") {
			t.Fatalf("a dashboard's Set-Cookie reached the browser: %v", sc)
		}
	}
	ada.GET("/orgs/acme/hostile/script").Expect().Status(http.StatusBadGateway).Body().NotContains("alert(1)")
	// The dashboard's scripts and styles are the launcher's own.
	before := len(p.tap.requests())
	ada.GET("/orgs/acme/static/vendor/htmx.min.js").Expect().Status(http.StatusOK).HasContentType("text/javascript")
	if len(p.tap.requests()) != before {
		t.Fatal("a static file was fetched from the dashboard")
	}
	// A page of globex's dashboard cannot act on acme's, although ada holds both grants.
	ada.POST("/orgs/acme/sessions").WithHeader("Referer", p.srv.URL+"/orgs/globex/sessions").
		WithHeader("Origin", p.srv.URL).Expect().Status(http.StatusForbidden)
	if len(p.tap.requests()) != before {
		t.Fatal("a request from another org's page reached the dashboard")
	}
}

func TestWithoutTheGrantNothingIsProxied(t *testing.T) {
	p := newProxied(t, dashSecret)
	p.running("acme", p.tap.srv.URL)
	bob := p.browser("bob")
	for _, path := range []string{"/orgs/acme/", "/orgs/acme/sessions", "/orgs/acme/sessions/x", "/orgs/acme/anything/else"} {
		bob.GET(path).Expect().Status(http.StatusForbidden).Body().Contains("no grant")
	}
	bob.POST("/open/acme").WithHeader("Origin", p.srv.URL).Expect().Status(http.StatusForbidden)
	bob.GET("/orgs/not_an_org/").Expect().Status(http.StatusNotFound)
	if n := len(p.tap.requests()); n != 0 {
		t.Fatalf("%d requests of an operator without the grant reached the dashboard", n)
	}
	// Not logged in: the login page, nothing proxied.
	anon := httpexpect.WithConfig(httpexpect.Config{BaseURL: p.srv.URL, Reporter: httpexpect.NewAssertReporter(t),
		Client: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}})
	anon.GET("/orgs/acme/").Expect().Status(http.StatusSeeOther).Header("Location").HasPrefix("/login")
}

func TestADashboardNotRunningIsAskedForAndShownStarting(t *testing.T) {
	p := newProxied(t, dashSecret)
	ada := p.browser("ada")

	// Never opened: asked for, and the page says it is starting.
	r := ada.GET("/orgs/acme/sessions").Expect().Status(http.StatusServiceUnavailable)
	r.Header("Retry-After").IsEqual("1")
	r.Body().Contains(`data-testid="dashboard-starting"`).Contains(`http-equiv="refresh"`)
	if s := p.state("acme"); s != dashboards.Requested {
		t.Fatalf("state after the first visit: %s", s)
	}
	// An htmx request is told to reload the page rather than getting a page as a fragment.
	ada.GET("/orgs/acme/sessions").WithHeader("HX-Request", "true").Expect().
		Status(http.StatusServiceUnavailable).Header("HX-Refresh").IsEqual("true")

	// Running but gone (nothing listens at its address): asked for again.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String()
	ln.Close()
	p.running("acme", gone)
	ada.GET("/orgs/acme/").Expect().Status(http.StatusServiceUnavailable).Body().Contains(`data-testid="dashboard-starting"`)
	if s := p.state("acme"); s != dashboards.Requested {
		t.Fatalf("state after its address stopped answering: %s", s)
	}

	// Failed: the reason, and a way to try again; nothing is retried without the operator.
	ctx := context.Background()
	if ok, err := p.store.Start(ctx, "acme", "test-dispatcher"); err != nil || !ok {
		t.Fatalf("start: %v %v", ok, err)
	}
	if err := p.store.Fail(ctx, "acme", "test-dispatcher", "the dashboard did not answer /healthz within 20s"); err != nil {
		t.Fatal(err)
	}
	ada.GET("/orgs/acme/").Expect().Status(http.StatusServiceUnavailable).Body().
		Contains(`data-testid="dashboard-failed"`).Contains("did not answer /healthz within 20s").Contains(`action="/open/acme"`)
	if s := p.state("acme"); s != dashboards.Failed {
		t.Fatalf("a failed dashboard was asked for again without the operator: %s", s)
	}
	ada.POST("/open/acme").WithHeader("Origin", p.srv.URL).Expect().Status(http.StatusSeeOther).Header("Location").IsEqual("/orgs/acme/")
	if s := p.state("acme"); s != dashboards.Requested {
		t.Fatalf("state after Try again: %s", s)
	}
	// Try again from another site is refused (cross-origin protection).
	ada.POST("/open/acme").WithHeader("Origin", "https://elsewhere.example").WithHeader("Sec-Fetch-Site", "cross-site").
		Expect().Status(http.StatusForbidden)
}

func TestALauncherWithoutTheSecretOpensNoDashboard(t *testing.T) {
	p := newProxied(t, "")
	p.running("acme", p.tap.srv.URL)
	p.browser("ada").GET("/orgs/acme/").Expect().Status(http.StatusServiceUnavailable).
		Body().Contains(`data-testid="dashboard-unavailable"`).Contains("DASHBOARD_SECRET")
	if n := len(p.tap.requests()); n != 0 {
		t.Fatalf("%d requests reached the dashboard without an assertion to carry", n)
	}
}
