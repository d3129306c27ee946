package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/assertion"
	"hermeshost/control"
	"hermeshost/dashboards"
	"hermeshost/dispatch"
	"hermeshost/dispatch/runtime"
	"hermeshost/gateway"
	"hermeshost/internal/unitnet"
	"hermeshost/lease"
	"hermeshost/service"
	"hermeshost/subagent"
)

const (
	dashSecret    = "dashboard-secret-for-the-tests"
	controlSecret = service.Secret("control-secret-for-the-tests")
)

// dashFixture is a fixture whose dispatcher serves dashboard requests: a store on a
// channel of the test's own, a real control API, and a short check interval.
type dashFixture struct {
	*fixture
	store *dashboards.Store
	reg   *prometheus.Registry
}

func newDashFixture(t *testing.T) *dashFixture {
	t.Helper()
	f := newFixture(t, true)
	store := dashboards.New(f.db, dashboards.Options{Channel: randomName("hermes_dashboards_test_")})
	t.Cleanup(store.Close)
	leases := lease.New(f.db, lease.Options{})
	t.Cleanup(leases.Close)
	subs := subagent.New(f.db, subagent.Options{})
	t.Cleanup(subs.Close)
	ctl, err := control.NewServer(control.Config{DB: f.db, Leases: leases, Subagents: subs, Secret: controlSecret})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ctl.Handler())
	t.Cleanup(srv.Close)
	reg := prometheus.NewRegistry()
	f.cfg.Registerer = reg
	f.cfg.Dashboards, f.cfg.DashboardSecret, f.cfg.DashboardCheck = store, dashSecret, 100*time.Millisecond
	f.cfg.ControlURL = srv.URL
	f.cfg.ControlKey = func(org string) (string, error) { return control.Key(controlSecret, org) }
	return &dashFixture{fixture: f, store: store, reg: reg}
}

// secretsOf are the values org's dashboard is handed, which must appear nowhere else.
func (f *dashFixture) secretsOf(t *testing.T, org string) map[string]string {
	t.Helper()
	ck, err1 := control.Key(controlSecret, org)
	gk, err2 := gateway.OrgKey(string(f.cfg.GatewaySecret), org)
	ak, err3 := assertion.OrgKey(dashSecret, org)
	if err := errors.Join(err1, err2, err3); err != nil {
		t.Fatal(err)
	}
	return map[string]string{"CONTROL_KEY": ck, "GATEWAY_KEY": gk, "DASHBOARD_ASSERTION_KEY": ak}
}

// serve runs d's dashboard loop until the returned stop is called (or the test ends).
func serve(t *testing.T, d *dispatch.Dispatcher) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.RunDashboards(ctx)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

