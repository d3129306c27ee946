package dispatch_test

import (
	"context"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"

	"hermeshost/assertion"
	"hermeshost/dashboards"
	"hermeshost/dispatch"
	"hermeshost/dispatch/runtime"
	"hermeshost/internal/unitnet"
)

// A dashboard's chat turn runs its agent inside the dashboard's unit, as the unit's uid.
// What that agent detaches (setsid, so out of the process group a stop kills) must end
// with its turn, as a job's leftovers end with the job: the dashboard, its unit's main
// process, sweeps the unit once the agent has exited and before the turn's home: lease
// is free, and goes on serving.

// leftoverAgent writes, as org's agent, a shell script that detaches marker (a sleep of a
// number of seconds no other process uses), waits until it runs, notes in
// chat-reached.log of its home how many it saw, and answers. The script's own look must
// not carry the marker on its command line, or it would count itself.
func leftoverAgent(t *testing.T, f *dashFixture, org string) (marker string) {
	t.Helper()
	marker = fmt.Sprintf("sleep %d", 600000+mrand.IntN(400000))
	pattern := strings.Replace(marker, "sleep", "slee[p]", 1)
	script := `#!/bin/sh
setsid sh -c "trap '' HUP; exec ` + marker + `" >/dev/null 2>&1 </dev/null &
for i in 1 2 3 4 5 6 7 8 9 10; do
	n=$(for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <"$f"; echo; done 2>/dev/null | grep -c "^` + pattern + `")
	[ "$n" -gt 0 ] && break
	sleep 1
done
echo "detached=$n" >"$HERMES_HOME/chat-reached.log"
echo "I left one running."
`
	dir := filepath.Join(f.cfg.OrgsRoot, org)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "agent"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return marker
}

// chatTurn sends message to the dashboard at dashURL (its socket) as the launcher would,
// with an assertion for operator ada, and waits for the turn's end: its state, answer and
// reason as the turn's page shows them.
func chatTurn(t *testing.T, dashURL, org, message string) (state, answer, reason string) {
	t.Helper()
	sock, ok := unitnet.SocketPath(dashURL)
	if !ok {
		t.Fatalf("%q is not a unix: socket", dashURL)
	}
	hc := unitnet.HTTPClient(sock, 10*time.Second)
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	signer, err := assertion.NewSigner(dashSecret, nil)
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, path string, form url.Values) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, "http://dashboard"+path, strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		tok, err := signer.Sign("ada", org)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(assertion.Header, tok)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := do(http.MethodPost, "/orgs/"+org+"/chat", url.Values{"message": {message}})
	resp.Body.Close()
	turn := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(turn, "/orgs/"+org+"/chat/turns/") {
		t.Fatalf("the chat's POST answered %d to %q", resp.StatusCode, turn)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp := do(http.MethodGet, turn, nil)
		doc, err := goquery.NewDocumentFromReader(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d, %v", turn, resp.StatusCode, err)
		}
		text := func(id string) string {
			return strings.TrimSpace(doc.Find(`[data-testid="` + id + `"]`).Text())
		}
		state, answer, reason = text("chat-state"), text("chat-answer"), text("chat-reason")
		if answer != "" || strings.Contains(state, "failed") || strings.Contains(state, "stopped") {
			return state, answer, reason
		}
		if time.Now().After(deadline) {
			t.Fatalf("the turn %s is still %q after 90s", turn, state)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkChatLeftoversEnd runs a turn of leftoverAgent's on org's dashboard; running counts
// the processes that carry the marker where the unit runs.
func checkChatLeftoversEnd(t *testing.T, f *dashFixture, d *dispatch.Dispatcher, org, marker string, running func() int) {
	t.Helper()
	r := f.waitState(t, org, dashboards.Running, 90*time.Second)
	state, answer, reason := chatTurn(t, r.URL, org, "Leave something running")
	if answer != "I left one running." {
		t.Fatalf("the turn ended %q (%s) with answer %q\n%s", state, reason, answer, f.logs.String())
	}
	reached, err := os.ReadFile(filepath.Join(f.cfg.OrgsRoot, org, "chat-reached.log"))
	if err != nil || string(reached) != "detached=1\n" {
		t.Fatalf("the agent saw its detached process as %q (%v), want detached=1", reached, err)
	}
	if n := running(); n != 0 {
		t.Fatalf("%d processes the turn's agent detached outlived the turn", n)
	}
	if code, err := healthz(r.URL); err != nil || code != http.StatusOK {
		t.Fatalf("after its sweep the dashboard answers /healthz %d, %v", code, err)
	}
	metrics := getMetrics(t, r.URL)
	for _, want := range []string{`hermes_chat_sweeps_total{result="killed"} 1`, "hermes_chat_swept_processes_total 1"} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("the dashboard's /metrics lacks %q:\n%s", want, metrics)
		}
	}
	// The same counters reach Prometheus through the dispatcher's /metrics/dashboards,
	// labelled with their org.
	rec := httptest.NewRecorder()
	d.DashboardMetrics().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics/dashboards", nil))
	gathered := rec.Body.String()
	for _, want := range []string{
		fmt.Sprintf(`hermes_chat_sweeps_total{org=%q,result="killed"} 1`, org),
		fmt.Sprintf(`hermes_chat_swept_processes_total{org=%q} 1`, org),
		fmt.Sprintf(`hermes_dashboard_scrape_up{org=%q} 1`, org),
	} {
		if !strings.Contains(gathered, want+"\n") {
			t.Errorf("the dispatcher's /metrics/dashboards lacks %q:\n%s", want, gathered)
		}
	}
}

// getMetrics is the /metrics of the dashboard at dashURL.
func getMetrics(t *testing.T, dashURL string) string {
	t.Helper()
	sock, _ := unitnet.SocketPath(dashURL)
	resp, err := unitnet.HTTPClient(sock, 10*time.Second).Get("http://dashboard/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

func TestDockerChatTurnsLeftoversEndWithTheTurn(t *testing.T) {
	f := newDashFixture(t)
	dr := useDockerWith(t, f.fixture, dockerOptions{shell: true})
	org := randomName("chat-sweep-")
	marker := leftoverAgent(t, f, org)
	f.cfg.DashboardEnv = append(f.cfg.DashboardEnv, "HERMES_BIN="+dockerAgentBin)
	d := f.dispatcher(t)
	serve(t, d)
	f.request(t, org)
	checkChatLeftoversEnd(t, f, d, org, marker, func() int {
		info, err := dr.engine.ContainerInspect(context.Background(), runtime.UnitName(org, runtime.RoleDashboard))
		if err != nil || !info.State.Running {
			t.Fatalf("the dashboard's container: %v", err)
		}
		return strings.Count(topOf(t, dr, info.ID), marker)
	})
}

func TestSandboxedChatTurnsLeftoversEndWithTheTurn(t *testing.T) {
	f := newDashFixture(t)
	useSandboxedLimits(t, f.fixture, runtime.Limits{})
	org := randomName("chat-sweep-")
	marker := leftoverAgent(t, f, org)
	f.cfg.DashboardEnv = append(f.cfg.DashboardEnv, "HERMES_BIN="+filepath.Join(f.cfg.OrgsRoot, org, "agent"))
	d := f.dispatcher(t)
	serve(t, d)
	f.request(t, org)
	checkChatLeftoversEnd(t, f, d, org, marker, func() int { return hostProcessesWith(t, marker) })
}
