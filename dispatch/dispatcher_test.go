package dispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"hermeshost/internal/testio"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/dispatch"
	"hermeshost/dispatch/runtime"
	"hermeshost/gateway"
	"hermeshost/internal/egress"
	"hermeshost/internal/hosttest"
	"hermeshost/internal/unitnet"
	"hermeshost/pg/pgtest"
	"hermeshost/sartiq"
	"hermeshost/sartiq/backend"
	"hermeshost/sartiq/backend/backendtest"
	"hermeshost/scriptedagent"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hermes-dispatch-test")
	if err != nil {
		panic(err)
	}
	binDir = dir
	if err := hosttest.BuildBinaries(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := pgtest.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

type fixture struct {
	backend *backendtest.Backend
	db      *pgxpool.Pool
	logs    *testio.Buffer
	cfg     dispatch.Config
	// egress, when set before the runtime is made, is served to units as their egress.
	egress *egress.Proxy
}

func newFixture(t *testing.T, gatewayUp bool) *fixture {
	t.Helper()
	b := backendtest.Start(t, backend.Config{})
	bot, err := sartiq.New(b.URL, backendtest.BotToken)
	if err != nil {
		t.Fatal(err)
	}
	gatewayURL := hosttest.DemoGateway(t, "gw-secret", "host-key")
	if !gatewayUp {
		gatewayURL = "http://127.0.0.1:1" // nothing listens there
	}
	_, db := pgtest.Schema(t)
	root := t.TempDir()
	for _, org := range backend.DemoOrganizations {
		if err := os.MkdirAll(filepath.Join(root, "orgs", org), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	logs := &testio.Buffer{}
	f := &fixture{backend: b, db: db, logs: logs, cfg: dispatch.Config{
		Instance: "dispatch-test", Bot: bot, APIURL: b.URL, DB: db, OrgsRoot: filepath.Join(root, "orgs"),
		GatewayURL: gatewayURL, GatewayKey: "host-key", GatewaySecret: "gw-secret",
		WorkerModel: gateway.DemoWorkerModel, VisionModel: gateway.DemoVisionModel,
		WorkerEnv: []string{"HERMES_BIN=scripted-agent", "HEARTBEAT_INTERVAL=200ms"},
		Log:       slog.New(slog.NewJSONHandler(logs, nil)),
	}}
	f.useProcess(t)
	return f
}

// useProcess gives the fixture a process runtime whose units reach f.services. Sandboxed
// (where bubblewrap works), the units are off the host's network and reach the fixture's
// services through their sockets, as a product's do.
func (f *fixture) useProcess(t *testing.T) {
	t.Helper()
	rt, err := runtime.NewProcess(runtime.Config{
		Instance: "dispatch-test", OrgsRoot: f.cfg.OrgsRoot, WorkspacesRoot: filepath.Join(filepath.Dir(f.cfg.OrgsRoot), "workspaces"),
		WorkerIdle: []string{"hermes-host", "worker", "idle"}, BinDir: binDir, Output: io.Discard,
		Logger: slog.New(slog.DiscardHandler), Services: f.services(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	f.cfg.Runtime = rt
}

// services are what the fixture's units reach of the host, as a dispatcher serves them
// (dispatch.UnitServices): its backend, its gateway, and the control API at
// cfg.ControlURL once a test sets it.
func (f *fixture) services(t *testing.T) map[string]http.Handler {
	t.Helper()
	control := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.cfg.ControlURL == "" {
			http.Error(w, "no control API in this test", http.StatusServiceUnavailable)
			return
		}
		p, err := unitnet.Proxy(f.cfg.ControlURL)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		p.ServeHTTP(w, r)
	})
	var egress http.Handler
	if f.egress != nil {
		egress = f.egress
	}
	s, err := dispatch.UnitServices(f.cfg.APIURL, f.cfg.GatewayURL, control, egress)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// dispatcher is a new dispatcher on the fixture's settings, closed when the test ends.
func (f *fixture) dispatcher(t *testing.T) *dispatch.Dispatcher {
	d := dispatch.New(f.cfg)
	t.Cleanup(d.Close)
	return d
}

// statuses counts the backend's jobs by status.
func (f *fixture) statuses(t *testing.T) map[string]int {
	t.Helper()
	return f.jobsOf(t, "")
}

// jobsOf counts org's jobs at the backend by status; every org's when org is empty.
func (f *fixture) jobsOf(t *testing.T, org string) map[string]int {
	t.Helper()
	rows, err := f.backend.DB.Query(context.Background(), `SELECT status, count(*) FROM agent_jobs
		WHERE $1 = '' OR organization_id = $1 GROUP BY status`, org)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[s] = n
	}
	return out
}

func TestClaimDisabledClaimsNothing(t *testing.T) {
	f := newFixture(t, true)
	d := f.dispatcher(t)
	n, err := d.Cycle(context.Background())
	if err != nil || n != 0 {
		t.Fatalf("cycle: %d %v", n, err)
	}
	if st := f.statuses(t); st[sartiq.StatusQueued] != 4 || len(st) != 1 {
		t.Fatalf("backend jobs: %v", st)
	}
	if c := strings.Count(f.logs.String(), "CLAIM_ENABLED=false: would claim"); c != 4 {
		t.Fatalf("%d would-claim lines, want one per queued job:\n%s", c, f.logs.String())
	}
}

func TestGatewayDownMeansNoPollNoClaim(t *testing.T) {
	f := newFixture(t, false)
	f.cfg.ClaimEnabled = true
	d := f.dispatcher(t)
	if _, err := d.Cycle(context.Background()); err == nil || !strings.Contains(err.Error(), "gateway gate closed") {
		t.Fatalf("cycle with the gateway down: %v", err)
	}
	var listed int
	if err := f.backend.DB.QueryRow(context.Background(), `SELECT count(*) FROM agent_job_events WHERE kind = 'claim'`).Scan(&listed); err != nil {
		t.Fatal(err)
	}
	if st := f.statuses(t); st[sartiq.StatusQueued] != 4 || listed != 0 {
		t.Fatalf("jobs claimed with the gateway down: %v", st)
	}
	f2 := newFixture(t, true)
	f2.cfg.ClaimEnabled, f2.cfg.VisionModel = true, "no-such-vision-model"
	if _, err := f2.dispatcher(t).Cycle(context.Background()); err == nil || !strings.Contains(err.Error(), "no-such-vision-model") {
		t.Fatalf("cycle with a model missing: %v", err)
	}
	if st := f2.statuses(t); st[sartiq.StatusQueued] != 4 {
		t.Fatalf("jobs claimed with a model missing: %v", st)
	}
}

func TestDemoJobsFlowToCompletionOneAtATimePerOrg(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	// acme has two authored skills more than the cap allows.
	acme := filepath.Join(f.cfg.OrgsRoot, "acme")
	usage := map[string]any{}
	for i := range 4 {
		name := fmt.Sprintf("skill-%d", i)
		if err := os.MkdirAll(filepath.Join(acme, "skills", "research", name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(acme, "skills", "research", name, "SKILL.md"),
			[]byte("---\nname: "+name+"\ndescription: a skill\n---\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		usage[name] = map[string]any{"use_count": 1, "last_used_at": fmt.Sprintf("2026-11-0%dT10:00:00+00:00", i+1)}
	}
	raw, _ := json.Marshal(usage)
	if err := os.WriteFile(filepath.Join(acme, "skills", ".usage.json"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	f.cfg.WorkerEnv = append(f.cfg.WorkerEnv, "SKILLS_MAX_AUTHORED=2")
	reg := prometheus.NewRegistry()
	f.cfg.Registerer = reg
	d := f.dispatcher(t)
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for f.statuses(t)[sartiq.StatusCompleted] < 4 && time.Now().Before(deadline) {
		n, err := d.Cycle(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n > len(backend.DemoOrganizations) {
			t.Fatalf("one cycle started %d jobs for %d orgs", n, len(backend.DemoOrganizations))
		}
		d.Wait()
	}
	if st := f.statuses(t); st[sartiq.StatusCompleted] != 4 {
		t.Fatalf("backend jobs: %v\n%s", st, f.logs.String())
	}
	var attempts, completed, progress int
	if err := f.db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE outcome = 'completed') FROM claim_attempts`).Scan(&attempts, &completed); err != nil {
		t.Fatal(err)
	}
	if err := f.db.QueryRow(ctx, `SELECT count(*) FROM mirror_job_events WHERE kind = 'progress'`).Scan(&progress); err != nil {
		t.Fatal(err)
	}
	if attempts != 4 || completed != 4 || progress < 5 {
		t.Fatalf("claim attempts %d (completed %d), mirrored progress lines %d", attempts, completed, progress)
	}
	var mirrored int
	if err := f.db.QueryRow(ctx, `SELECT count(*) FROM mirror_jobs WHERE status = 'COMPLETED' AND result IS NOT NULL`).Scan(&mirrored); err != nil || mirrored != 4 {
		t.Fatalf("mirror: %d %v", mirrored, err)
	}
	// Never two jobs of one org in flight: each org's claim-to-outcome intervals are disjoint.
	var overlaps int
	if err := f.db.QueryRow(ctx, `SELECT count(*) FROM claim_attempts a JOIN claim_attempts b
		ON a.org = b.org AND a.id < b.id AND b.claimed_at < a.finished_at`).Scan(&overlaps); err != nil || overlaps != 0 {
		t.Fatalf("overlapping jobs of one org: %d %v", overlaps, err)
	}
	if !strings.Contains(f.logs.String(), `"msg":"job outcome"`) {
		t.Fatal("no outcome logged")
	}
	// Every home the chain ran an agent in names the gateway as its provider (the scripted
	// agent refuses anything else): off the host's network, at the forwarder on the unit's
	// loopback; and the cap's work shows in the metric and the mirror.
	gatewayURL := f.cfg.GatewayURL
	if f.cfg.Runtime.ServiceURL("acme", dispatch.ServiceGateway) != "" {
		gatewayURL = "http://" + unitnet.GatewayAddr
	}
	for _, org := range backend.DemoOrganizations {
		cfg, err := os.ReadFile(filepath.Join(f.cfg.OrgsRoot, org, "config.yaml"))
		if err != nil || !strings.Contains(string(cfg), "base_url: "+gatewayURL+"/v1") ||
			!strings.Contains(string(cfg), "key_env: HERMES_HOST_GATEWAY_KEY") {
			t.Fatalf("%s's config.yaml: %v\n%s", org, err, cfg)
		}
	}
	if got := counterValue(t, reg, "hermes_dispatch_skills_disabled_total"); got != 2 {
		t.Fatalf("hermes_dispatch_skills_disabled_total = %v, want 2", got)
	}
	var disabled string
	if err := f.db.QueryRow(ctx, `SELECT string_agg(x, ',' ORDER BY x) FROM mirror_job_events,
		jsonb_array_elements_text(data->'skills_disabled') AS x WHERE kind = 'outcome'`).Scan(&disabled); err != nil || disabled != "skill-0,skill-1" {
		t.Fatalf("skills disabled in the mirrored outcomes: %q %v", disabled, err)
	}
}

// counterValue is the value of the one counter of that name the registry gathers.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// cycleWithRestarts runs a new dispatcher for each cycle, each shut down after it (nothing
// but the backend's log and Postgres carries over), the clock moved on past STALE_AFTER
// between them so crashed runs' jobs go stale, until no job is queued or running.
func cycleWithRestarts(t *testing.T, f *fixture) {
	t.Helper()
	for range 20 {
		st := f.statuses(t)
		if st[sartiq.StatusQueued]+st[sartiq.StatusClaimed]+st[sartiq.StatusRunning] == 0 {
			return
		}
		d := f.dispatcher(t)
		if _, err := d.Cycle(t.Context()); err != nil {
			t.Fatal(err)
		}
		d.Shutdown(time.Minute, time.Minute)     // a restart: the org leases are given up
		f.backend.Clock.Advance(2 * time.Minute) // the crashed workers' jobs go stale
	}
	t.Fatalf("jobs still queued or running after 20 restarts: %v", f.statuses(t))
}

func TestCrashingAgentFailsAfterExactlyMaxAttemptsAcrossRestarts(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled, f.cfg.MaxAttempts = true, 3
	knobs, _ := json.Marshal(scriptedagent.Knobs{CrashAtWrite: 1})
	if err := os.WriteFile(filepath.Join(f.cfg.OrgsRoot, "acme", scriptedagent.KnobsFile), knobs, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cycleWithRestarts(t, f)
	if st := f.statuses(t); st[sartiq.StatusFailed] != 2 || st[sartiq.StatusCompleted] != 2 {
		t.Fatalf("want acme's two jobs failed and globex's two completed: %v", st)
	}
	rows, err := f.db.Query(ctx, `SELECT job_id, count(*) FILTER (WHERE outcome = 'crashed'), count(*), coalesce(max(reason) FILTER (WHERE outcome = 'failed'), '')
		FROM claim_attempts WHERE org = 'acme' GROUP BY job_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	jobs := 0
	for rows.Next() {
		var job, reason string
		var crashed, claims int
		if err := rows.Scan(&job, &crashed, &claims, &reason); err != nil {
			t.Fatal(err)
		}
		jobs++
		// Each crash was ended at once by the dispatcher that ran it (released, or failed at
		// the cap): exactly MAX_ATTEMPTS runs, no re-claim.
		if crashed != 3 || claims != 3 || reason != "" {
			t.Errorf("job %s: %d crashed runs in %d claims, a failed attempt %q; want exactly MAX_ATTEMPTS=3 runs, each crashed", job, crashed, claims, reason)
		}
		var backendErr string
		if err := f.backend.DB.QueryRow(ctx, `SELECT error FROM agent_jobs WHERE id = $1`, job).Scan(&backendErr); err != nil ||
			!strings.HasPrefix(backendErr, "gave up after 3 crashed attempts (MAX_ATTEMPTS=3)") {
			t.Errorf("job %s at the backend: %q %v", job, backendErr, err)
		}
		if m := f.mirrorStatus(t, job); m != sartiq.StatusFailed {
			t.Errorf("job %s in the mirror: %s, want FAILED", job, m)
		}
	}
	if jobs != 2 {
		t.Fatalf("%d acme jobs in claim_attempts", jobs)
	}
}

// mirrorStatus is the job's status in the host's job mirror.
func (f *fixture) mirrorStatus(t *testing.T, job string) string {
	t.Helper()
	var st string
	if err := f.db.QueryRow(context.Background(), `SELECT status FROM mirror_jobs WHERE job_id = $1`, job).Scan(&st); err != nil {
		t.Fatalf("mirror of job %s: %v", job, err)
	}
	return st
}

// An org's next job starts as soon as its last one here ends, not at the next tick: the
// ready loop polls that org's jobs alone and claims. With a poll interval far longer than
// the run, each demo org's second job can only start that way.
func TestAnOrgsNextJobStartsWhenItsLastEndsNotAtTheNextPoll(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	reg := prometheus.NewRegistry()
	f.cfg.Registerer = reg
	d := f.dispatcher(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	cycles := atomic.Int64{}
	go func() {
		defer close(done)
		d.Run(ctx, dispatch.RunOptions{Poll: time.Hour, Cycled: func(int, error) { cycles.Add(1) }})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitFor(t, 2*time.Minute, "both demo orgs' two jobs to complete", func() bool {
		return f.statuses(t)[sartiq.StatusCompleted] == 4
	})
	if n := cycles.Load(); n != 1 {
		t.Errorf("%d cycles ran, want the first alone (the poll is an hour)", n)
	}
	if n := counterValue(t, reg, "hermes_dispatch_ready_steps_total"); n < 2 {
		t.Errorf("hermes_dispatch_ready_steps_total is %v, want a step for each org's second job at least", n)
	}
}

// An org whose run ends while another org's next step is slow gets its own next step at
// once, beside the slow one, not after it. acme's run ends first and its step hangs on a
// slow backend (its poll held until the test lets it go); globex's run, slowed by its
// agent, ends after that, and its second job is claimed while acme's step still hangs.
// Taken as batches, globex waited for acme's batch to end (at the scale run's load, about
// 24 s after a crashed run before the next claim).
func TestAnOrgWhoseRunEndsIsNotHeldBehindAnotherOrgsSlowStep(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	writeKnobs(t, f, "globex", &scriptedagent.Knobs{StepMS: 1500})
	held, release, heldEnded := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var holding sync.Once
	upstream, err := url.Parse(f.backend.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The backend writes its own address into a claim's links: the proxy is not seen.
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(upstream) }}
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("organization_id") == "acme" && strings.Contains(q.Get("status"), sartiq.StatusQueued) {
			first := false
			holding.Do(func() { first = true })
			if first {
				close(held)
				defer close(heldEnded)
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(slow.Close)
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(letGo)
	if f.cfg.Bot, err = sartiq.New(slow.URL, backendtest.BotToken); err != nil {
		t.Fatal(err)
	}
	d := f.dispatcher(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx, dispatch.RunOptions{Poll: time.Hour})
	}()
	t.Cleanup(func() {
		letGo()
		cancel()
		<-done
	})

	select {
	case <-held:
	case <-time.After(2 * time.Minute):
		t.Fatal("acme's first job never ended into a step of the ready loop")
	}
	if n := f.jobsOf(t, "globex")[sartiq.StatusCompleted]; n != 0 {
		t.Fatalf("globex's first job had completed (%d) before acme's step began: the test's order did not hold (raise globex's step_ms)", n)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the dispatcher's log:\n%s", f.logs.String())
		}
	})
	waitFor(t, 2*time.Minute, "globex's second job to be claimed while acme's step hangs", func() bool {
		select {
		case <-heldEnded:
			t.Fatal("acme's held poll ended (its client gave up on it) before globex's second job was claimed")
		default:
		}
		return f.jobsOf(t, "globex")[sartiq.StatusQueued] == 0
	})
	if n := f.jobsOf(t, "acme")[sartiq.StatusQueued]; n != 1 {
		t.Fatalf("acme has %d queued jobs while its step hangs, want its second still queued", n)
	}
	letGo()
	waitFor(t, 2*time.Minute, "every job to complete once acme's step goes on", func() bool {
		return f.statuses(t)[sartiq.StatusCompleted] == 4
	})
}

// An org's oldest queued job is claimed first whatever its type: the backend lists one
// type at a time, and a crashed job of the second type listed, queued again, waited behind
// a newer job of the first (the scale run of 2026-12-07: a killed worker's job ran after
// its org's next one, 109 s after the kill). acme's oldest job is its guidelines job,
// globex's its product job.
func TestAnOrgsOldestQueuedJobIsClaimedFirstWhateverItsType(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	ctx := t.Context()
	oldest := map[string]string{"acme": sartiq.TypeGuidelinesExtraction, "globex": sartiq.TypeProductIngest}
	for org, typ := range oldest {
		if tag, err := f.backend.DB.Exec(ctx, `UPDATE agent_jobs SET created_at = created_at - interval '1 hour'
			WHERE organization_id = $1 AND type = $2`, org, typ); err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("age %s's %s job: %v, %d rows", org, typ, err, tag.RowsAffected())
		}
	}
	d := f.dispatcher(t)
	if n, err := d.Cycle(ctx); err != nil || n != 2 {
		t.Fatalf("cycle started %d, %v; want one job per org", n, err)
	}
	d.Wait()
	for org, typ := range oldest {
		var claimed string
		if err := f.backend.DB.QueryRow(ctx, `SELECT string_agg(type, ',') FROM agent_jobs
			WHERE organization_id = $1 AND status <> 'QUEUED'`, org).Scan(&claimed); err != nil {
			t.Fatal(err)
		}
		if claimed != typ {
			t.Errorf("%s: claimed %q first, want its oldest job, of type %s", org, claimed, typ)
		}
	}
}

// A cycle takes several orgs' steps at once, yet never owns more than MAX_ORGS: an acquire
// under way holds its place.
func TestACycleOwnsNoMoreThanMaxOrgs(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	f.cfg.MaxOrgs = 1
	d := f.dispatcher(t)
	for range 5 {
		if _, err := d.Cycle(t.Context()); err != nil {
			t.Fatal(err)
		}
		if owned := d.Owned(); len(owned) != 1 {
			t.Fatalf("the dispatcher owns %v with MAX_ORGS 1", owned)
		}
	}
	d.Wait()
}