func (f *dashFixture) row(t *testing.T, org string) dashboards.Dashboard {
	t.Helper()
	r, err := f.store.Get(context.Background(), org)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (f *dashFixture) request(t *testing.T, org string) {
	t.Helper()
	if _, err := f.store.Request(context.Background(), org, "ada"); err != nil {
		t.Fatal(err)
	}
}

// waitState waits for org's row to reach state and returns it.
func (f *dashFixture) waitState(t *testing.T, org string, state dashboards.State, within time.Duration) dashboards.Dashboard {
	t.Helper()
	var r dashboards.Dashboard
	deadline := time.Now().Add(within)
	for {
		got, err := f.store.Get(context.Background(), org)
		if err == nil && got.State == state {
			return got
		}
		r = got
		if time.Now().After(deadline) {
			t.Fatalf("after %s the dashboard of %s is %+v (%v), want %s\n%s", within, org, r, err, state, f.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metric is the value of the counter name with the given label pairs in f's registry.
func (f *dashFixture) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func (f *dashFixture) stopped(t *testing.T, reason string) float64 {
	t.Helper()
	return f.metric(t, "hermes_dashboards_stopped_total", "reason", reason)
}

// logged says some line of f's log has msg and every key=value of attrs.
func (f *dashFixture) logged(msg string, attrs ...string) bool {
	for line := range strings.SplitSeq(f.logs.String(), "\n") {
		if !strings.Contains(line, `"msg":"`+msg+`"`) {
			continue
		}
		all := true
		for i := 0; i+1 < len(attrs); i += 2 {
			all = all && strings.Contains(line, `"`+attrs[i]+`":"`+attrs[i+1]+`"`)
		}
		if all {
			return true
		}
	}
	return false
}

// healthz asks the dashboard recorded at url (its unix: socket) for /healthz.
func healthz(url string) (int, error) {
	sock, ok := unitnet.SocketPath(url)
	if !ok {
		return 0, fmt.Errorf("%q is not a unix: socket", url)
	}
	resp, err := unitnet.HTTPClient(sock, 2*time.Second).Get("http://dashboard/healthz")
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// dashboardUnit is org's dashboard unit as rt lists it (running or not), ok false when none.
func dashboardUnit(t *testing.T, rt runtime.Runtime, org string) (runtime.Unit, bool) {
	t.Helper()
	units, err := rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range units {
		if u.Org == org && u.Role == runtime.RoleDashboard {
			return u, true
		}
	}
	return runtime.Unit{}, false
}

// dashboardURL is where a dashboard is recorded: its socket in its org's folder under
// the runtime's RUN_ROOT.
var dashboardURL = regexp.MustCompile(`^unix:/.+/run/dashboards/([a-z0-9-]+)/dashboard\.sock$`)

// An operator's request reaches the dispatcher, which starts the org's dashboard with its
// keys on stdin only, records where it answers, owns the org for it, and keeps the org
// while it runs.
func TestARequestedDashboardIsStartedAndRecordedRunning(t *testing.T) {
	f := newDashFixture(t)
	f.cfg.ClaimEnabled = true
	f.cfg.OrgIdle = time.Millisecond
	d := f.dispatcher(t)
	serve(t, d)
	const org = "initech" // not a demo org: no job of its ever ran, so it has no home yet
	f.request(t, org)
	r := f.waitState(t, org, dashboards.Running, 40*time.Second)
	m := dashboardURL.FindStringSubmatch(r.URL)
	if m == nil || m[1] != org || r.Instance != f.cfg.Instance || r.StartedAt == nil || r.LastSeenAt == nil || r.Error != "" {
		t.Fatalf("running row = %+v", r)
	}
	if code, err := healthz(r.URL); err != nil || code != http.StatusOK {
		t.Fatalf("GET %s/healthz = %d, %v", r.URL, code, err)
	}
	if _, err := os.Stat(filepath.Join(f.cfg.OrgsRoot, org, "SOUL.md")); err != nil {
		t.Fatalf("no SOUL.md ensured before the dashboard started: %v", err)
	}
	if owned := d.Owned(); len(owned) != 1 || owned[0] != org {
		t.Fatalf("owned orgs = %v, want the dashboard's", owned)
	}

	// Its keys went on stdin: not in its arguments, not in its environment, not in a log.
	unit, ok := dashboardUnit(t, f.cfg.Runtime, org)
	if !ok || !unit.Running {
		t.Fatalf("dashboard unit = %+v, %v", unit, ok)
	}
	cmdline, err := os.ReadFile("/proc/" + unit.ID + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	environ, err := os.ReadFile("/proc/" + unit.ID + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if i := slices.Index(args, "--"); i >= 0 {
		// The unit is bubblewrap: the dashboard's own command line follows its last "--".
		for i >= 0 {
			args = args[i+1:]
			i = slices.Index(args, "--")
		}
	}
	// It serves on its socket as its unit sees it (the sandbox binds the folder at
	// unitnet.DashboardDir).
	listen, reach := f.cfg.Runtime.DashboardAddr(org)
	if reach != r.URL || listen != "unix:"+unitnet.DashboardDir+"/dashboard.sock" {
		t.Errorf("dashboard addresses %q and %q, recorded %q", listen, reach, r.URL)
	}
	if want := []string{"dashboard", "--org", org, "--addr", listen}; strings.Join(args[1:], " ") != strings.Join(want, " ") {
		t.Fatalf("dashboard arguments %q, want %q", args[1:], want)
	}
	logs := f.logs.String()
	for name, v := range f.secretsOf(t, org) {
		if strings.Contains(string(cmdline), v) || strings.Contains(string(environ), v) || strings.Contains(logs, v) {
			t.Errorf("%s of %s is in the dashboard's arguments, its environment or the log", name, org)
		}
	}
	if !f.logged("dashboard running", "org", org, "url", r.URL) {
		t.Errorf("the start is not logged with its org:\n%s", logs)
	}
	if n := f.metric(t, "hermes_dashboards_started_total"); n != 1 {
		t.Errorf("hermes_dashboards_started_total = %v", n)
	}

	// A cycle with nothing to do gives up idle orgs, but not one whose dashboard runs here.
	if _, err := f.backend.DB.Exec(context.Background(), `TRUNCATE agent_jobs CASCADE`); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Cycle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if owned := d.Owned(); len(owned) != 1 {
		t.Fatalf("after an idle cycle the dispatcher owns %v; the org with a running dashboard was given up", owned)
	}
	// The launcher could not reach it: it is started anew (a fresh process) and recorded.
	if err := f.store.Unreachable(context.Background(), org, r.URL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 40*time.Second, "the unreachable dashboard to be started anew", func() bool {
		now, err := f.store.Get(context.Background(), org)
		u, ok := dashboardUnit(t, f.cfg.Runtime, org)
		return err == nil && now.State == dashboards.Running && ok && u.Running && u.ID != unit.ID
	})
	if n := f.metric(t, "hermes_dashboards_started_total"); n != 2 {
		t.Errorf("hermes_dashboards_started_total = %v after the restart", n)
	}
}

// A dashboard unused past DASHBOARD_IDLE_TIMEOUT is stopped and recorded stopped; while the
// launcher keeps marking it seen, it runs on. Once stopped, its org may be given up.
func TestAnIdleDashboardIsStopped(t *testing.T) {
	f := newDashFixture(t)
	f.cfg.DashboardIdle = 2 * time.Second
	d := f.dispatcher(t)
	serve(t, d)
	f.request(t, "acme")
	f.waitState(t, "acme", dashboards.Running, 40*time.Second)
	used := time.Now()
	for time.Since(used) < 4*time.Second {
		if err := f.store.Seen(context.Background(), "acme"); err != nil {
			t.Fatal(err)
		}
		if r := f.row(t, "acme"); r.State != dashboards.Running {
			t.Fatalf("a dashboard in use was stopped: %+v", r)
		}
		time.Sleep(200 * time.Millisecond)
	}
	r := f.waitState(t, "acme", dashboards.Stopped, 10*time.Second)
	if r.URL != "" {
		t.Fatalf("stopped row = %+v", r)
	}
	// The row is stopped first (no request is sent to the unit any more), then the unit,
	// then the stop is counted and logged: wait for the count.
	waitFor(t, 10*time.Second, "the idle stop to be counted", func() bool { return f.stopped(t, "idle") >= 1 })
	if u, ok := dashboardUnit(t, f.cfg.Runtime, "acme"); ok {
		t.Fatalf("the idle dashboard's unit is still there: %+v", u)
	}
	if n := f.stopped(t, "idle"); n != 1 {
		t.Fatalf("hermes_dashboards_stopped_total{reason=idle} = %v", n)
	}
	if !f.logged("dashboard stopped", "org", "acme", "reason", "idle") {
		t.Fatalf("the idle stop is not logged with its org and reason:\n%s", f.logs.String())
	}
}

// A dashboard whose process died is recorded stopped, and the next request starts it again.
func TestAKilledDashboardIsRecordedStoppedAndStartsAgainOnRequest(t *testing.T) {
	f := newDashFixture(t)
	d := f.dispatcher(t)
	serve(t, d)
	f.request(t, "acme")
	f.waitState(t, "acme", dashboards.Running, 40*time.Second)
	unit, _ := dashboardUnit(t, f.cfg.Runtime, "acme")
	pid, err := strconv.Atoi(unit.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r := f.waitState(t, "acme", dashboards.Stopped, 10*time.Second)
	if r.URL != "" || r.Instance != f.cfg.Instance {
		t.Fatalf("row of the killed dashboard = %+v", r)
	}
	if n := f.stopped(t, "died"); n != 1 {
		t.Fatalf("hermes_dashboards_stopped_total{reason=died} = %v", n)
	}
	f.request(t, "acme")
	r = f.waitState(t, "acme", dashboards.Running, 40*time.Second)
	if code, err := healthz(r.URL); err != nil || code != http.StatusOK {
		t.Fatalf("the restarted dashboard's /healthz = %d, %v", code, err)
	}
}

// A request for an org another replica owns is that replica's to serve; once the org is
// free, this dispatcher takes it.
func TestARequestForAnOrgAnotherReplicaOwnsIsLeftToIt(t *testing.T) {
	f := newDashFixture(t)
	ctx := context.Background()
	other, err := f.leases(t).TryAcquire(ctx, "org:acme", "dispatcher/other/1-abcdef", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	d := f.dispatcher(t)
	serve(t, d)
	f.request(t, "acme")
	time.Sleep(time.Second) // ten checks
	if r := f.row(t, "acme"); r.State != dashboards.Requested || r.Instance != "" {
		t.Fatalf("the other replica's org's request = %+v, want it left requested", r)
	}
	if u, ok := dashboardUnit(t, f.cfg.Runtime, "acme"); ok {
		t.Fatalf("a dashboard unit was started for the other replica's org: %+v", u)
	}
	if len(d.Owned()) != 0 {
		t.Fatalf("owned = %v", d.Owned())
	}
	if err := f.leases(t).Release(ctx, other); err != nil {
		t.Fatal(err)
	}
	f.waitState(t, "acme", dashboards.Running, 40*time.Second)
}

// stubDashboard is a program in its own bin dir that stands for `hermes-host dashboard` and
// exits at once (as one whose port was taken would), after saving its arguments and its
// standard input.
func stubDashboard(t *testing.T, f *dashFixture) (dir string) {
	t.Helper()
	dir = t.TempDir()
	script := "#!/bin/sh\nd=$(dirname \"$0\")\necho \"$@\" >> \"$d/args\"\ncat > \"$d/stdin.$$\"\nexit 3\n"
	if err := os.WriteFile(filepath.Join(dir, "hermes-host"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	rt, err := runtime.NewProcess(runtime.Config{
		Instance: f.cfg.Instance, OrgsRoot: f.cfg.OrgsRoot, WorkspacesRoot: filepath.Join(t.TempDir(), "workspaces"),
		WorkerIdle: []string{"hermes-host", "worker", "idle"}, BinDir: dir, Output: io.Discard, Logger: slog.New(slog.DiscardHandler),
		// The stub writes beside itself, which a sandbox shows read-only; this test is
		// about retries, not containment.
		Sandbox: runtime.Sandbox{Mode: runtime.SandboxNone},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	f.cfg.Runtime = rt
	return dir
}

// A dashboard that exits before it answers is tried once more, then
// recorded failed with a reason the operator can read; it was handed exactly its five
// KEY=VALUE lines on stdin, and none in its arguments.
func TestADashboardThatExitsIsTriedAgainThenFailed(t *testing.T) {
	f := newDashFixture(t)
	dir := stubDashboard(t, f)
	d := f.dispatcher(t)
	serve(t, d)
	f.request(t, "acme")
	r := f.waitState(t, "acme", dashboards.Failed, 20*time.Second)
	if !strings.Contains(r.Error, "exited before it answered") || !strings.Contains(r.Error, "try 2 of 2") || r.URL != "" {
		t.Fatalf("failed row = %+v", r)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "args"))
	if err != nil {
		t.Fatal(err)
	}
	tries := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(tries) != 2 {
		t.Fatalf("the dashboard was started %d times: %q", len(tries), tries)
	}
	// Unsandboxed, the dashboard serves at its socket's host path.
	argsRe := regexp.MustCompile(`^dashboard --org acme --addr unix:/.+/run/dashboards/acme/dashboard\.sock$`)
	for _, a := range tries {
		if !argsRe.MatchString(a) {
			t.Errorf("dashboard arguments %q", a)
		}
	}
	stdins, _ := filepath.Glob(filepath.Join(dir, "stdin.*"))
	if len(stdins) != 2 {
		t.Fatalf("stdin saved by %d starts", len(stdins))
	}
	secrets := f.secretsOf(t, "acme")
	want := fmt.Sprintf("CONTROL_URL=%s\nCONTROL_KEY=%s\nGATEWAY_URL=%s\nGATEWAY_KEY=%s\nDASHBOARD_ASSERTION_KEY=%s\n",
		f.cfg.ControlURL, secrets["CONTROL_KEY"], f.cfg.GatewayURL, secrets["GATEWAY_KEY"], secrets["DASHBOARD_ASSERTION_KEY"])
	for _, p := range stdins {
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("the dashboard's stdin is not its five KEY=VALUE lines:\n%s", got)
		}
	}
	logs := f.logs.String()
	for name, v := range secrets {
		if strings.Contains(logs, v) || strings.Contains(r.Error, v) || strings.Contains(string(raw), v) {
			t.Errorf("%s is in the log, the recorded reason or the arguments", name)
		}
	}
	if !f.logged("dashboard failed", "org", "acme") {
		t.Errorf("the failure is not logged:\n%s", logs)
	}
	if n := f.metric(t, "hermes_dashboards_start_failures_total"); n != 1 {
		t.Errorf("hermes_dashboards_start_failures_total = %v", n)
	}
	// The next request tries again.
	f.request(t, "acme")
	f.waitState(t, "acme", dashboards.Failed, 20*time.Second)
	if raw, _ := os.ReadFile(filepath.Join(dir, "args")); strings.Count(string(raw), "\n") != 4 {
		t.Fatalf("after a second request the dashboard was started %d times in all, want 4", strings.Count(string(raw), "\n"))
	}
}

// Without DASHBOARD_SECRET a dispatcher starts nothing and says so once; the request waits.
func TestWithoutTheDashboardSecretRequestsAreLeftAlone(t *testing.T) {
	f := newDashFixture(t)
	f.cfg.DashboardSecret = ""
	d := f.dispatcher(t)
	serve(t, d)
	f.request(t, "acme")
	time.Sleep(time.Second)
	if r := f.row(t, "acme"); r.State != dashboards.Requested {
		t.Fatalf("row = %+v, want it left requested", r)
	}
	if n := strings.Count(f.logs.String(), "dashboards cannot be started here"); n != 1 {
		t.Fatalf("%d lines say dashboards cannot be started, want one:\n%s", n, f.logs.String())
	}
}

// The process runtime's dashboards die with the dispatcher: when RunDashboards ends they are
// stopped and recorded stopped, KeepDashboards or not.
func TestAStoppingDispatcherRecordsItsProcessDashboardsStopped(t *testing.T) {
	f := newDashFixture(t)
	f.cfg.KeepDashboards = true
	d := f.dispatcher(t)
	stop := serve(t, d)
	f.request(t, "acme")
	f.waitState(t, "acme", dashboards.Running, 40*time.Second)
	stop()
	if r := f.row(t, "acme"); r.State != dashboards.Stopped {
		t.Fatalf("after RunDashboards returned the row is %+v", r)
	}
	if u, ok := dashboardUnit(t, f.cfg.Runtime, "acme"); ok {
		t.Fatalf("the dashboard unit outlived the loop: %+v", u)
	}
	if n := f.stopped(t, "shutdown"); n != 1 {
		t.Fatalf("hermes_dashboards_stopped_total{reason=shutdown} = %v", n)
	}
}

// On Docker, a dashboard runs in its own labelled container with no secret in its
// configuration; a production dispatcher (KeepDashboards) leaves it running, and its next
// start adopts it; one that keeps nothing stops it.
func TestDockerDashboardIsStartedKeptAndAdopted(t *testing.T) {
	f := newDashFixture(t)
	dr := useDocker(t, f.fixture)
	org := randomName("dash-e2e-")
	f.cfg.KeepDashboards = true
	d := f.dispatcher(t)
	stop := serve(t, d)
	f.request(t, org)
	r := f.waitState(t, org, dashboards.Running, 60*time.Second)
	if code, err := healthz(r.URL); err != nil || code != http.StatusOK {
		t.Fatalf("GET %s/healthz = %d, %v", r.URL, code, err)
	}
	name := runtime.UnitName(org, runtime.RoleDashboard)
	info, err := dr.engine.ContainerInspect(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Labels[runtime.LabelRole] != string(runtime.RoleDashboard) || info.Config.Labels[runtime.LabelOrg] != org || !info.State.Running {
		t.Fatalf("container %s: labels %v, running %v", name, info.Config.Labels, info.State.Running)
	}
	config := strings.Join(info.Config.Cmd, " ") + " " + strings.Join(info.Config.Env, " ")
	for key, v := range f.secretsOf(t, org) {
		if strings.Contains(config, v) || strings.Contains(f.logs.String(), v) {
			t.Errorf("%s is in the container's configuration or the log", key)
		}
	}
	stop()
	if now := f.row(t, org); now.State != dashboards.Running || now.URL != r.URL {
		t.Fatalf("after a production dispatcher stopped, the row is %+v, want it running for adoption", now)
	}
	if info, err := dr.engine.ContainerInspect(context.Background(), name); err != nil || !info.State.Running {
		t.Fatalf("the kept container: %v", err)
	}

	// As a real stop does, the first dispatcher gives its org leases up.
	d.Shutdown(time.Second, time.Second)
	f.cfg.KeepDashboards, f.cfg.Registerer = false, nil
	last := f.dispatcher(t)
	stop = serve(t, last)
	waitFor(t, 10*time.Second, "the kept dashboard to be adopted", func() bool {
		return f.logged("dashboard adopted", "org", org) && len(last.Owned()) == 1
	})
	if now := f.row(t, org); now.State != dashboards.Running || now.URL != r.URL {
		t.Fatalf("the adopted dashboard's row is %+v", now)
	}
	stop()
	if now := f.row(t, org); now.State != dashboards.Stopped {
		t.Fatalf("after a dispatcher that keeps nothing stopped, the row is %+v", now)
	}
	waited, errs := dr.engine.ContainerWait(context.Background(), name, container.WaitConditionRemoved)
	select {
	case <-waited:
	case err := <-errs:
		if !strings.Contains(err.Error(), "No such container") {
			t.Fatalf("wait for %s to go: %v", name, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s is still there", name)
	}
}
