package web_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/gavv/httpexpect/v2"

	"hermeshost/assertion"
	"hermeshost/control"
	"hermeshost/gateway"
	"hermeshost/internal/hosttest"
	"hermeshost/internal/statetest"
	"hermeshost/internal/testio"
	"hermeshost/lease"
	"hermeshost/orghome"
	"hermeshost/orghome/hermesstate"
	"hermeshost/pg/pgtest"
	"hermeshost/service"
	"hermeshost/subagent"
	"hermeshost/web"
)

const (
	dashSecret    = "dashboard-assertion-secret-0123456789"
	controlSecret = service.Secret("control-secret-for-dashboard-tests")
	gatewaySecret = "gateway-secret-for-dashboard-tests"
	// hostile is what a page, a model or a person may put into anything the dashboard
	// shows: markup, an attribute breaking out of its quotes into htmx, a script URL.
	hostile = `<script>alert(1)</script>" hx-get="/evil" onmouseover="alert(2)" <a href="javascript:alert(3)">x</a>`
)

// orgHome is one org's home under a shared ORGS_ROOT.
type orgHome struct {
	t   testing.TB
	org string
	dir string
	db  *sql.DB // state.db, writable by the test as Hermes writes it; nil without one
}

// newOrgHome makes org's home in root, with a state.db of schema version (0: none).
func newOrgHome(t testing.TB, root, org string, version int) *orgHome {
	t.Helper()
	dir := filepath.Join(root, org)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	h := &orgHome{t: t, org: org, dir: dir}
	if version != 0 {
		db, err := hermesstate.CreateVersion(context.Background(), filepath.Join(dir, "state.db"), version)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		h.db = db
	}
	return h
}

