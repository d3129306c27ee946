package backend

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"hermeshost/internal/testio"

	"github.com/gavv/httpexpect/v2"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/jackc/pgx/v5/pgxpool"

	"hermeshost/pg/pgtest"
	"hermeshost/service"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const testBotToken = "bot-token-for-tests-0123456789"

// clock is the backend's injectable time: tests move it instead of sleeping.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// backendUnderTest is a real backend on 127.0.0.1:0 over a fresh schema.
type backendUnderTest struct {
	t     testing.TB
	url   string
	db    *pgxpool.Pool
	clock *clock
	cfg   Config
	logs  *testio.Buffer
	// checked is a client whose every response is validated against the document.
	checked *http.Client
}

const (
	testStaleAfter = 45 * time.Second
	testTokenTTL   = 10 * time.Minute
)

func startBackend(t testing.TB) *backendUnderTest {
	t.Helper()
	_, db := pgtest.Schema(t, Migrations)
	clk := &clock{t: time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)}
	logs := &testio.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	cfg := Config{BotToken: testBotToken, StaleAfter: testStaleAfter, TokenTTL: testTokenTTL, Now: clk.Now}
	ops := service.NewOps(log)
	h, err := New(db, cfg, ops)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := service.Listen("backend", "127.0.0.1:0", h, log, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	if err := SeedDemo(context.Background(), db, clk.Now()); err != nil {
		t.Fatal(err)
	}
	b := &backendUnderTest{t: t, url: srv.URL(), db: db, clock: clk, cfg: cfg, logs: logs}
	// Its own transport, closed before the server stops: a connection the transport dialed
	// under concurrency but never used would hold up the server's shutdown for 5s.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	b.checked = &http.Client{Transport: &documentCheck{t: t, router: documentRouter(t), next: tr}}
	return b
}

// expect is an httpexpect client for the backend presenting token (none when empty).
func (b *backendUnderTest) expect(token string) *httpexpect.Expect {
	e := httpexpect.WithConfig(httpexpect.Config{
		BaseURL:  b.url,
		Reporter: httpexpect.NewAssertReporter(b.t),
		Client:   b.checked,
	})
	if token == "" {
		return e
	}
	return e.Builder(func(r *httpexpect.Request) { r.WithHeader("Authorization", "Bearer "+token) })
}

func (b *backendUnderTest) bot() *httpexpect.Expect { return b.expect(testBotToken) }

func documentRouter(t testing.TB) routers.Router {
	t.Helper()
	doc, err := Document()
	if err != nil {
		t.Fatal(err)
	}
	doc.Servers = nil
	r, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// documentCheck validates every response the tests receive against the OpenAPI document:
// its status is documented for the operation and its body matches the schema. This is what
// keeps the document true to the code beyond its list of routes.
type documentCheck struct {
	t      testing.TB
	router routers.Router
	next   http.RoundTripper
}

func (d *documentCheck) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := d.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	route, params, ferr := d.router.FindRoute(req)
	if ferr != nil {
		return resp, nil // not a documented path: the route test covers the router's side
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route,
		},
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
		Status:  resp.StatusCode,
		Header:  resp.Header,
		Body:    io.NopCloser(bytes.NewReader(body)),
	}
	if err := openapi3filter.ValidateResponse(req.Context(), in); err != nil {
		d.t.Errorf("%s %s answered %d, which the document does not describe: %v\nbody: %s",
			req.Method, req.URL.Path, resp.StatusCode, err, body)
	}
	return resp, nil
}

// claim claims id with the bot token and returns the job token.
func (b *backendUnderTest) claim(id string) string {
	b.t.Helper()
	return b.bot().POST("/agent-jobs/{id}/claim", id).Expect().Status(http.StatusOK).
		JSON().Object().Value("job_token").String().Raw()
}

// demoJob is the id of org's seeded job of type typ.
func (b *backendUnderTest) demoJob(org, typ string) string {
	b.t.Helper()
	var id string
	if err := b.db.QueryRow(context.Background(), `SELECT id::text FROM agent_jobs WHERE seed_key = $1`,
		"demo:"+org+":"+typ).Scan(&id); err != nil {
		b.t.Fatal(err)
	}
	return id
}

// snapshot is every row of every backend table, to show that a refused request changed nothing.
func (b *backendUnderTest) snapshot() string {
	b.t.Helper()
	var out bytes.Buffer
	for _, table := range []string{"organizations", "agent_jobs", "job_tokens", "agent_job_events", "products",
		"product_proposals", "guidelines_proposals", "uploads"} {
		var rows string
		err := b.db.QueryRow(context.Background(),
			fmt.Sprintf(`SELECT coalesce(string_agg(t::text, E'\n' ORDER BY t::text), '') FROM %s t`, table)).Scan(&rows)
		if err != nil {
			b.t.Fatal(err)
		}
		fmt.Fprintf(&out, "== %s\n%s\n", table, rows)
	}
	return out.String()
}

// unchanged fails the test if the database differs from before.
func (b *backendUnderTest) unchanged(before string) {
	b.t.Helper()
	if after := b.snapshot(); after != before {
		b.t.Fatalf("a refused request changed the database:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
