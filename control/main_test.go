package control

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"hermeshost/internal/testio"

	"github.com/gavv/httpexpect/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/lease"
	"hermeshost/pg/pgtest"
	"hermeshost/service"
	"hermeshost/subagent"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	testSecret  service.Secret = "control-secret-for-tests-0123456789"
	testMaxWait                = 5 * time.Second
	orgA                       = "acme"
	orgB                       = "globex"
)

// fixture is the real handler over a fresh migrated schema, on an httptest server.
type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	leases *lease.Store
	subs   *subagent.Store
	server *Server
	srv    *httptest.Server
	reg    *prometheus.Registry
	logs   *testio.Buffer
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	_, pool := pgtest.Schema(t)
	store := lease.New(pool, lease.Options{})
	t.Cleanup(store.Close)
	subs := subagent.New(pool, subagent.Options{})
	t.Cleanup(subs.Close)
	reg := prometheus.NewRegistry()
	logs := &testio.Buffer{}
	s, err := NewServer(Config{
		DB: pool, Leases: store, Subagents: subs, Secret: testSecret, Registerer: reg, MaxWait: testMaxWait,
		Log: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &fixture{t: t, pool: pool, leases: store, subs: subs, server: s, srv: srv, reg: reg, logs: logs}
}

func (f *fixture) key(org string) string {
	f.t.Helper()
	k, err := Key(testSecret, org)
	if err != nil {
		f.t.Fatal(err)
	}
	return k
}

// bearer is an httpexpect client presenting the Authorization header value auth (none when
// empty).
func (f *fixture) bearer(auth string) *httpexpect.Expect {
	e := httpexpect.WithConfig(httpexpect.Config{
		BaseURL:  f.srv.URL,
		Reporter: httpexpect.NewAssertReporter(f.t),
		Client:   &http.Client{Transport: testio.ReadWhole{Next: f.srv.Client().Transport}},
	})
	if auth == "" {
		return e
	}
	return e.Builder(func(r *httpexpect.Request) { r.WithHeader("Authorization", auth) })
}

// as is an httpexpect client presenting org's control key.
func (f *fixture) as(org string) *httpexpect.Expect { return f.bearer("Bearer " + f.key(org)) }

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(context.Background(), sql, args...); err != nil {
		f.t.Fatal(err)
	}
}

// addJob mirrors a job of org updated at, with events events.
func (f *fixture) addJob(org, id string, at time.Time, events int) {
	f.t.Helper()
	f.exec(`INSERT INTO mirror_jobs (job_id, org, type, status, attempt, result, error, updated_at)
VALUES ($1, $2, 'sync_catalog', 'COMPLETED', 1, '{"ok": true}', NULL, $3)`, id, org, at)
	if events > 0 {
		f.exec(`INSERT INTO mirror_job_events (job_id, attempt, kind, data, at)
SELECT $1, 1, 'progress', jsonb_build_object('n', n), $2::timestamptz + n * interval '1 millisecond'
  FROM generate_series(1, $3) AS n`, id, at, events)
	}
}

// snapshot is every row of the tables the API could write, as text.
func (f *fixture) snapshot() string {
	f.t.Helper()
	var out string
	for _, table := range []string{"leases", "lease_events", "mirror_jobs", "mirror_job_events", "subagents", "subagent_messages"} {
		var rows string
		err := f.pool.QueryRow(context.Background(),
			fmt.Sprintf(`SELECT coalesce(json_agg(t ORDER BY t::text)::text, '[]') FROM %s t`, table)).Scan(&rows)
		if err != nil {
			f.t.Fatal(err)
		}
		out += table + ": " + rows + "\n"
	}
	return out
}

func (f *fixture) now() time.Time {
	f.t.Helper()
	var now time.Time
	if err := f.pool.QueryRow(context.Background(), `SELECT now()`).Scan(&now); err != nil {
		f.t.Fatal(err)
	}
	return now
}
