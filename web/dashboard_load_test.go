package web_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"hermeshost/assertion"
	"hermeshost/internal/wrk"
	"hermeshost/orghome/hermesstate"
)

// TestDashboardUnderLoad measures, with wrk in a process of its own, the sessions page of a
// home with 10,000 sessions and the transcript of a 2,000-message session: through the
// launcher's proxy, served by the dashboard directly, and /healthz beside them. It asserts
// only that every request succeeded; its figures are the README's. `make bench-dashboard`
// runs it (HERMES_BENCH_WRK=1).
func TestDashboardUnderLoad(t *testing.T) {
	if os.Getenv("HERMES_BENCH_WRK") == "" {
		t.Skip("a load measurement, not a test: make bench-dashboard runs it (HERMES_BENCH_WRK=1)")
	}
	if err := wrk.Available(); err != nil {
		t.Fatal(err)
	}
	home := newOrgHome(t, t.TempDir(), "acme", 22)
	long := loadFixture(t, home)
	p := newProxiedHome(t, dashSecret, home)
	p.running("acme", p.dash.srv.URL)

	// The operator's login cookie, as a browser would send it through the proxy.
	ada := p.browser("ada")
	cookie := ada.GET("/orgs/acme/sessions").Expect().Status(http.StatusOK).Raw().Request.Header.Get("Cookie")
	if cookie == "" {
		t.Fatal("no login cookie to load the proxy with")
	}
	signer, _ := assertion.NewSigner(dashSecret, nil)
	direct := func() map[string]string {
		tok, err := signer.Sign("ada", "acme")
		if err != nil {
			t.Fatal(err)
		}
		return map[string]string{assertion.Header: tok}
	}
	viaProxy := map[string]string{"Cookie": cookie}
	dashURL, proxyURL := p.dash.srv.URL+"/orgs/acme", p.srv.URL+"/orgs/acme"
	cases := []struct {
		name        string
		url         string
		headers     func() map[string]string
		connections int
	}{
		{"launcher /healthz", p.srv.URL + "/healthz", nil, 100},
		{"dashboard /healthz", p.dash.srv.URL + "/healthz", nil, 100},
		{"sessions page, dashboard directly", dashURL + "/sessions", direct, 100},
		{"sessions page, through the proxy", proxyURL + "/sessions", func() map[string]string { return viaProxy }, 100},
		{"transcript (2,000), directly", dashURL + "/sessions/" + long, direct, 100},
		{"transcript (2,000), through the proxy", proxyURL + "/sessions/" + long, func() map[string]string { return viaProxy }, 100},
		// The proxy's own cost where the two cores are not saturated by the load itself.
		{"sessions page, directly", dashURL + "/sessions", direct, 4},
		{"sessions page, through the proxy", proxyURL + "/sessions", func() map[string]string { return viaProxy }, 4},
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| page (wrk, 10 s) | connections | req/s | p50 | p99 |\n|---|---|---|---|---|\n")
	for _, c := range cases {
		var headers map[string]string
		if c.headers != nil {
			headers = c.headers() // an assertion is good for a minute: signed for each run
		}
		r, err := wrk.Run(context.Background(), c.url, wrk.Load{Connections: c.connections, Threads: 2, Duration: 10 * time.Second, Headers: headers})
		if err != nil {
			t.Fatal(err)
		}
		if r.Non2xx != 0 || r.SocketErrors != "" {
			t.Fatalf("%s: %d non-2xx answers, %s\n%s", c.name, r.Non2xx, r.SocketErrors, r.Output)
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f | %s | %s |\n", c.name, c.connections, r.PerSecond, r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond))
	}
	t.Logf("figures:\n%s", b.String())
}

// loadFixture is 10,000 sessions and one of 2,000 messages (tool calls among them), in the
// pinned release's shape; it returns the long session's id.
func loadFixture(t *testing.T, h *orgHome) string {
	t.Helper()
	ctx := context.Background()
	tx, err := h.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := float64(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Unix())
	for i := range 10_000 {
		s := hermesstate.Session{ID: fmt.Sprintf("20260101_%06d_%06x", i, i), Source: "tool", Model: "demo-worker",
			StartedAt: base + float64(i*37), MessageCount: 4, InputTokens: int64(100 + i), OutputTokens: 50}
		if i%4 == 0 {
			s.Source, s.Title = "cli", fmt.Sprintf("Session %d", i)
		}
		if err := hermesstate.InsertSession(ctx, tx, s); err != nil {
			t.Fatal(err)
		}
	}
	long := "20260101_999999_ffffff"
	if err := hermesstate.InsertSession(ctx, tx, hermesstate.Session{ID: long, Source: "tool", Model: "demo-worker", StartedAt: base - 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 2_000 {
		m := hermesstate.Message{SessionID: long, Timestamp: base + float64(i)}
		switch i % 4 {
		case 0:
			m.Role, m.Content = "user", fmt.Sprintf("Step %d: read the catalogue and propose what is missing.", i)
		case 1:
			m.Role, m.ToolCalls = "assistant", []hermesstate.ToolCall{{ID: fmt.Sprintf("call_%d", i), Name: "terminal", Arguments: `{"command": "sartiq call listProducts --path org=acme"}`}}
		case 2:
			m.Role, m.ToolName, m.ToolCallID, m.Content = "tool", "terminal", fmt.Sprintf("call_%d", i-1), strings.Repeat(`{"sku": "A-1", "name": "Widget"} `, 20)
		default:
			m.Role, m.Content = "assistant", strings.Repeat("The catalogue lists widgets in three colours. ", 10)
		}
		if err := hermesstate.InsertMessage(ctx, tx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return long
}
