package dispatch

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	"hermeshost/internal/unitnet"
)

// dashServing serves h on a unix socket, as a dashboard serves on its org's, and returns
// the unix: URL it is reached at.
func dashServing(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "d.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return unitnet.URL(path)
}

// What dashboards serve is gathered with their org on every series, whatever org label
// they claim; one that answers too slowly, too much, not at all or not in the text format
// is up 0, named to the log, and costs the others nothing.
func TestDashboardMetricsAreGatheredWithTheirOrgAndBounded(t *testing.T) {
	text := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/metrics" {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = w.Write([]byte(body))
		}
	}
	acme := text("# TYPE hermes_chat_sweeps_total counter\nhermes_chat_sweeps_total{result=\"killed\"} 2\n" +
		"# TYPE hermes_chat_swept_processes_total counter\nhermes_chat_swept_processes_total 3\n")
	// A hostile unit claims another org's label, and the scrape-up series, for itself.
	globex := text("# TYPE hermes_chat_sweeps_total counter\nhermes_chat_sweeps_total{org=\"acme\",result=\"clean\"} 7\n" +
		"# TYPE hermes_dashboard_scrape_up gauge\nhermes_dashboard_scrape_up{org=\"acme\"} 0\n")
	// One that gives a known family another type is left out of that family.
	initech := text("# TYPE hermes_chat_swept_processes_total gauge\nhermes_chat_swept_processes_total 9\n")
	var big strings.Builder
	big.WriteString("# TYPE hermes_flood gauge\n")
	for i := range dashScrapeSeries + 1 {
		fmt.Fprintf(&big, "hermes_flood{n=\"%d\"} 1\n", i)
	}
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	targets := []dashTarget{
		{"acme", dashServing(t, acme)},
		{"globex", dashServing(t, globex)},
		{"initech", dashServing(t, initech)},
		{"flood", dashServing(t, text(big.String()))},
		{"garbage", dashServing(t, text("this is { not metrics\n"))},
		{"broken", dashServing(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", http.StatusInternalServerError) })},
		{"hung", dashServing(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-hang:
			case <-r.Context().Done():
			}
		})},
		{"gone", unitnet.URL(filepath.Join(t.TempDir(), "none.sock"))},
	}
	failed := map[string]string{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	families := gatherDashboards(ctx, targets, func(org string, err error) { failed[org] += err.Error() + "; " })

	var out bytes.Buffer
	for _, mf := range families {
		if _, err := expfmt.MetricFamilyToText(&out, mf); err != nil {
			t.Fatal(err)
		}
	}
	got := out.String()
	for _, want := range []string{
		`hermes_chat_sweeps_total{org="acme",result="killed"} 2`,
		`hermes_chat_sweeps_total{org="globex",result="clean"} 7`,
		`hermes_chat_swept_processes_total{org="acme"} 3`,
		`hermes_dashboard_scrape_up{org="acme"} 1`,
		`hermes_dashboard_scrape_up{org="globex"} 1`,
		`hermes_dashboard_scrape_up{org="initech"} 1`,
		`hermes_dashboard_scrape_up{org="flood"} 0`,
		`hermes_dashboard_scrape_up{org="garbage"} 0`,
		`hermes_dashboard_scrape_up{org="broken"} 0`,
		`hermes_dashboard_scrape_up{org="hung"} 0`,
		`hermes_dashboard_scrape_up{org="gone"} 0`,
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("gathered metrics lack %q", want)
		}
	}
	for _, never := range []string{`hermes_chat_sweeps_total{org="acme",result="clean"}`, `hermes_dashboard_scrape_up{org="acme"} 0`,
		`hermes_chat_swept_processes_total{org="initech"}`, "hermes_flood"} {
		if strings.Contains(got, never) {
			t.Errorf("gathered metrics hold %q:\n%s", never, got)
		}
	}
	if n := strings.Count(got, "# TYPE hermes_chat_sweeps_total"); n != 1 {
		t.Errorf("hermes_chat_sweeps_total is %d families, want one", n)
	}
	for org, why := range map[string]string{"flood": "series", "garbage": "text format", "broken": "500", "hung": "deadline",
		"gone": "none.sock", "globex": "hermes_dashboard_scrape_up", "initech": "hermes_chat_swept_processes_total"} {
		if !strings.Contains(failed[org], why) {
			t.Errorf("failed[%s] = %q, want it to say %q", org, failed[org], why)
		}
	}
	if failed["acme"] != "" {
		t.Errorf("acme failed: %s", failed["acme"])
	}
}
