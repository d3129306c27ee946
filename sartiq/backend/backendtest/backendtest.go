// Package backendtest starts the reference backend for other packages' tests: a real
// server on 127.0.0.1:0 over a fresh, migrated and demo-seeded schema, with a clock the
// test moves instead of sleeping.
package backendtest

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"hermeshost/pg/pgtest"
	"hermeshost/sartiq"
	"hermeshost/sartiq/backend"
	"hermeshost/service"
)

// BotToken is the bot token every test backend accepts.
const BotToken = "backendtest-bot-token-0123456789abcdef"

// Clock is a settable clock. It stands still unless advanced, or, after Follow, moves with
// real time as well.
type Clock struct {
	mu     sync.Mutex
	t      time.Time
	follow time.Time // real time at which following began; zero when standing still
}

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.follow.IsZero() {
		return c.t
	}
	return c.t.Add(time.Since(c.follow))
}

// Follow makes the clock move with real time from now on, for tests in which heartbeats
// and staleness must play out as they would in production (processes the test cannot
// pause); Advance still jumps it forward.
func (c *Clock) Follow() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.follow.IsZero() {
		c.follow = time.Now()
	}
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Backend is a running reference backend.
type Backend struct {
	URL    string
	DB     *pgxpool.Pool
	Clock  *Clock
	Config backend.Config
}

// Start runs a backend until the test ends. cfg's zero fields take the defaults; its
// BotToken and Now are always BotToken and the backend's Clock.
func Start(t testing.TB, cfg backend.Config) *Backend {
	t.Helper()
	_, db := pgtest.Schema(t, backend.Migrations)
	clk := &Clock{t: time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)}
	cfg.BotToken, cfg.Now = BotToken, clk.Now
	if cfg.StaleAfter == 0 {
		cfg.StaleAfter = backend.DefaultStaleAfter
	}
	if cfg.TokenTTL == 0 {
		cfg.TokenTTL = backend.DefaultTokenTTL
	}
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	ops := service.NewOps(log)
	h, err := backend.New(db, cfg, ops)
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
	if err := backend.SeedDemo(context.Background(), db, clk.Now()); err != nil {
		t.Fatal(err)
	}
	return &Backend{URL: srv.URL(), DB: db, Clock: clk, Config: cfg}
}

// DemoJob is the id of org's seeded job of type typ.
func (b *Backend) DemoJob(t testing.TB, org, typ string) string {
	t.Helper()
	var id string
	if err := b.DB.QueryRow(context.Background(), `SELECT id::text FROM agent_jobs WHERE seed_key = $1`,
		"demo:"+org+":"+typ).Scan(&id); err != nil {
		t.Fatalf("demo job %s/%s: %v", org, typ, err)
	}
	return id
}

// AddJob queues a small job of type typ for org, making the org if it is new, and returns
// its id: a product_ingest of one catalogue row, or a guidelines_extraction of one
// category, so that load tests spend their time in the host rather than in the agent.
func (b *Backend) AddJob(t testing.TB, org, typ string) string {
	t.Helper()
	ctx := context.Background()
	if err := backend.EnsureOrganization(ctx, b.DB, org, "Org "+org, b.Clock.Now()); err != nil {
		t.Fatal(err)
	}
	j := backend.NewJob{Type: typ, OrganizationID: org}
	switch typ {
	case sartiq.TypeProductIngest:
		j.Instructions = "Propose one product for each row of catalog.csv."
		j.Sources = []sartiq.ManifestSource{{Name: "catalog.csv", MediaType: "text/csv", Content: "sku,name,price\n" + org + "-1,Trail Shoe,89.00\n"}}
	default:
		j.Instructions = "Extract the brand guidelines of every category from brand-book.md."
		j.Categories = backend.DemoCategories[:1]
		j.Sources = []sartiq.ManifestSource{{Name: "brand-book.md", MediaType: "text/markdown", Content: "# Brand book\n\n## Tone of voice\nPlain and warm.\n"}}
	}
	id, err := backend.CreateJob(ctx, b.DB, j, b.Clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// Fault is what a Front does with one call.
type Fault int

const (
	// Pass passes the call on to the backend and its answer back.
	Pass Fault = iota
	// Refuse answers 503 and passes nothing on: a backend whose database is restarting.
	Refuse
	// LoseAnswer passes the call on, then answers 502 whatever the backend said: the call
	// landed, its answer was lost on the way back.
	LoseAnswer
)

// Front serves the backend at a URL of its own, doing with each call what fault says of
// it; the test's clients (or the host's, given this URL as the API's) go through it.
func (b *Backend) Front(t testing.TB, fault func(*http.Request) Fault) string {
	t.Helper()
	target, err := url.Parse(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch fault(r) {
		case Refuse:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":"unavailable","message":"backendtest: refused by the test's front"}`)
		case LoseAnswer:
			proxy.ServeHTTP(httptest.NewRecorder(), r)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, `{"error":"bad_gateway","message":"backendtest: the answer was lost by the test's front"}`)
		default:
			proxy.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}
