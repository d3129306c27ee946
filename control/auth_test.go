package control

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gavv/httpexpect/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"hermeshost/gateway"
)

func TestRequestsWithoutAValidKeyAreRefusedAlike(t *testing.T) {
	f := newFixture(t)
	f.addJob(orgA, "job-a1", time.Now(), 1)
	keyA := f.key(orgA)
	macA := strings.TrimPrefix(keyA, "hck_acme_")
	gw, err := gateway.OrgKey(testSecret.Reveal(), orgA)
	if err != nil {
		t.Fatal(err)
	}
	otherSecret, _ := Key("another-secret", orgA)
	before := f.snapshot()
	cases := map[string]string{
		"no header":                "",
		"bearer without a key":     "Bearer ",
		"basic scheme":             "Basic " + keyA,
		"key without a scheme":     keyA,
		"another secret's key":     "Bearer " + otherSecret,
		"gateway key, same org":    "Bearer " + gw,
		"org B's name, A's MAC":    "Bearer hck_globex_" + macA,
		"truncated MAC":            "Bearer " + keyA[:len(keyA)-1],
		"trailing junk":            "Bearer " + keyA + "x",
		"no MAC":                   "Bearer hck_acme_",
		"invalid org in the key":   "Bearer hck_ACME_" + macA,
		"gateway prefix, same MAC": "Bearer hgw_acme_" + macA,
	}
	for name, auth := range cases {
		t.Run(name, func(t *testing.T) {
			e := f.bearer(auth)
			for _, r := range []*httpexpect.Response{
				e.GET("/v1/jobs").Expect(),
				e.GET("/v1/jobs/job-a1").Expect(),
				e.GET("/v1/leases/home:acme").Expect(),
				e.GET("/v1/leases").Expect(),
				e.POST("/v1/leases/acquire").WithJSON(map[string]any{"key": "home:acme", "holder": "w", "ttl_ms": 60000}).Expect(),
			} {
				r.Status(http.StatusUnauthorized).
					JSON().Object().IsEqual(map[string]string{"error": "unauthorized", "message": "missing or invalid control key"})
				if body := r.Body().Raw(); strings.Contains(body, macA) {
					t.Errorf("the answer echoes the key: %s", body)
				}
			}
		})
	}
	if after := f.snapshot(); after != before {
		t.Fatalf("a refused request wrote:\n%s\nthen\n%s", before, after)
	}
	if logs := f.logs.String(); strings.Contains(logs, macA) || strings.Contains(logs, otherSecret) {
		t.Fatalf("the logs hold a key:\n%s", logs)
	}
	if got := testutil.ToFloat64(f.server.requests.WithLabelValues("/v1/jobs", "401")); got != float64(len(cases)) {
		t.Fatalf("401s counted under /v1/jobs: %v", got)
	}
}

func TestRequestsAreCountedByRouteAndStatus(t *testing.T) {
	f := newFixture(t)
	a := f.as(orgA)
	a.GET("/v1/jobs").Expect().Status(http.StatusOK)
	a.GET("/v1/jobs").Expect().Status(http.StatusOK)
	a.GET("/v1/jobs/{id}", "nope").Expect().Status(http.StatusNotFound)
	a.GET("/v1/nowhere").Expect().Status(http.StatusNotFound)
	a.DELETE("/v1/leases/home:acme").Expect().Status(http.StatusMethodNotAllowed)
	for _, c := range []struct {
		route, code string
		want        float64
	}{
		{"/v1/jobs", "200", 2},
		{"/v1/jobs/{id}", "404", 1},
		{"unmatched", "404", 1},
	} {
		if got := testutil.ToFloat64(f.server.requests.WithLabelValues(c.route, c.code)); got != c.want {
			t.Errorf("%s %s: %v, want %v", c.route, c.code, got, c.want)
		}
	}
	if n, err := testutil.GatherAndCount(f.reg, "hermes_control_requests_total"); err != nil || n == 0 {
		t.Fatalf("the counter is not on the registerer: %d %v", n, err)
	}
}

func TestAPanicIsAPlain500(t *testing.T) {
	f := newFixture(t)
	h := f.server.count(f.server.recoverer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("boom")
	})))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/jobs", nil))
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), `"error":"internal"`) || strings.Contains(rec.Body.String(), "boom") {
		t.Fatalf("panic answer: %d %s", rec.Code, rec.Body)
	}
	if !strings.Contains(f.logs.String(), "boom") {
		t.Fatalf("the panic was not logged: %s", f.logs)
	}
}

func TestNewServerRefusesAnIncompleteConfig(t *testing.T) {
	f := newFixture(t)
	for name, cfg := range map[string]Config{
		"no database":   {Leases: f.leases, Subagents: f.subs, Secret: testSecret},
		"no leases":     {DB: f.pool, Subagents: f.subs, Secret: testSecret},
		"no subagents":  {DB: f.pool, Leases: f.leases, Secret: testSecret},
		"no secret":     {DB: f.pool, Leases: f.leases, Subagents: f.subs},
		"negative wait": {DB: f.pool, Leases: f.leases, Subagents: f.subs, Secret: testSecret, MaxWait: -time.Second},
	} {
		if _, err := NewServer(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