func (h *orgHome) write(name, content string) {
	h.t.Helper()
	p := filepath.Join(h.dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *orgHome) session(s hermesstate.Session) {
	h.t.Helper()
	if s.Source == "" {
		s.Source = "tool"
	}
	if err := hermesstate.InsertSession(context.Background(), h.db, s); err != nil {
		h.t.Fatal(err)
	}
}

func (h *orgHome) message(m hermesstate.Message) {
	h.t.Helper()
	if err := hermesstate.InsertMessage(context.Background(), h.db, m); err != nil {
		h.t.Fatal(err)
	}
}

// dash is one org's dashboard served directly, with the real control API (over a fresh
// schema) and the real gateway in front of its demo upstream.
type dash struct {
	t       testing.TB
	org     string
	srv     *httptest.Server
	leases  *lease.Store
	control *control.Client
	logs    *testio.Buffer
	signer  *assertion.Signer
	exec    func(sql string, args ...any)
}

type dashOptions struct {
	org     string
	home    *orgHome
	prefix  string
	control string // the control API's URL instead of the real one (an unreachable one)
	now     func() time.Time
}

func newDash(t testing.TB, o dashOptions) *dash {
	t.Helper()
	if o.org == "" {
		o.org = o.home.org
	}
	_, pool := pgtest.Schema(t)
	leases := lease.New(pool, lease.Options{})
	t.Cleanup(leases.Close)
	subs := subagent.New(pool, subagent.Options{})
	t.Cleanup(subs.Close)
	cs, err := control.NewServer(control.Config{DB: pool, Leases: leases, Subagents: subs, Secret: controlSecret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cs.Close) // its mirror's listener, which a live stream's long-poll starts
	csrv := httptest.NewServer(cs.Handler())
	t.Cleanup(csrv.Close)
	controlURL := csrv.URL
	if o.control != "" {
		controlURL = o.control
	}
	key, err := control.Key(controlSecret, o.org)
	if err != nil {
		t.Fatal(err)
	}
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	client, err := control.NewClient(controlURL, key, &http.Client{Transport: transport})
	if err != nil {
		t.Fatal(err)
	}
	gwKey, err := gateway.OrgKey(gatewaySecret, o.org)
	if err != nil {
		t.Fatal(err)
	}
	home, err := orghome.OpenHome(o.org, o.home.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { home.Close() })
	bundled, err := orghome.ReadBundled(filepath.Join(filepath.Dir(o.home.dir), "..", "bundled"))
	if err != nil {
		t.Fatal(err)
	}
	assertionKey, err := assertion.OrgKey(dashSecret, o.org)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testio.Buffer{}
	ops := service.NewOps(slog.New(slog.NewJSONHandler(logs, nil)))
	h, err := web.NewDashboard(ops, web.DashboardConfig{
		Org: o.org, Home: home, Bundled: bundled, SkillsMax: 40, AssertionKey: service.Secret(assertionKey),
		Control: client, GatewayURL: hosttest.DemoGateway(t, gatewaySecret, "host-key-for-dashboard-tests"), GatewayKey: service.Secret(gwKey),
		HTTPClient: &http.Client{Transport: transport}, Prefix: o.prefix, Now: o.now, SourceTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	signer, err := assertion.NewSigner(dashSecret, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &dash{
		t: t, org: o.org, srv: srv, leases: leases, control: client, logs: logs, signer: signer,
		exec: func(sql string, args ...any) {
			t.Helper()
			if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
				t.Fatal(err)
			}
		},
	}
}

// anonymous is an httpexpect client that presents no assertion and follows no redirect.
func (d *dash) anonymous() *httpexpect.Expect {
	return httpexpect.WithConfig(httpexpect.Config{
		BaseURL:  d.srv.URL,
		Reporter: httpexpect.NewAssertReporter(d.t),
		Client: &http.Client{
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			Transport:     testio.ReadWhole{Next: d.srv.Client().Transport},
		},
	})
}

// as is a client whose every request carries a fresh assertion for operator, as the
// launcher's proxy adds one.
func (d *dash) as(operator string) *httpexpect.Expect {
	return d.anonymous().Builder(func(r *httpexpect.Request) {
		tok, err := d.signer.Sign(operator, d.org)
		if err != nil {
			d.t.Fatal(err)
		}
		r.WithHeader(assertion.Header, tok)
	})
}

// doc parses a page and checks what every page must hold: no markup from the content,
// scripts only from the dashboard's static files (htmx, its SSE extension, app.js), and every URL and htmx request under
// the prefix.
func doc(t *testing.T, html, prefix string) *goquery.Document {
	t.Helper()
	d, err := goquery.NewDocumentFromReader(strings.NewReader(html))
	if err != nil {
		t.Fatal(err)
	}
	d.Find("script").Each(func(_ int, s *goquery.Selection) {
		if src, _ := s.Attr("src"); src != prefix+"/static/vendor/htmx.min.js" && src != prefix+"/static/vendor/htmx-ext-sse.min.js" && src != prefix+"/static/app.js" || strings.TrimSpace(s.Text()) != "" {
			t.Errorf("a script that is not the dashboard's htmx or app.js: %s", goquery.NodeName(s)+" src="+src+" "+s.Text())
		}
	})
	for _, attr := range []string{"href", "src", "action", "hx-get", "hx-post"} {
		d.Find("[" + attr + "]").Each(func(_ int, s *goquery.Selection) {
			if v, _ := s.Attr(attr); !strings.HasPrefix(v, prefix+"/") {
				t.Errorf("%s=%q is not under the prefix %s", attr, v, prefix)
			}
		})
	}
	d.Find("*").Each(func(_ int, s *goquery.Selection) {
		for _, a := range s.Nodes[0].Attr {
			if strings.HasPrefix(a.Key, "on") || (strings.HasPrefix(a.Key, "hx-") && strings.Contains(a.Val, "evil")) {
				t.Errorf("<%s %s=%q> came from content", goquery.NodeName(s), a.Key, a.Val)
			}
		}
	})
	if strings.Contains(html, "<script>alert") || strings.Contains(html, `hx-get="/evil"`) {
		t.Errorf("content reached the page unescaped")
	}
	return d
}

func testid(d *goquery.Document, id string) *goquery.Selection {
	return d.Find(`[data-testid="` + id + `"]`)
}

func texts(s *goquery.Selection) []string {
	var out []string
	s.Each(func(_ int, s *goquery.Selection) { out = append(out, strings.TrimSpace(s.Text())) })
	return out
}

// get is a GET of a URL as a page links it, path and query.
func get(e *httpexpect.Expect, target string) *httpexpect.Request {
	path, query, _ := strings.Cut(target, "?")
	return e.GET(path).WithQueryString(query)
}

func page(t *testing.T, e *httpexpect.Expect, target, prefix string) *goquery.Document {
	t.Helper()
	r := get(e, target).Expect().Status(http.StatusOK)
	r.Header("Content-Security-Policy").Contains("script-src 'self'")
	r.Header("Cache-Control").IsEqual("no-store")
	return doc(t, r.Body().Raw(), prefix)
}

// twoHomes is acme's and globex's homes under one ORGS_ROOT, each with sessions of its own.
func twoHomes(t testing.TB, version int) (acme, globex *orgHome) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "orgs")
	acme, globex = newOrgHome(t, root, "acme", version), newOrgHome(t, root, "globex", version)
	if version == 0 {
		return acme, globex
	}
	globex.session(hermesstate.Session{ID: "20261203_090000_g10bex", Title: "globex's secret plans", StartedAt: 1_760_000_000})
	globex.message(hermesstate.Message{SessionID: "20261203_090000_g10bex", Role: "user", Content: "globex confidential roadmap", Timestamp: 1_760_000_001})
	return acme, globex
}

func TestTheDashboardRefusesEverythingButItsOwnOrgsAssertion(t *testing.T) {
	acme, _ := twoHomes(t, hermesstate.V22)
	acme.session(hermesstate.Session{ID: "s1", Title: "acme's session", StartedAt: 1_760_000_000})
	d := newDash(t, dashOptions{home: acme})
	e := d.anonymous()
	past, _ := assertion.NewSigner(dashSecret, func() time.Time { return time.Now().Add(-2 * assertion.TTL) })
	expired, _ := past.Sign("ada", "acme")
	otherSecret, _ := assertion.NewSigner("another-launchers-secret-0123456789", nil)
	forged, _ := otherSecret.Sign("ada", "acme")
	globexTok, _ := d.signer.Sign("ada", "globex")
	good, _ := d.signer.Sign("ada", "acme")
	// A well-signed assertion with acme's own key that names another org: only a leaked key
	// could make one, and it is still refused, for the org.
	acmeKey, _ := assertion.OrgKey(dashSecret, "acme")
	crossOrg := signWith(t, acmeKey, map[string]any{"v": 1, "u": "ada", "o": "globex", "e": time.Now().Add(time.Minute).Unix()})

	for name, c := range map[string]struct {
		token  string
		status int
	}{
		// Every request also carries the operator's cookie and an Authorization header,
		// which vouch for nothing here.
		"no assertion":            {"", http.StatusUnauthorized},
		"forged":                  {forged, http.StatusUnauthorized},
		"tampered":                {good[:len(good)-2] + "xx", http.StatusUnauthorized},
		"expired":                 {expired, http.StatusUnauthorized},
		"another org's":           {globexTok, http.StatusUnauthorized},
		"acme's key, another org": {crossOrg, http.StatusForbidden},
		"garbage":                 {"not.an.assertion", http.StatusUnauthorized},
	} {
		t.Run(name, func(t *testing.T) {
			for _, path := range []string{"/orgs/acme", "/orgs/acme/", "/orgs/acme/sessions", "/orgs/acme/sessions/s1", "/orgs/acme/memory", "/orgs/acme/skills"} {
				req := e.GET(path).WithHeader("Cookie", "hermes_launcher=stolen").WithHeader("Authorization", "Bearer whatever")
				if c.token != "" {
					req = req.WithHeader(assertion.Header, c.token)
				}
				r := req.Expect().Status(c.status)
				r.Header("Content-Type").HasPrefix("text/html")
				body := r.Body().Raw()
				page := doc(t, body, "/orgs/acme")
				if got := testid(page, "error-message").Length(); got != 1 {
					t.Errorf("%s: no error message on the refusal", path)
				}
				for _, leak := range []string{"acme's session", "s1", "nav-sessions", "operator"} {
					if strings.Contains(body, leak) {
						t.Errorf("%s: the refusal shows %q", path, leak)
					}
				}
			}
		})
	}
	if logs := d.logs.String(); strings.Contains(logs, good) || strings.Contains(logs, forged) || !strings.Contains(logs, "dashboard: request refused") {
		t.Fatalf("refusals are not logged, or their assertions are:\n%s", logs)
	}
	// What needs no assertion: the static files, health and metrics.
	e.GET("/orgs/acme/static/app.css").Expect().Status(http.StatusOK).Header("Content-Type").HasPrefix("text/css")
	e.GET("/orgs/acme/static/vendor/htmx.min.js").Expect().Status(http.StatusOK)
	e.GET("/healthz").Expect().Status(http.StatusOK)
	e.GET("/metrics").Expect().Status(http.StatusOK)
	// A valid one opens the page, and the operator it names is shown.
	p := page(t, d.as("ada"), "/orgs/acme/", "/orgs/acme")
	if got := texts(testid(p, "operator")); len(got) != 1 || got[0] != "ada" {
		t.Fatalf("operator shown: %v", got)
	}
	d.as("ada").GET("/orgs/acme").Expect().Status(http.StatusSeeOther).Header("Location").IsEqual("/orgs/acme/")
	d.as("ada").GET("/orgs/acme/nothing-here").Expect().Status(http.StatusNotFound).Body().Contains(`data-testid="error-message"`)
}

// signWith makes an assertion with a verification key directly, as only its holder can.
func signWith(t *testing.T, hexKey string, claims map[string]any) string {
	t.Helper()
	payload, _ := json.Marshal(claims)
	p := base64.RawURLEncoding.EncodeToString(payload)
	key, err := hex.DecodeString(hexKey)
	if err != nil {
		t.Fatal(err)
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(p))
	return p + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func TestATranscriptOfAnotherOrgsSessionIsNotFound(t *testing.T) {
	acme, globex := twoHomes(t, hermesstate.V30)
	acme.session(hermesstate.Session{ID: "20261203_080000_acme01", Title: "acme's own", StartedAt: 1_760_000_000})
	d := newDash(t, dashOptions{home: acme})
	e := d.as("ada")
	page(t, e, "/orgs/acme/sessions/20261203_080000_acme01", "/orgs/acme")
	// globex's session exists, in globex's home; acme's dashboard opens only acme's.
	if _, err := os.Stat(filepath.Join(globex.dir, "state.db")); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"20261203_090000_g10bex", "..%2Fglobex%2Fstate.db", "%2E%2E", "nonexistent"} {
		r := e.GET("/orgs/acme/sessions/" + id).Expect().Status(http.StatusNotFound)
		body := r.Body().Raw()
		doc(t, body, "/orgs/acme")
		if strings.Contains(body, "globex's secret plans") || strings.Contains(body, "confidential roadmap") {
			t.Fatalf("another org's session shows through %s", id)
		}
	}
	// Nor does its search find another org's words.
	p := page(t, e, "/orgs/acme/sessions?q=confidential", "/orgs/acme")
	if testid(p, "sessions-no-match").Length() != 1 || testid(p, "hermes-session").Length() != 0 {
		t.Fatal("searching acme's sessions found another org's words")
	}
}

func TestHostileContentRendersInert(t *testing.T) {
	root := filepath.Join(t.TempDir(), "orgs")
	acme := newOrgHome(t, root, "acme", hermesstate.V30)
	acme.session(hermesstate.Session{ID: "javascript:alert(1)", Title: hostile, StartedAt: 1_760_000_000, SystemPrompt: hostile})
	acme.session(hermesstate.Session{ID: "child-1", ParentID: "javascript:alert(1)", StartedAt: 1_760_000_100})
	acme.message(hermesstate.Message{SessionID: "javascript:alert(1)", Role: "user", Content: hostile, Timestamp: 1_760_000_001})
	acme.message(hermesstate.Message{SessionID: "javascript:alert(1)", Role: "assistant", Timestamp: 1_760_000_002,
		ToolCalls: []hermesstate.ToolCall{{ID: "call-1", Name: hostile, Arguments: `{"url": "` + strings.ReplaceAll(hostile, `"`, `\"`) + `"}`}}})
	acme.message(hermesstate.Message{SessionID: "javascript:alert(1)", Role: "tool", ToolName: hostile, ToolCallID: "call-1", Content: hostile, Timestamp: 1_760_000_003})
	acme.message(hermesstate.Message{SessionID: "javascript:alert(1)", Role: "assistant", Content: strings.Repeat(hostile, 40), Timestamp: 1_760_000_004})
	acme.write("memories/MEMORY.md", hostile+"\n§\nsecond entry")
	acme.write("SOUL.md", hostile)
	desc := strings.ReplaceAll(hostile, `'`, `''`)
	acme.write("skills/research/web-reader/SKILL.md", "---\nname: web-reader\ndescription: '"+desc+"'\n---\nbody\n")
	// A skill named to break out: Hermes would not load it; its folder and name show as broken.
	acme.write(`skills/"><script>alert(4)</script>/SKILL.md`, "---\nname: '"+desc+"'\ndescription: x\n---\n")
	d := newDash(t, dashOptions{home: acme})
	e := d.as(`<script>alert("operator")</script>`)

	for _, path := range []string{"/orgs/acme/", "/orgs/acme/sessions", "/orgs/acme/sessions?q=alert",
		"/orgs/acme/sessions/javascript:alert%281%29", "/orgs/acme/sessions/javascript:alert%281%29?system=1",
		"/orgs/acme/memory", "/orgs/acme/skills"} {
		t.Run(path, func(t *testing.T) {
			r := get(e, path).Expect().Status(http.StatusOK)
			body := r.Body().Raw()
			p := doc(t, body, "/orgs/acme")
			if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
				t.Errorf("the hostile text is not shown, escaped")
			}
			if testid(p, "operator").Text() != `<script>alert("operator")</script>` {
				t.Errorf("the operator's name reads %q", testid(p, "operator").Text())
			}
		})
	}
	// The pieces are where they belong, as text.
	p := page(t, e, "/orgs/acme/sessions/javascript:alert%281%29", "/orgs/acme")
	if got := testid(p, "tool-call-name").Text(); got != hostile {
		t.Errorf("tool name %q", got)
	}
	if got := testid(p, "tool-call-arguments").Text(); !strings.Contains(got, "javascript:alert(3)") {
		t.Errorf("tool arguments %q", got)
	}
	p = page(t, e, "/orgs/acme/skills", "/orgs/acme")
	if got := testid(p, "skill-description").Text(); got != hostile {
		t.Errorf("skill description %q", got)
	}
	if got := testid(p, "skill-broken-dir").Text(); got != `"><script>alert(4)</script>` {
		t.Errorf("broken skill folder %q", got)
	}
	p = page(t, e, "/orgs/acme/memory", "/orgs/acme")
	if got := texts(testid(p, "memory-entry")); len(got) != 2 || got[0] != hostile {
		t.Errorf("memory entries %q", got)
	}
}

func TestTheOverviewShowsIdentityJobsLeasesAndTheGateway(t *testing.T) {
	acme, _ := twoHomes(t, hermesstate.V22)
	home, err := orghome.OpenHome("acme", acme.dir)
	if err != nil {
		t.Fatal(err)
	}
	acme.write("SOUL.md", "Tone: plain.\n")
	home.Log = slog.New(slog.DiscardHandler)
	if _, err := home.EnsureSoul(orghome.Identity{OrgID: "acme", DisplayName: "Acme"}); err != nil {
		t.Fatal(err)
	}
	home.Close()
	d := newDash(t, dashOptions{home: acme})
	ctx := context.Background()
	for _, j := range []struct{ org, id, status, error string }{
		{"acme", "job-running", "RUNNING", ""}, {"acme", "job-done", "COMPLETED", ""}, {"acme", "job-failed", "FAILED", "the agent crashed"},
		{"globex", "job-globex", "RUNNING", ""},
	} {
		d.exec(`INSERT INTO mirror_jobs (job_id, org, type, status, attempt, error) VALUES ($1, $2, 'product_ingest', $3, 1, NULLIF($4, ''))`,
			j.id, j.org, j.status, j.error)
	}
	if _, err := d.control.Acquire(ctx, "home:acme", "worker-acme-1", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := d.control.Acquire(ctx, "session:chat-7", "chat-turn-3", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"home:globex", "org:acme", "session:globex.chat-7"} {
		if _, err := d.leases.TryAcquire(ctx, key, "not-acmes", time.Minute); err != nil {
			t.Fatal(err)
		}
	}

	body := d.as("ada").GET("/orgs/acme/").Expect().Status(http.StatusOK).Body().Raw()
	p := doc(t, body, "/orgs/acme")
	if got := testid(p, "identity-version").Text(); !strings.Contains(got, fmt.Sprintf("v%d", orghome.SoulBlockVersion)) || !strings.Contains(got, "current") {
		t.Errorf("identity version: %q", got)
	}
	if got := testid(p, "identity-free").Text(); got != "Tone: plain.\n" {
		t.Errorf("free section %q", got)
	}
	if testid(p, "identity-problem").Length() != 0 {
		t.Errorf("a problem with a fresh SOUL.md: %s", testid(p, "identity-problem").Text())
	}
	if got := texts(testid(p, "jobs-current").Find(`[data-testid="job"] code`)); strings.Join(got, ",") != "job-running" {
		t.Errorf("current jobs %v", got)
	}
	if href, _ := testid(p, "jobs-current").Find(`[data-testid="job-link"]`).Attr("href"); href != "/orgs/acme/jobs/job-running" {
		t.Errorf("the current job links to %q, not its page", href)
	}
	if got := texts(testid(p, "jobs-recent").Find(`[data-testid="job"] code`)); len(got) != 2 {
		t.Errorf("recent jobs %v", got)
	}
	if !strings.Contains(testid(p, "jobs-recent").Text(), "the agent crashed") {
		t.Errorf("a failed job's error is not shown")
	}
	if got := texts(testid(p, "lease-key")); strings.Join(got, ",") != "home:acme,session:chat-7" && strings.Join(got, ",") != "session:chat-7,home:acme" {
		t.Errorf("lease keys %v", got)
	}
	if got := texts(testid(p, "lease-holder")); !strings.Contains(strings.Join(got, ","), "worker-acme-1") {
		t.Errorf("lease holders %v", got)
	}
	if got := texts(testid(p, "gateway-model")); !strings.Contains(strings.Join(got, ","), "demo-worker") {
		t.Errorf("gateway models %v", got)
	}
	for _, leak := range []string{"globex", "not-acmes", "org:acme"} {
		if strings.Contains(body, leak) {
			t.Errorf("the overview shows %q", leak)
		}
	}

	// Nothing held, nothing queued: the page says so, and what comes next.
	other := newOrgHome(t, filepath.Join(t.TempDir(), "orgs"), "initech", 0)
	p = page(t, newDash(t, dashOptions{home: other}).as("ada"), "/orgs/initech/", "/orgs/initech")
	for _, id := range []string{"identity-none", "jobs-current-none", "jobs-recent-none", "leases-none", "gateway-ok"} {
		if testid(p, id).Length() != 1 {
			t.Errorf("no %s on an empty org's overview", id)
		}
	}
}

func TestTheOverviewSaysWhenTheControlAPIIsUnreachableAndShowsTheRest(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	acme.write("SOUL.md", "Free text only.\n")
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	d := newDash(t, dashOptions{home: acme, control: deadURL})
	p := page(t, d.as("ada"), "/orgs/acme/", "/orgs/acme")
	for _, id := range []string{"jobs-error", "leases-error"} {
		if got := testid(p, id).Text(); !strings.Contains(got, "control API did not answer") || strings.Contains(got, "hck_") {
			t.Errorf("%s: %q", id, got)
		}
	}
	if got := testid(p, "identity-free").Text(); got != "Free text only.\n" {
		t.Errorf("identity without the control API: %q", got)
	}
	if got := testid(p, "identity-problem").Text(); !strings.Contains(got, "no generated block") {
		t.Errorf("a SOUL.md without the block: %q", got)
	}
	if testid(p, "gateway-ok").Length() != 1 {
		t.Error("the gateway's part is not shown")
	}
}

func TestSessionsArePagedNewestFirstAndSearchedThroughTheIndex(t *testing.T) {
	for _, version := range []int{hermesstate.V22, hermesstate.V30} {
		t.Run(fmt.Sprintf("schema %d", version), func(t *testing.T) {
			acme, _ := twoHomes(t, version)
			for i := range 60 {
				id := fmt.Sprintf("20261203_%06d_s%04d", i, i)
				acme.session(hermesstate.Session{ID: id, StartedAt: float64(1_760_000_000 + i*60), Model: "demo-worker",
					InputTokens: int64(1000 + i), OutputTokens: 20, EstimatedCostUSD: 0.5})
				word := "ordinary"
				if i%20 == 7 {
					word = "zanzibar"
				}
				acme.message(hermesstate.Message{SessionID: id, Role: "user", Content: "talk of " + word, Timestamp: float64(1_760_000_000 + i*60 + 1)})
			}
			// A taken-back message is not a hit: the transcript does not show it.
			acme.message(hermesstate.Message{SessionID: "20261203_000001_s0001", Role: "user", Content: "zanzibar withdrawn", Inactive: true, Timestamp: 1_760_000_100})
			d := newDash(t, dashOptions{home: acme})
			e := d.as("ada")
			ids := func(p *goquery.Document) []string {
				var out []string
				testid(p, "hermes-session").Each(func(_ int, s *goquery.Selection) {
					id, _ := s.Attr("data-session-id")
					out = append(out, id)
				})
				return out
			}

			p := page(t, e, "/orgs/acme/sessions", "/orgs/acme")
			first := ids(p)
			if len(first) != 50 || first[0] != "20261203_000059_s0059" || first[49] != "20261203_000010_s0010" {
				t.Fatalf("first page: %d sessions, %v ... ", len(first), first[:min(3, len(first))])
			}
			if got := testid(p, "session-tokens").First().Text(); got != "1,059 / 20" {
				t.Errorf("tokens %q", got)
			}
			if got := testid(p, "session-cost").First().Text(); got != "$0.5000" {
				t.Errorf("cost %q", got)
			}
			if got := testid(p, "session-source").First().Text(); got != "tool" {
				t.Errorf("source %q", got)
			}
			next, ok := testid(p, "sessions-next").Attr("href")
			if !ok || testid(p, "sessions-first").Length() != 0 {
				t.Fatal("no link to the older sessions, or a link back on the first page")
			}
			p = page(t, e, next, "/orgs/acme")
			second := ids(p)
			if len(second) != 10 || second[0] != "20261203_000009_s0009" || second[9] != "20261203_000000_s0000" {
				t.Fatalf("second page: %v", second)
			}
			if testid(p, "sessions-next").Length() != 0 || testid(p, "sessions-first").Length() != 1 {
				t.Fatal("the last page links further, or not back")
			}

			p = page(t, e, "/orgs/acme/sessions?q=zanzibar", "/orgs/acme")
			if got := strings.Join(ids(p), ","); got != "20261203_000047_s0047,20261203_000027_s0027,20261203_000007_s0007" {
				t.Fatalf("search: %s", got)
			}
			if v, _ := p.Find(`input[name="q"]`).Attr("value"); v != "zanzibar" {
				t.Errorf("the search box reads %q", v)
			}
			// FTS operators are text: no error, no match-all.
			p = page(t, e, `/orgs/acme/sessions?q=%22zanzibar%22+OR+*`, "/orgs/acme")
			if len(ids(p)) != 0 || testid(p, "sessions-no-match").Length() != 1 {
				t.Fatalf("a query with FTS operators: %v", ids(p))
			}
			// The search form asks htmx for the list alone.
			frag := e.GET("/orgs/acme/sessions").WithQuery("q", "zanzibar").WithHeader("HX-Request", "true").Expect().Status(http.StatusOK).Body()
			frag.NotContains("<html").NotContains(`data-testid="nav"`).Contains(`id="hermes-sessions"`).Contains("20261203_000047_s0047")
			e.GET("/orgs/acme/sessions").WithQuery("after", "not-a-cursor").Expect().Status(http.StatusBadRequest).
				Body().Contains(`data-testid="error-message"`)
		})
	}
}

func TestChildSessionsAreGroupedUnderTheirParent(t *testing.T) {
	acme, _ := twoHomes(t, hermesstate.V30)
	// The orphan's parent is old enough to be on the next page: 50 sessions came between.
	acme.session(hermesstate.Session{ID: "gone-long-ago", StartedAt: 1_750_000_000})
	for i := range 50 {
		acme.session(hermesstate.Session{ID: fmt.Sprintf("filler-%02d", i), StartedAt: float64(1_750_000_001 + i)})
	}
	acme.session(hermesstate.Session{ID: "parent", Title: "the job", StartedAt: 1_760_000_000, EndedAt: 1_760_000_500, EndReason: "compression"})
	acme.session(hermesstate.Session{ID: "continued", ParentID: "parent", StartedAt: 1_760_000_501})
	acme.session(hermesstate.Session{ID: "researcher", ParentID: "continued", StartedAt: 1_760_000_600})
	acme.session(hermesstate.Session{ID: "alone", Title: "another job", StartedAt: 1_760_000_700})
	acme.session(hermesstate.Session{ID: "orphan", ParentID: "gone-long-ago", StartedAt: 1_760_000_800})
	d := newDash(t, dashOptions{home: acme})
	p := page(t, d.as("ada"), "/orgs/acme/sessions", "/orgs/acme")
	var groups [][]string
	testid(p, "session-group").Each(func(_ int, g *goquery.Selection) {
		var ids []string
		g.Find(`[data-testid="hermes-session"]`).Each(func(_ int, s *goquery.Selection) {
			id, _ := s.Attr("data-session-id")
			kind := strings.TrimSpace(s.Find(`[data-testid="session-kind"]`).Text())
			ids = append(ids, id+":"+kind)
		})
		if !strings.HasPrefix(ids[0], "filler-") {
			groups = append(groups, ids)
		}
	})
	want := "[[orphan:child] [alone:] [parent: continued:compression continuation researcher:subagent]]"
	if got := fmt.Sprint(groups); got != want {
		t.Fatalf("groups %s, want %s", got, want)
	}
	if href, _ := testid(p, "session-parent").Attr("href"); href != "/orgs/acme/sessions/gone-long-ago" {
		t.Fatalf("an orphan's parent link: %q", href)
	}
}

func TestATranscriptShowsWhatAPersonReads(t *testing.T) {
	for _, version := range []int{hermesstate.V22, hermesstate.V30} {
		t.Run(fmt.Sprintf("schema %d", version), func(t *testing.T) {
			acme, _ := twoHomes(t, version)
			const id = "20261203_141812_7c2bfe"
			acme.session(hermesstate.Session{ID: id, Model: "demo-worker", StartedAt: 1_760_000_000, SystemPrompt: "You are Hermes. SYSTEM-PROMPT-MARKER",
				InputTokens: 1234, OutputTokens: 56})
			long := strings.Repeat("long answer ", 300)
			for _, m := range []hermesstate.Message{
				{Role: "user", Content: "Ingest the products."},
				{Role: "assistant", ToolCalls: []hermesstate.ToolCall{{ID: "c1", Name: "terminal", Arguments: `{"command":"sartiq ops"}`}}},
				{Role: "tool", ToolName: "terminal", ToolCallID: "c1", Content: "op list: ..."},
				{Role: "user", Content: "TAKEN-BACK", Inactive: true},
				{Role: "user", Content: "COMPACTED-AWAY", Inactive: true, Compacted: true},
				{Role: "assistant", Content: long},
			} {
				m.SessionID, m.Timestamp = id, 1_760_000_010
				acme.message(m)
			}
			if version == hermesstate.V30 {
				acme.message(hermesstate.Message{SessionID: id, Role: "user", Content: "HIDDEN-SCAFFOLD", DisplayKind: "hidden", Timestamp: 1_760_000_020})
			}
			d := newDash(t, dashOptions{home: acme})
			e := d.as("ada")
			body := e.GET("/orgs/acme/sessions/" + id).Expect().Status(http.StatusOK).Body().Raw()
			p := doc(t, body, "/orgs/acme")
			var roles []string
			testid(p, "message").Each(func(_ int, s *goquery.Selection) { r, _ := s.Attr("data-role"); roles = append(roles, r) })
			if got := strings.Join(roles, ","); got != "user,assistant,tool,assistant" {
				t.Fatalf("roles %s", got)
			}
			for _, hidden := range []string{"TAKEN-BACK", "COMPACTED-AWAY", "HIDDEN-SCAFFOLD", "SYSTEM-PROMPT-MARKER"} {
				if strings.Contains(body, hidden) {
					t.Errorf("the transcript shows %s", hidden)
				}
			}
			omitted := 2
			if version == hermesstate.V30 {
				omitted = 3
			}
			if got := testid(p, "transcript-omitted").Text(); !strings.HasPrefix(got, fmt.Sprint(omitted)+" rows") {
				t.Errorf("omitted: %q", got)
			}
			call := testid(p, "tool-call")
			if call.Is("details[open]") || call.Find(`[data-testid="tool-call-name"]`).Text() != "terminal" ||
				call.Find(`[data-testid="tool-call-arguments"]`).Text() != "{\n  \"command\": \"sartiq ops\"\n}" {
				t.Errorf("tool call: %q", call.Text())
			}
			result := testid(p, "tool-result")
			if result.Is("details[open]") || result.Find(`[data-testid="tool-result-name"]`).Text() != "terminal" ||
				result.Find(`[data-testid="tool-result-content"]`).Text() != "op list: ..." {
				t.Errorf("tool result: %q", result.Text())
			}
			folded := testid(p, "long-content")
			if folded.Length() != 1 || folded.Is("details[open]") || !strings.Contains(folded.Find("summary").Text(), "(3600 characters)") {
				t.Errorf("long content: %q", folded.Find("summary").Text())
			}
			if got := testid(p, "transcript-tokens").Text(); !strings.Contains(got, "1,234") {
				t.Errorf("tokens %q", got)
			}
			show, ok := testid(p, "show-system").Attr("href")
			if !ok || show != "/orgs/acme/sessions/"+id+"?system=1" {
				t.Fatalf("link to the system prompt: %q", show)
			}
			p = page(t, e, show, "/orgs/acme")
			sys := testid(p, "system-prompt")
			if sys.Is("details[open]") || !strings.Contains(sys.Find("pre").Text(), "SYSTEM-PROMPT-MARKER") {
				t.Errorf("the system prompt asked for: %q", sys.Text())
			}
		})
	}
}

func TestEmptyStatesSayWhatToDoNext(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	d := newDash(t, dashOptions{home: acme})
	e := d.as("ada")
	p := page(t, e, "/orgs/acme/sessions", "/orgs/acme")
	if got := testid(p, "sessions-no-state").Text(); !strings.Contains(got, "no state.db") || !strings.Contains(got, "a job") {
		t.Errorf("no state.db: %q", got)
	}
	e.GET("/orgs/acme/sessions/20261203_090000_g10bex").Expect().Status(http.StatusNotFound)
	p = page(t, e, "/orgs/acme/memory", "/orgs/acme")
	if got := texts(testid(p, "memory-none")); len(got) != 2 || !strings.Contains(got[0], "MEMORY.md") || !strings.Contains(got[1], "USER.md") {
		t.Errorf("no memory: %q", got)
	}
	if got := testid(p, "memory-readonly").Text(); !strings.Contains(got, "Hermes owns these files") {
		t.Errorf("the memory page does not say why it is read-only: %q", got)
	}
	p = page(t, e, "/orgs/acme/skills", "/orgs/acme")
	if got := testid(p, "skills-none").Text(); !strings.Contains(got, "No skills yet") {
		t.Errorf("no skills: %q", got)
	}

	// A state.db without sessions yet.
	acme2, _ := twoHomes(t, hermesstate.V22)
	p = page(t, newDash(t, dashOptions{home: acme2}).as("ada"), "/orgs/acme/sessions", "/orgs/acme")
	if testid(p, "sessions-none").Length() != 1 {
		t.Error("an empty state.db has no empty state")
	}
}

// A state.db a killed Hermes left mid-write cannot be read until Hermes opens it again:
// the pages say so and what ends it, and still serve.
func TestAWriteHermesDidNotFinishIsShownForWhatItIs(t *testing.T) {
	acme, _ := twoHomes(t, hermesstate.V22)
	acme.session(hermesstate.Session{ID: "20261203_090000_acme01", StartedAt: 1_764_752_400})
	acme.write("skills/notes/SKILL.md", "---\nname: notes\ndescription: keeps notes\n---\nSteps.\n")
	if err := acme.db.Close(); err != nil {
		t.Fatal(err)
	}
	statetest.InterruptWrite(t, filepath.Join(acme.dir, "state.db"))
	e := newDash(t, dashOptions{home: acme}).as("ada")
	for target, id := range map[string]string{
		"/orgs/acme/sessions":                        "sessions-interrupted",
		"/orgs/acme/sessions/20261203_090000_acme01": "transcript-interrupted",
	} {
		p := page(t, e, target, "/orgs/acme")
		if got := testid(p, id).Text(); !strings.Contains(got, "did not finish") || !strings.Contains(got, "next job or chat") {
			t.Errorf("%s: %s says %q", target, id, got)
		}
	}
	p := page(t, e, "/orgs/acme/skills", "/orgs/acme")
	if got := testid(p, "skills-usage-note").Text(); !strings.Contains(got, "did not finish") {
		t.Errorf("the skills page's usage note: %q", got)
	}
	if testid(p, "skill").Length() != 1 {
		t.Errorf("the skills page lists %d skills, want the one", testid(p, "skill").Length())
	}
}

func TestMemoryShowsEntriesAndTheirFill(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	acme.write("memories/MEMORY.md", "Products are ingested in batches of 50.\n§\nThe catalog's SKUs start with AC-.\n§\nThe catalog's SKUs start with AC-.")
	acme.write("memories/USER.md", strings.Repeat("x", 1400))
	d := newDash(t, dashOptions{home: acme})
	p := page(t, d.as("ada"), "/orgs/acme/memory", "/orgs/acme")
	mem := testid(p, "memory-MEMORY.md")
	if got := texts(mem.Find(`[data-testid="memory-entry"]`)); len(got) != 2 {
		t.Fatalf("MEMORY.md entries (duplicates dropped, as Hermes does): %q", got)
	}
	if got := strings.Join(strings.Fields(mem.Find(`[data-testid="memory-fill"]`).Text()), " "); got != "76 of 2200 characters (3%)" {
		t.Errorf("MEMORY.md fill %q", got)
	}
	user := testid(p, "memory-USER.md")
	fill := user.Find(`[data-testid="memory-fill"]`)
	if !fill.HasClass("bad") || !strings.Contains(fill.Text(), "1400 of 1375") || !strings.Contains(fill.Text(), "over Hermes' limit") {
		t.Errorf("an over-full USER.md: %q", fill.Text())
	}
	if v, _ := user.Find("meter").Attr("max"); v != "1375" {
		t.Errorf("meter max %q", v)
	}
}

func TestSkillsShowAuthoredAndBundledAtAnyDepthWithTheirState(t *testing.T) {
	root := filepath.Join(t.TempDir(), "orgs")
	acme := newOrgHome(t, root, "acme", 0)
	skill := func(name, desc string) string {
		return "---\nname: " + name + "\ndescription: " + desc + "\n---\nSteps.\n"
	}
	acme.write("skills/flat/SKILL.md", skill("flat", "A skill at the top."))
	acme.write("skills/mlops/inference/vllm-tuning/SKILL.md", skill("vllm-tuning", "Three folders down."))
	acme.write("skills/mlops/DESCRIPTION.md", "---\ndescription: Machine learning operations.\n---\n")
	acme.write("skills/stale-one/SKILL.md", skill("stale-one", "Disabled by the cap."))
	acme.write("skills/wrong-name/SKILL.md", skill("other-name", "Its name is not its folder's."))
	acme.write("skills/notes-only/README.txt", "no SKILL.md here")
	acme.write("skills/.usage.json", `{"flat": {"last_used_at": "2026-11-14T22:16:40+00:00"}}`)
	acme.write("config.yaml", "skills:\n  disabled:\n    - stale-one\n")
	bundled := filepath.Join(root, "..", "bundled")
	for name, content := range map[string]string{
		"github/github-pr/SKILL.md": skill("github-pr", "Bundled, two folders down."),
		"broken-bundled/SKILL.md":   "no frontmatter",
	} {
		p := filepath.Join(bundled, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := newDash(t, dashOptions{home: acme})
	p := page(t, d.as("ada"), "/orgs/acme/skills", "/orgs/acme")
	rows := map[string]*goquery.Selection{}
	testid(p, "skill").Each(func(_ int, s *goquery.Selection) { rows[s.Find(`[data-testid="skill-name"]`).Text()] = s })
	if len(rows) != 4 {
		t.Fatalf("skills: %v", texts(testid(p, "skill-name")))
	}
	for name, want := range map[string][3]string{
		"flat":        {"authored", "enabled", "2026-11-14 22:16:40 UTC"},
		"vllm-tuning": {"authored", "enabled", "SKILL.md mtime"},
		"stale-one":   {"authored", "disabled", ""},
		"github-pr":   {"bundled", "enabled", "—"},
	} {
		r := rows[name]
		if r == nil {
			t.Fatalf("no %s", name)
		}
		source, state, last := r.Find(`[data-testid="skill-source"]`).Text(), strings.TrimSpace(r.Find(`[data-testid="skill-state"]`).Text()), r.Find(`[data-testid="skill-last-used"]`).Text()
		if source != want[0] || state != want[1] || !strings.Contains(last, want[2]) {
			t.Errorf("%s: %s, %s, last used %q; want %v", name, source, state, last, want)
		}
	}
	if got := rows["vllm-tuning"].Find("td").Eq(1).Text(); got != "mlops/inference" {
		t.Errorf("category %q", got)
	}
	broken := map[string]string{}
	testid(p, "skill-broken").Each(func(_ int, s *goquery.Selection) {
		broken[s.Find(`[data-testid="skill-broken-dir"]`).Text()] = s.Find(`[data-testid="skill-broken-reason"]`).Text()
	})
	if len(broken) != 3 || !strings.Contains(broken["wrong-name"], "does not match its folder") ||
		!strings.Contains(broken["notes-only"], "no SKILL.md") || !strings.Contains(broken["broken-bundled"], "frontmatter") {
		t.Errorf("broken: %v", broken)
	}
	if got := strings.Join(strings.Fields(testid(p, "skills-cap").Text()), " "); !strings.HasPrefix(got, "3 authored, 2 of them enabled. Past 40") {
		t.Errorf("cap: %q", got)
	}

	// A config.yaml that does not parse is said, with its line.
	acme.write("config.yaml", "skills:\n  disabled: [unclosed\n")
	p = page(t, d.as("ada"), "/orgs/acme/skills", "/orgs/acme")
	if got := testid(p, "skills-error").Text(); !strings.Contains(got, "config.yaml") || !strings.Contains(got, "line") {
		t.Errorf("a broken config.yaml: %q", got)
	}
}

func TestPagesCarryAPrefixOtherThanTheDefault(t *testing.T) {
	acme, _ := twoHomes(t, hermesstate.V22)
	acme.session(hermesstate.Session{ID: "s1", Title: "one", StartedAt: 1_760_000_000})
	d := newDash(t, dashOptions{home: acme, prefix: "/proxied/acme"})
	e := d.as("ada")
	for _, path := range []string{"/proxied/acme/", "/proxied/acme/sessions", "/proxied/acme/sessions/s1", "/proxied/acme/memory", "/proxied/acme/skills"} {
		p := page(t, e, path, "/proxied/acme")
		if href, _ := p.Find(`link[rel="stylesheet"]`).Attr("href"); href != "/proxied/acme/static/app.css" {
			t.Errorf("%s: stylesheet %q", path, href)
		}
	}
	p := page(t, e, "/proxied/acme/sessions", "/proxied/acme")
	if v, _ := testid(p, "sessions-search").Attr("hx-get"); v != "/proxied/acme/sessions" {
		t.Errorf("search hx-get %q", v)
	}
	e.GET("/proxied/acme/static/app.css").Expect().Status(http.StatusOK)
	e.GET("/orgs/acme/").Expect().Status(http.StatusNotFound)
}

func TestNewDashboardRefusesAnIncompleteConfig(t *testing.T) {
	dir := t.TempDir()
	home, err := orghome.OpenHome("acme", dir)
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	key, _ := assertion.OrgKey(dashSecret, "acme")
	ck, _ := control.Key(controlSecret, "acme")
	client, _ := control.NewClient("http://127.0.0.1:1", ck, nil)
	good := web.DashboardConfig{Org: "acme", Home: home, AssertionKey: service.Secret(key), Control: client, GatewayURL: "http://127.0.0.1:1"}
	ops := service.NewOps(slog.New(slog.DiscardHandler))
	if _, err := web.NewDashboard(ops, good); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(*web.DashboardConfig){
		"bad org":         func(c *web.DashboardConfig) { c.Org = "ACME" },
		"another's home":  func(c *web.DashboardConfig) { c.Org = "globex" },
		"no home":         func(c *web.DashboardConfig) { c.Home = nil },
		"no control":      func(c *web.DashboardConfig) { c.Control = nil },
		"no gateway":      func(c *web.DashboardConfig) { c.GatewayURL = "" },
		"short key":       func(c *web.DashboardConfig) { c.AssertionKey = "abcd" },
		"trailing slash":  func(c *web.DashboardConfig) { c.Prefix = "/orgs/acme/" },
		"quote in prefix": func(c *web.DashboardConfig) { c.Prefix = `/orgs/"acme` },
	} {
		c := good
		edit(&c)
		if _, err := web.NewDashboard(service.NewOps(slog.New(slog.DiscardHandler)), c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// An operator's browser on the dashboard, with the assertion the launcher would add: every
// page loads its styles and htmx under the prefix within the CSP, the search swaps the list
// in place and puts the search in the address, a transcript folds its tool call, and the
// page logs no error.
func TestTheDashboardInABrowser(t *testing.T) {
	acme, _ := twoHomes(t, hermesstate.V22)
	acme.session(hermesstate.Session{ID: "s-old", Title: "catalog import", StartedAt: 1_760_000_000})
	acme.message(hermesstate.Message{SessionID: "s-old", Role: "user", Content: "import the zanzibar catalog", Timestamp: 1_760_000_001})
	acme.message(hermesstate.Message{SessionID: "s-old", Role: "assistant", Timestamp: 1_760_000_002,
		ToolCalls: []hermesstate.ToolCall{{ID: "c1", Name: "terminal", Arguments: `{"command":"sartiq ops"}`}}})
	acme.session(hermesstate.Session{ID: "s-new", Title: "guidelines", StartedAt: 1_760_000_100})
	d := newDash(t, dashOptions{home: acme})
	ctx, pageErrors := hosttest.Headless(t, 90*time.Second)
	// Signed a little ahead, so it is good for the whole test (the launcher signs each request).
	ahead, _ := assertion.NewSigner(dashSecret, func() time.Time { return time.Now().Add(3 * time.Minute) })
	tok, err := ahead.Sign("ada", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{assertion.Header: tok}}); err != nil {
		t.Fatal(err)
	}
	eval := func(js string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return s
	}
	rows := `Array.from(document.querySelectorAll('[data-testid="hermes-session"]')).map(e => e.dataset.sessionId).join(",")`
	err = chromedp.Do(ctx,
		chromedp.Navigate(d.srv.URL+"/orgs/acme/sessions"),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="hermes-sessions"]`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	if got := eval(rows); got != "s-new,s-old" {
		t.Fatalf("sessions %q", got)
	}
	// The stylesheet applied: the CSP let it in from under the prefix.
	if got := eval(`getComputedStyle(document.querySelector("header")).display`); got != "flex" {
		t.Fatalf("header display %q: the stylesheet did not load", got)
	}
	eval(`window.stillThisPage = "yes"`)
	err = chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("q"), "zanzibar"),
		chromedp.Click(chromedp.CSS(`[data-testid="sessions-search-submit"]`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for eval(rows) != "s-old" {
		if time.Now().After(deadline) {
			t.Fatalf("the search did not swap the list: %q", eval(rows))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := eval(`window.stillThisPage || "reloaded"`); got != "yes" {
		t.Fatalf("the search reloaded the page instead of swapping the list")
	}
	if got := eval(`location.pathname + location.search`); got != "/orgs/acme/sessions?q=zanzibar" {
		t.Fatalf("the address after the search: %q", got)
	}
	err = chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`[data-testid="session-link"]`)),
		chromedp.WaitVisible(chromedp.CSS(`[data-testid="transcript"]`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	if got := eval(`String(document.querySelector('[data-testid="tool-call"]').open)`); got != "false" {
		t.Fatalf("the tool call is not folded: open=%s", got)
	}
	for _, e := range pageErrors() {
		t.Errorf("the page logged an error: %s", e)
	}
}
