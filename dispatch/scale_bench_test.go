package dispatch_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"hermeshost/dispatch"
	"hermeshost/dispatch/runtime"
	"hermeshost/gateway"
	"hermeshost/lease"
	"hermeshost/migrations"
	"hermeshost/pg"
	"hermeshost/pg/pgtest"
	"hermeshost/sartiq"
	"hermeshost/sartiq/backend"
	"hermeshost/sartiq/backend/backendtest"
	"hermeshost/scriptedagent"
)

// benchScale lets the scale run go (minutes per runtime); `make bench` sets it.
const benchScale = "HERMES_BENCH_SCALE"

// benchScaleDocker=0 skips the scale run on Docker (it runs when an engine answers).
const benchScaleDocker = "HERMES_BENCH_SCALE_DOCKER"

// The scale run: scaleOrgs orgs with scalePerOrg small jobs each, two dispatchers.
const (
	scaleOrgs   = 200
	scalePerOrg = 25
	// scaleKills orgs run their jobs with the scripted agent's steps slowed to scaleStep,
	// so that a SIGKILL of their worker lands mid-job; one job of each is killed.
	scaleKills = 4
	scaleStep  = time.Second
	// Timings of the scale run: the dispatchers poll every scalePoll; heartbeat and
	// STALE_AFTER are the product's defaults.
	scalePoll      = time.Second
	scaleHeartbeat = defaultHeartbeat
	scaleStale     = backend.DefaultStaleAfter
)

// BenchmarkScale is the scale run: 200 orgs x 25 small jobs (5,000, scripted agent), on the
// process runtime and on Docker, with the backend and the gateway (with its demo upstream)
// each a `hermes-host` process of its own, as deployed.
//
// dispatchers: two dispatch.Dispatchers in this process, each with its own holder, sharing
// the orgs through their org: leases (MaxOrgs 100 each), Run with a 1 s poll. During the
// run one job of each of 4 orgs is SIGKILLed with its worker mid-job; kill-to-start is the
// time from the kill to that job's next attempt's start line. baseline-run-job: the same
// jobs claimed by the bot and run with `worker run-job` directly, one goroutine per org
// (the same 200 at once), no dispatcher and no kills.
//
// Both time from the first job queued (queueing 5,000 jobs is part of it on both sides) to
// the last job ended at the backend (dispatchers) or the last run-job's exit (baseline), and report claim-to-start and claim-to-agent percentiles of
// first attempts (a claim's response reaching the client to the worker's start and
// agent_start lines). Memory: this process's peak RSS (VmHWM, reset at the start of the
// run) and largest Go heap (sampled every 100 ms), which hold both dispatchers; the
// backend's and the gateway's peak RSS; on processes the largest peak RSS of any worker,
// run-job and agent process (sampled from /proc every 250 ms), on Docker the largest and
// median container memory peak (the engine's max_usage). Every job must end COMPLETED
// with exactly one completion, every killed job at attempt 2 and every other at 1, and
// both dispatchers must have owned orgs, or there is no figure.
func BenchmarkScale(b *testing.B) {
	if os.Getenv(benchScale) == "" {
		b.Skipf("the scale run takes minutes per runtime; set %s=1 to run it (make bench does)", benchScale)
	}
	for _, kind := range []string{"process", "docker"} {
		b.Run(kind, func(b *testing.B) {
			if kind == "docker" && os.Getenv(benchScaleDocker) == "0" {
				b.Skipf("%s=0: the scale run on Docker (about 40 minutes here) is skipped", benchScaleDocker)
			}
			b.Run("baseline-run-job", func(b *testing.B) {
				w := newScaleWorld(b, kind)
				w.warmOrgs(b)
				w.queueAndRunDirect(b, 1) // warms every connection before timing
				for b.Loop() {
					w.round(b, false)
				}
			})
			b.Run("dispatchers", func(b *testing.B) {
				w := newScaleWorld(b, kind)
				w.warmOrgs(b)
				ds := []*dispatch.Dispatcher{w.dispatcher(b, "scale-a"), w.dispatcher(b, "scale-b")}
				for _, d := range ds {
					w.run(b, d, scalePoll)
				}
				w.ds = ds
				w.queueAndDrain(b, 1) // the dispatchers own every org before timing
				for b.Loop() {
					w.round(b, true)
				}
			})
		})
	}
}

// scaleWorld is a benchWorld whose backend and gateway are processes of their own.
type scaleWorld struct {
	*benchWorld
	kind     string
	db       *pgxpool.Pool // the backend's schema
	backend  *serviceProc
	gateway  *serviceProc
	orgs     []string
	killOrgs map[string]bool
	ds       []*dispatch.Dispatcher
	regs     []*prometheus.Registry // the dispatchers', in ds's order
	hostURL  string                 // the host's schema, for each dispatcher's own pool
	docker   *client.Client

	jobsMu sync.Mutex
	byOrg  map[string][]string // every job queued in the world, by org, in queue order

	restarts   atomic.Int64 // workers runJobDirect found not running and started again
	unstarted  atomic.Int64 // run-jobs runJobDirect ran again as the engine had not started them
	lostClaims atomic.Int64 // claims claimDirect sent whose answer did not come
}

// serviceProc is a `hermes-host` service run for a benchmark.
type serviceProc struct {
	cmd  *exec.Cmd
	url  string
	done chan error
}

// startService runs `hermes-host args...` with env, its log in a file of its own
// (benchLogFile), waits for its "listening" line of server name and stops it (SIGTERM)
// when the benchmark ends.
func startService(b *testing.B, name string, env []string, args ...string) *serviceProc {
	b.Helper()
	out := benchLogFile(b, name)
	logPath := out.Name()
	cmd := exec.Command(filepath.Join(binDir, "hermes-host"), args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "LOG_FORMAT=json", "LOG_LEVEL=info"}, env...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &serviceProc{cmd: cmd, done: make(chan error, 1)}
	go func() {
		p.done <- cmd.Wait()
		out.Close()
	}()
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	deadline := time.Now().Add(time.Minute)
	for p.url == "" {
		select {
		case err := <-p.done:
			raw, _ := os.ReadFile(logPath)
			b.Fatalf("%s exited before listening: %v\n%s", name, err, raw)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s did not listen within a minute", name)
		}
		raw, _ := os.ReadFile(logPath)
		for _, line := range strings.Split(string(raw), "\n") {
			var l struct{ Msg, Server, URL string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "listening" && l.Server == name {
				p.url = l.URL
			}
		}
	}
	return p
}

// scaleLog is the log of the benchmark's dispatchers and runtime, a JSON file (as the
// backend's and gateway's are): a run that went wrong an hour in can be read.
func scaleLog(b *testing.B, name string) *slog.Logger {
	b.Helper()
	return slog.New(slog.NewJSONHandler(benchLogFile(b, name), nil))
}

// benchLogFile is a new log file named for name, in HERMES_BENCH_LOG_DIR or else the
// benchmark's temporary directory, closed when the benchmark ends; a failed benchmark
// names its warnings and errors, message by message.
func benchLogFile(b *testing.B, name string) *os.File {
	b.Helper()
	dir := os.Getenv("HERMES_BENCH_LOG_DIR")
	if dir == "" {
		dir = b.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%s.log", name, time.Now().Format("20060102-150405")))
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		f.Close()
		if !b.Failed() {
			return
		}
		raw, _ := os.ReadFile(path)
		counts := map[string]int{}
		for _, line := range strings.Split(string(raw), "\n") {
			var l struct{ Level, Msg string }
			if json.Unmarshal([]byte(line), &l) == nil && (l.Level == "WARN" || l.Level == "ERROR") {
				counts[l.Level+" "+l.Msg]++
			}
		}
		keys := slices.SortedFunc(maps.Keys(counts), func(a, c string) int { return cmp.Compare(counts[c], counts[a]) })
		b.Logf("the %s log (%s): %d kinds of warning and error", name, path, len(keys))
		for _, k := range keys[:min(len(keys), 20)] {
			b.Logf("  %6d %s", counts[k], k)
		}
	})
	return f
}

func newScaleWorld(b *testing.B, kind string) *scaleWorld {
	b.Helper()
	ctx := context.Background()
	w := &scaleWorld{benchWorld: &benchWorld{id: strings.ToLower(rand.Text()[:6]), tl: newTimeline()}, kind: kind,
		byOrg: map[string][]string{}}
	backendURL, _ := pgtest.EmptySchema(b)
	w.backend = startService(b, "backend", []string{
		"BACKEND_DATABASE_URL=" + backendURL, "SARTIQ_BOT_TOKEN=" + backendtest.BotToken,
		"STALE_AFTER=" + scaleStale.String(),
	}, "backend", "--addr", "127.0.0.1:0")
	db, _, err := pg.Open(ctx, backendURL, backend.Migrations.DefaultSchema)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(db.Close)
	w.db = db
	w.gateway = startService(b, "gateway", []string{
		"GATEWAY_SECRET=" + gatewaySecret, "GATEWAY_KEY=host-key",
		"GATEWAY_ORG_RPS=1000", "GATEWAY_ORG_CONCURRENCY=16",
	}, "gateway", "--addr", "127.0.0.1:0", "--upstream", "demo")
	bot, err := sartiq.New(w.backend.url, backendtest.BotToken,
		sartiq.WithHTTPClient(&http.Client{Timeout: time.Minute, Transport: observer{tl: w.tl, next: http.DefaultTransport}}))
	if err != nil {
		b.Fatal(err)
	}
	w.bot = bot
	hostURL, hostDB := pgtest.Schema(b)
	w.hostURL = hostURL
	root := b.TempDir()
	log := scaleLog(b, "dispatchers")
	rc := runtime.Config{
		Instance: "dispatch-scale", Scope: "dispatch-scale-" + w.id,
		OrgsRoot: filepath.Join(root, "orgs"), WorkspacesRoot: filepath.Join(root, "workspaces"),
		WorkerIdle: []string{"hermes-host", "worker", "idle"}, BinDir: binDir, Output: io.Discard,
		Logger: log, Network: "host",
	}
	var rt runtime.Runtime
	if kind == "docker" {
		rc.WorkerImage = buildWorkerImage(b, rc.Scope, w.id)
		rc.DashboardImage = rc.WorkerImage
		rt, err = runtime.NewDocker(ctx, rc)
		if err == nil {
			w.docker, err = client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
		}
	} else {
		rt, err = runtime.NewProcess(rc)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		rt.Close()
		if w.docker != nil {
			w.docker.Close()
		}
	})
	w.rt = observedRuntime{Runtime: rt, tl: w.tl}
	w.cfg = dispatch.Config{
		Bot: bot, APIURL: w.backend.url, Runtime: w.rt, DB: hostDB, OrgsRoot: rc.OrgsRoot,
		GatewayURL: w.gateway.url, GatewayKey: "host-key", GatewaySecret: gatewaySecret,
		WorkerModel: gateway.DemoWorkerModel, VisionModel: gateway.DemoVisionModel,
		ClaimEnabled: true, MaxOrgs: scaleOrgs / 2,
		WorkerEnv: []string{"HERMES_BIN=scripted-agent", "HEARTBEAT_INTERVAL=" + scaleHeartbeat.String()},
		Log:       log,
	}
	return w
}

// dispatcher is a dispatcher of its own instance name (and so its own holder).
func (w *scaleWorld) dispatcher(b *testing.B, instance string) *dispatch.Dispatcher {
	cfg := w.cfg
	cfg.Instance = instance
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	w.regs = append(w.regs, reg)
	// A pool of its own, as a dispatcher process has: sharing one, the two dispatchers'
	// lease refreshes queued behind both one's steps.
	pool, _, err := pg.Open(b.Context(), w.hostURL, migrations.Host.DefaultSchema)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if err := pg.RegisterPoolMetrics(reg, pg.MainPool, pool); err != nil {
		b.Fatal(err)
	}
	// And its own leases on a pool of their own, as cmd/hermes-host's dispatcher keeps them.
	keepPool, _, err := pg.OpenWith(b.Context(), w.hostURL, migrations.Host.DefaultSchema, pg.Options{MaxConns: lease.KeepPoolConns, Name: pg.LeasePool})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(keepPool.Close)
	if err := pg.RegisterPoolMetrics(reg, pg.LeasePool, keepPool); err != nil {
		b.Fatal(err)
	}
	leases := lease.New(pool, lease.Options{Log: cfg.Log, Registerer: reg, KeepPool: keepPool})
	b.Cleanup(leases.Close)
	cfg.DB, cfg.Leases = pool, leases
	d := dispatch.New(cfg)
	b.Cleanup(d.Close)
	return d
}

// warmOrgs makes the orgs' homes and workers; the kill orgs' agents take scaleStep a step.
func (w *scaleWorld) warmOrgs(b *testing.B) {
	b.Helper()
	w.orgs = make([]string, scaleOrgs)
	w.killOrgs = map[string]bool{}
	slow, _ := json.Marshal(scriptedagent.Knobs{StepMS: int(scaleStep.Milliseconds())})
	for i := range w.orgs {
		org := w.org(fmt.Sprintf("%03d", i))
		w.orgs[i] = org
		w.warm(b, org)
		if i%(scaleOrgs/scaleKills) == scaleOrgs/scaleKills/2 {
			w.killOrgs[org] = true
			if err := os.WriteFile(filepath.Join(w.cfg.OrgsRoot, org, scriptedagent.KnobsFile), slow, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// queue queues per jobs for every org, round robin (each org's types alternate), and
// answers them by org in queue order.
func (w *scaleWorld) queue(b *testing.B, per int) map[string][]string {
	b.Helper()
	ctx := context.Background()
	now := time.Now()
	for _, org := range w.orgs {
		if err := backend.EnsureOrganization(ctx, w.db, org, "Org "+org, now); err != nil {
			b.Fatal(err)
		}
	}
	jobs := map[string][]string{}
	for i := range per {
		for _, org := range w.orgs {
			j := backend.NewJob{Type: sartiq.TypeProductIngest, OrganizationID: org,
				Instructions: "Propose one product for each row of catalog.csv.",
				Sources:      []sartiq.ManifestSource{{Name: "catalog.csv", MediaType: "text/csv", Content: "sku,name,price\n" + org + "-1,Trail Shoe,89.00\n"}}}
			if i%2 == 1 {
				j = backend.NewJob{Type: sartiq.TypeGuidelinesExtraction, OrganizationID: org,
					Instructions: "Extract the brand guidelines of every category from brand-book.md.",
					Categories:   backend.DemoCategories[:1],
					Sources:      []sartiq.ManifestSource{{Name: "brand-book.md", MediaType: "text/markdown", Content: "# Brand book\n\n## Tone of voice\nPlain and warm.\n"}}}
			}
			id, err := backend.CreateJob(ctx, w.db, j, time.Now())
			if err != nil {
				b.Fatal(err)
			}
			jobs[org] = append(jobs[org], id)
			w.jobsMu.Lock()
			w.byOrg[org] = append(w.byOrg[org], id)
			w.jobsMu.Unlock()
		}
	}
	return jobs
}

// queueAndRunDirect queues per jobs for every org and runs each org's in turn through
// bare run-jobs, every org at once.
func (w *scaleWorld) queueAndRunDirect(b *testing.B, per int) map[string][]string {
	b.Helper()
	jobs := w.queue(b, per)
	var wg sync.WaitGroup
	errs := make(chan error, len(w.orgs))
	for _, org := range w.orgs {
		wg.Go(func() {
			for _, job := range jobs[org] {
				if err := w.runJobDirect(org, job); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	return jobs
}

// runJobDirect claims job with the bot and hands it to `worker run-job` as the dispatcher
// would. A worker found not running (on Docker, under a load average above 200, a
// container was once gone) is started again and the claimed job handed to it, as a
// dispatcher's next delivery would; such restarts are counted.
func (w *scaleWorld) runJobDirect(org, job string) error {
	ctx := context.Background()
	c, err := w.claimDirect(ctx, job)
	if err != nil {
		return err
	}
	env, assignment, err := w.bareRun(org, c)
	if err != nil {
		return err
	}
	for restarts := 0; ; restarts++ {
		var stderr bytes.Buffer
		st, err := w.rt.Exec(ctx, org, runtime.Command{Args: runJob, Env: env, Stdin: bytes.NewReader(assignment), Stderr: &stderr})
		if errors.Is(err, runtime.ErrNotRunning) && restarts < 3 {
			w.restarts.Add(1)
			if _, err := w.rt.EnsureWorker(ctx, org); err != nil {
				return fmt.Errorf("restart the worker of %s: %w", org, err)
			}
			continue
		}
		if errors.Is(err, runtime.ErrNotStarted) && restarts < 3 {
			// The engine failed the exec (a dispatcher releases the job and claims it
			// again; the claim here is still good, as nothing ran).
			w.unstarted.Add(1)
			continue
		}
		if err != nil || st.Code != 0 {
			return fmt.Errorf("run-job %s of %s: %v %v\n%s", job, org, st, err, stderr.String())
		}
		return nil
	}
}

// claimDirect claims job for the bare baseline. A claim whose answer did not come (a bare
// EOF under the run's load: the backend may have taken it) is settled as a dispatcher
// settles one: a job still QUEUED is claimed again, and one the lost claim took is
// re-claimed once it has gone stale. Such claims are counted; a refusal is a failure.
func (w *scaleWorld) claimDirect(ctx context.Context, job string) (*sartiq.Claim, error) {
	c, err := w.bot.Claim(ctx, job)
	for tries := 0; err != nil && tries < 3; tries++ {
		var answered *sartiq.APIError
		if errors.As(err, &answered) {
			return nil, err
		}
		w.lostClaims.Add(1)
		var status string
		if qerr := w.db.QueryRow(ctx, `SELECT status FROM agent_jobs WHERE id = $1`, job).Scan(&status); qerr != nil {
			return nil, errors.Join(err, qerr)
		}
		if status == sartiq.StatusQueued {
			c, err = w.bot.Claim(ctx, job)
			continue
		}
		time.Sleep(scaleStale + time.Second)
		c, err = w.bot.Reclaim(ctx, job)
	}
	return c, err
}

// queueAndDrain queues per jobs for every org and waits until the backend has every one
// ended (COMPLETED or FAILED; the round's check then wants COMPLETED). The backend decides,
// not the workers' exits: under a load average in the hundreds an exec on Docker was seen to
// end otherwise than with its exit status although its job had completed.
func (w *scaleWorld) queueAndDrain(b *testing.B, per int) map[string][]string {
	b.Helper()
	jobs := w.queue(b, per)
	var ids []string
	for _, org := range w.orgs {
		ids = append(ids, jobs[org]...)
	}
	deadline := time.Now().Add(time.Hour)
	for {
		var ended int
		if err := w.db.QueryRow(context.Background(), `SELECT count(*) FROM agent_jobs
			WHERE id = ANY($1::uuid[]) AND status IN ('COMPLETED', 'FAILED')`, ids).Scan(&ended); err != nil {
			b.Fatal(err)
		}
		if ended == len(ids) {
			return jobs
		}
		if time.Now().After(deadline) {
			b.Fatalf("after an hour %d of %d jobs have ended at the backend", ended, len(ids))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// kill is one SIGKILL of a worker mid-job and what followed.
type kill struct {
	org, job string
	at       time.Time
	err      error
}

// round runs scalePerOrg jobs for every org, through the dispatchers (with kills) or
// bare run-jobs, checks that every job completed exactly once, and reports.
func (w *scaleWorld) round(b *testing.B, dispatched bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mem := w.watchMemory(ctx)
	var jobs map[string][]string
	var kills []*kill
	var owned []int // each dispatcher's orgs as the last job ended
	began := time.Now()
	cyclesBefore := w.cycleTotals(b)
	gateBefore := w.gateModelLists(b)
	if dispatched {
		killCtx, stopKilling := context.WithCancel(ctx)
		var killed sync.WaitGroup
		// Each kill org loses its worker once, on a different job of its run each.
		n := 0
		for _, org := range w.orgs {
			if !w.killOrgs[org] {
				continue
			}
			k := &kill{org: org}
			kills = append(kills, k)
			w.jobsMu.Lock()
			skip := len(w.byOrg[org]) // jobs of earlier rounds
			w.jobsMu.Unlock()
			nth := (4 + 5*n) % scalePerOrg
			n++
			killed.Go(func() { w.killMidJob(killCtx, k, skip, nth) })
		}
		jobs = w.queueAndDrain(b, scalePerOrg)
		// Owned now, as the last job ends: afterwards (reading 200 containers' memory
		// takes minutes on Docker) the dispatchers give back orgs idle for ORG_IDLE.
		for _, d := range w.ds {
			owned = append(owned, len(d.Owned()))
		}
		stopKilling()
		killed.Wait()
	} else {
		jobs = w.queueAndRunDirect(b, scalePerOrg)
	}
	elapsed := time.Since(began)
	b.StopTimer()
	peaks := mem.stop(b)

	var all []string
	for _, org := range w.orgs {
		all = append(all, jobs[org]...)
	}
	killedJobs := map[string]bool{}
	var toClaim, toStart, toAgent []time.Duration
	killUnseen := 0
	for _, k := range kills {
		if k.err != nil {
			b.Fatalf("kill of %s's worker: %v", k.org, k.err)
		}
		killedJobs[k.job] = true
		// The next attempt is the first after the killed one to start (a claim released
		// before its start, uncounted, takes an attempt number too).
		started, ok1 := w.firstMark(k.job, 2, "start")
		agent, ok2 := w.firstMark(k.job, 2, "agent_start")
		if !ok1 || !ok2 {
			// A line the timeline missed (the engine's exec stream under a load average in
			// the hundreds): counted with the others below, not guessed. That the job ran
			// again is checkCompletedOnce's to say, from the backend.
			b.Logf("job %s killed: a later attempt's start seen %v, agent_start seen %v", k.job, ok1, ok2)
			killUnseen += 2
			continue
		}
		toStart = append(toStart, started.Sub(k.at))
		toAgent = append(toAgent, agent.Sub(k.at))
		// The dispatcher's part: the kill to the next claim's answer (the rest is starting
		// the worker again and run-job, on a machine the 200 jobs at once saturate).
		if claimed, ok := w.firstMark(k.job, 2, "claim"); ok {
			toClaim = append(toClaim, claimed.Sub(k.at))
		}
	}
	extra := w.checkCompletedOnce(b, all, killedJobs)
	b.ReportMetric(float64(extra), "extra-attempts")
	if dispatched {
		w.reportAttempts(b, all)
	}
	if dispatched {
		for i, n := range owned {
			if n == 0 {
				b.Fatalf("dispatcher %d owned no org as the last job ended: the orgs were not shared", i)
			}
			b.ReportMetric(float64(n), fmt.Sprintf("orgs-owned-%c", 'a'+i))
		}
		// What a cycle (a poll of every org's jobs, then a step for each) took in the
		// round, and how many steps the ready loop took for an org whose run had ended.
		for i, after := range w.cycleTotals(b) {
			before := cyclesBefore[i]
			if n := after.count - before.count; n > 0 {
				b.ReportMetric(float64(n), fmt.Sprintf("cycles-%c", 'a'+i))
				b.ReportMetric((after.sum-before.sum)/float64(n), fmt.Sprintf("cycle-mean-s-%c", 'a'+i))
			}
			b.ReportMetric(after.ready-before.ready, fmt.Sprintf("ready-steps-%c", 'a'+i))
			if n := after.keepRounds - before.keepRounds; n > 0 {
				b.ReportMetric((after.keepSum-before.keepSum)/float64(n), fmt.Sprintf("keep-round-mean-s-%c", 'a'+i))
			}
			// Seconds its queries waited, in all, for a connection of its pool.
			b.ReportMetric(after.poolWait-before.poolWait, fmt.Sprintf("db-pool-wait-s-%c", 'a'+i))
			b.ReportMetric(after.keepWait-before.keepWait, fmt.Sprintf("db-lease-pool-wait-s-%c", 'a'+i))
		}
		// Org leases that lapsed during the round, from lease_events: taken over by the other
		// dispatcher, or expired (the sweeper's event) and acquired anew.
		var lapsed int
		if err := w.cfg.DB.QueryRow(context.Background(), `SELECT count(*) FROM lease_events
			WHERE kind IN ('takeover', 'expire') AND key LIKE 'org:%' AND at >= $1`, began).Scan(&lapsed); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(lapsed), "org-leases-lapsed")
		// The model lists the dispatchers' gateway gates asked for in the round (one a
		// second at most, each, while open).
		b.ReportMetric(w.gateModelLists(b)-gateBefore, "gate-model-lists")
	}

	// Latencies of each job's first attempt that started, from the marks seen; a line the timeline missed (seen
	// once in a run under a load average above 100: a job's agent_start, its job completed)
	// is counted, not guessed.
	var claimToStart, claimToAgent []time.Duration
	unseen := killUnseen
	for _, job := range all {
		if killedJobs[job] {
			continue
		}
		// The first attempt that started: a claim released before its start (uncounted)
		// is followed by another claim.
		attempt := 0
		for a := 1; a <= 10 && attempt == 0; a++ {
			if _, ok := w.tl.when(mark{job, a, "start"}); ok {
				attempt = a
			}
		}
		// The attempt's claim, or its re-claim (of a job that went stale).
		claimed, ok := w.tl.when(mark{job, max(attempt, 1), "claim"})
		if !ok {
			claimed, ok = w.tl.when(mark{job, max(attempt, 1), "reclaim"})
		}
		if !ok {
			b.Logf("job %s: no claim or re-claim of attempt %d seen", job, max(attempt, 1))
			unseen += 2
			continue
		}
		if started, ok := w.tl.when(mark{job, attempt, "start"}); ok {
			claimToStart = append(claimToStart, started.Sub(claimed))
		} else {
			unseen++
		}
		if agent, ok := w.tl.when(mark{job, attempt, "agent_start"}); ok {
			claimToAgent = append(claimToAgent, agent.Sub(claimed))
		} else {
			unseen++
		}
	}
	if unseen > len(all)/100 {
		b.Fatalf("%d start or agent_start lines of %d jobs were not seen", unseen, len(all))
	}
	b.ReportMetric(float64(unseen), "lines-unseen")
	if !dispatched {
		b.ReportMetric(float64(w.restarts.Swap(0)), "worker-restarts")
		b.ReportMetric(float64(w.unstarted.Swap(0)), "execs-not-started")
		b.ReportMetric(float64(w.lostClaims.Swap(0)), "claims-unanswered")
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "jobs/s")
	b.ReportMetric(elapsed.Seconds(), "run-s")
	reportPercentiles(b, "claim-to-start", claimToStart)
	reportPercentiles(b, "claim-to-agent", claimToAgent)
	if len(kills) > 0 {
		b.ReportMetric(float64(len(kills)), "kills")
		if len(toClaim) > 0 {
			b.ReportMetric(median(toClaim).Seconds(), "kill-to-claim-median-s")
		}
		b.ReportMetric(median(toStart).Seconds(), "kill-to-start-median-s")
		b.ReportMetric(slices.Max(toStart).Seconds(), "kill-to-start-max-s")
		b.ReportMetric(median(toAgent).Seconds(), "kill-to-agent-median-s")
	}
	for _, p := range peaks {
		b.ReportMetric(p.mb, p.name+"-MB")
	}
	b.StartTimer()
}

// cycleTotals are a dispatcher's cycle count and seconds, and its ready-loop steps.
type cycleTotals struct {
	count      uint64
	sum, ready float64
	keepRounds uint64  // rounds refreshing the org: leases
	keepSum    float64 // their seconds
	poolWait   float64 // seconds waited for a connection of the dispatcher's main pool
	keepWait   float64 // and of the pool it keeps its leases on
}

// gateModelLists is how many /v1/models requests the gateway has served the host's own
// key (its gate), from the gateway process's /metrics.
func (w *scaleWorld) gateModelLists(b *testing.B) float64 {
	resp, err := http.Get(w.gateway.url + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		b.Fatalf("the gateway's /metrics: %v", err)
	}
	var n float64
	for _, m := range mfs["gateway_requests_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["org"] == "_host" && labels["endpoint"] == "models" {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

// poolLabel is a hermes_db_pool_* sample's pool.
func poolLabel(m *dto.Metric) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == "pool" {
			return l.GetValue()
		}
	}
	return ""
}

// cycleTotals reads each dispatcher's totals from its registry, in ds's order.
func (w *scaleWorld) cycleTotals(b *testing.B) []cycleTotals {
	out := make([]cycleTotals, len(w.regs))
	for i, reg := range w.regs {
		mfs, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, mf := range mfs {
			switch mf.GetName() {
			case "hermes_dispatch_cycle_seconds":
				h := mf.GetMetric()[0].GetHistogram()
				out[i].count, out[i].sum = h.GetSampleCount(), h.GetSampleSum()
			case "hermes_dispatch_ready_steps_total":
				out[i].ready = mf.GetMetric()[0].GetCounter().GetValue()
			case "hermes_db_pool_empty_acquire_wait_seconds_total":
				for _, m := range mf.GetMetric() {
					switch poolLabel(m) {
					case pg.MainPool:
						out[i].poolWait = m.GetCounter().GetValue()
					case pg.LeasePool:
						out[i].keepWait = m.GetCounter().GetValue()
					}
				}
			case "hermes_dispatch_org_lease_refresh_round_seconds":
				h := mf.GetMetric()[0].GetHistogram()
				out[i].keepRounds, out[i].keepSum = h.GetSampleCount(), h.GetSampleSum()
			}
		}
	}
	return out
}

func reportPercentiles(b *testing.B, name string, d []time.Duration) {
	s := slices.Clone(d)
	slices.Sort(s)
	b.ReportMetric(float64(s[len(s)/2].Microseconds())/1000, name+"-p50-ms")
	b.ReportMetric(float64(s[len(s)*99/100].Microseconds())/1000, name+"-p99-ms")
}

// killMidJob waits for the first attempt of org's nth job after its first skip (from 0;
// an org's jobs are claimed oldest first, one at a time) to start its agent, gives the agent
// (slowed to scaleStep a step) a quarter step, and SIGKILLs the org's worker with it.
func (w *scaleWorld) killMidJob(ctx context.Context, k *kill, skip, nth int) {
	for k.job == "" {
		w.jobsMu.Lock()
		if q := w.byOrg[k.org]; len(q) > skip+nth {
			k.job = q[skip+nth]
		}
		w.jobsMu.Unlock()
		select {
		case <-ctx.Done():
			k.err = errors.New("the run ended before the job to kill was queued")
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := w.waitMark(ctx, mark{k.job, 1, "agent_start"}); err != nil {
		k.err = err
		return
	}
	time.Sleep(scaleStep / 4)
	if _, done := w.tl.when(mark{k.job, 1, "exit"}); done {
		k.err = fmt.Errorf("job %s ended before the kill", k.job)
		return
	}
	k.at, k.err = w.killUnit(ctx, k.org)
}

// firstMark is the earliest mark of kind of job's attempts from attempt on.
func (w *scaleWorld) firstMark(job string, attempt int, kind string) (time.Time, bool) {
	var first time.Time
	for a := attempt; a <= attempt+10; a++ {
		if at, ok := w.tl.when(mark{job, a, kind}); ok && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first, !first.IsZero()
}

// waitMark waits until the timeline has m or ctx ends.
func (w *scaleWorld) waitMark(ctx context.Context, m mark) error {
	for {
		w.tl.mu.Lock()
		_, ok := w.tl.at[m]
		changed := w.tl.changed
		w.tl.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("the run ended before %s of job %s attempt %d", m.kind, m.job, m.attempt)
		}
	}
}

// killUnit SIGKILLs org's worker: the process runtime's unit process, or the container's
// main process through the engine.
func (w *scaleWorld) killUnit(ctx context.Context, org string) (time.Time, error) {
	units, err := w.rt.List(ctx)
	if err != nil {
		return time.Time{}, err
	}
	for _, u := range units {
		if u.Org != org || u.Role != runtime.RoleWorker || !u.Running {
			continue
		}
		if w.docker != nil {
			at := time.Now()
			return at, w.docker.ContainerKill(ctx, u.ID, "KILL")
		}
		pid, err := strconv.Atoi(u.ID)
		if err != nil {
			return time.Time{}, fmt.Errorf("worker %s: %v", u.Name, err)
		}
		at := time.Now()
		return at, syscall.Kill(pid, syscall.SIGKILL)
	}
	return time.Time{}, fmt.Errorf("no running worker of %s", org)
}

// checkCompletedOnce fails the benchmark unless every job is COMPLETED with exactly one
// complete event and every killed job was attempted again; it answers how many attempts
// there were beyond one a job (a kill's, and any release's: a claim that finds the
// previous run's agent still in the home is released uncounted and claimed again).
func (w *scaleWorld) checkCompletedOnce(b *testing.B, jobs []string, killed map[string]bool) int {
	b.Helper()
	var completed, completions, attempts, rerun int
	var killedIDs []string
	for job := range killed {
		killedIDs = append(killedIDs, job)
	}
	err := w.db.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM agent_jobs WHERE id = ANY($1::uuid[]) AND status = 'COMPLETED'),
		       (SELECT count(*) FROM agent_job_events WHERE job_id = ANY($1::uuid[]) AND kind = 'complete'),
		       (SELECT coalesce(sum(attempt), 0) FROM agent_jobs WHERE id = ANY($1::uuid[])),
		       (SELECT count(*) FROM agent_jobs WHERE id = ANY($2::uuid[]) AND attempt >= 2)`, jobs, killedIDs).
		Scan(&completed, &completions, &attempts, &rerun)
	if err != nil {
		b.Fatal(err)
	}
	var distinct int
	if err := w.db.QueryRow(context.Background(), `
		SELECT count(DISTINCT job_id) FROM agent_job_events WHERE job_id = ANY($1::uuid[]) AND kind = 'complete'`, jobs).Scan(&distinct); err != nil {
		b.Fatal(err)
	}
	n := len(jobs)
	if completed != n || completions != n || distinct != n || rerun != len(killed) {
		b.Fatalf("of %d jobs: %d COMPLETED, %d complete events for %d jobs; %d of %d killed jobs attempted again",
			n, completed, completions, distinct, rerun, len(killed))
	}
	return attempts - n
}

// reportAttempts says what ended the dispatchers' attempts that did not complete their job
// (the extra attempts): how many by outcome, and the most frequent reasons, cut to 80
// characters, from claim_attempts.
func (w *scaleWorld) reportAttempts(b *testing.B, jobs []string) {
	b.Helper()
	rows, err := w.cfg.DB.Query(context.Background(), `
		SELECT coalesce(outcome, 'none'), left(coalesce(reason, ''), 80), count(*) FROM claim_attempts
		WHERE job_id = ANY($1) AND outcome IS DISTINCT FROM 'completed'
		GROUP BY 1, 2 ORDER BY 3 DESC`, jobs)
	if err != nil {
		b.Fatal(err)
	}
	byOutcome := map[string]int{}
	shown := 0
	for rows.Next() {
		var outcome, reason string
		var n int
		if err := rows.Scan(&outcome, &reason, &n); err != nil {
			b.Fatal(err)
		}
		byOutcome[outcome] += n
		if shown < 12 {
			b.Logf("%d attempts %s: %s", n, outcome, reason)
			shown++
		}
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	for outcome, n := range byOutcome {
		b.ReportMetric(float64(n), "attempts-"+outcome)
	}
}

// memoryWatch samples this process's Go heap and, on the process runtime, the workers'
// peak RSS, until stopped; it resets this process's and the services' peak RSS first.
type memoryWatch struct {
	w      *scaleWorld
	stopc  chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	heap   uint64
	byRole map[string]uint64 // worker, run-job, agent: the largest VmHWM seen, in bytes
}

type peak struct {
	name string
	mb   float64
}

func (w *scaleWorld) watchMemory(ctx context.Context) *memoryWatch {
	for _, pid := range []int{os.Getpid(), w.backend.cmd.Process.Pid, w.gateway.cmd.Process.Pid} {
		// 5 resets the peak RSS (VmHWM) to the current RSS.
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
	}
	m := &memoryWatch{w: w, stopc: make(chan struct{}), done: make(chan struct{}), byRole: map[string]uint64{}}
	go func() {
		defer close(m.done)
		sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		heapTick, procTick := time.NewTicker(100*time.Millisecond), time.NewTicker(250*time.Millisecond)
		defer heapTick.Stop()
		defer procTick.Stop()
		for {
			select {
			case <-m.stopc:
				return
			case <-ctx.Done():
				return
			case <-heapTick.C:
				metrics.Read(sample)
				m.mu.Lock()
				m.heap = max(m.heap, sample[0].Value.Uint64())
				m.mu.Unlock()
			case <-procTick.C:
				if w.docker == nil {
					m.sampleProcs()
				}
			}
		}
	}()
	return m
}

// sampleProcs notes the peak RSS of every worker, run-job and agent process now running.
func (m *memoryWatch) sampleProcs() {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	hermes, agent := filepath.Join(binDir, "hermes-host"), filepath.Join(binDir, "scripted-agent")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		role := ""
		switch {
		case len(args) >= 3 && args[0] == hermes && args[1] == "worker" && args[2] == "idle":
			role = "worker"
		case len(args) >= 3 && args[0] == hermes && args[1] == "worker" && args[2] == "run-job":
			role = "run-job"
		case args[0] == agent || filepath.Base(args[0]) == "scripted-agent":
			role = "agent"
		default:
			continue
		}
		if hwm := vmHWM(e.Name()); hwm > 0 {
			m.mu.Lock()
			m.byRole[role] = max(m.byRole[role], hwm)
			m.mu.Unlock()
		}
	}
}

// vmHWM is a process's peak RSS in bytes, 0 when unknown.
func vmHWM(pid string) uint64 {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// stop ends the sampling and answers the peaks, in MB (10^6 bytes).
func (m *memoryWatch) stop(b *testing.B) []peak {
	b.Helper()
	close(m.stopc)
	<-m.done
	mb := func(n uint64) float64 { return float64(n) / 1e6 }
	peaks := []peak{
		{"this-process-rss", mb(vmHWM(strconv.Itoa(os.Getpid())))},
		{"this-process-heap", mb(m.heap)},
		{"backend-rss", mb(vmHWM(strconv.Itoa(m.w.backend.cmd.Process.Pid)))},
		{"gateway-rss", mb(vmHWM(strconv.Itoa(m.w.gateway.cmd.Process.Pid)))},
	}
	if m.w.docker == nil {
		for _, role := range []string{"worker", "run-job", "agent"} {
			if m.byRole[role] == 0 {
				b.Fatalf("no %s process was seen", role)
			}
			peaks = append(peaks, peak{"max-" + role + "-rss", mb(m.byRole[role])})
		}
		return peaks
	}
	// On Docker: every worker container's memory peak (the cgroup's max_usage).
	units, err := m.w.rt.List(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	var usage []uint64
	for _, u := range units {
		if u.Role != runtime.RoleWorker {
			continue
		}
		st, err := m.w.docker.ContainerStatsOneShot(context.Background(), u.ID)
		if err != nil {
			b.Fatal(err)
		}
		var s container.StatsResponse
		err = json.NewDecoder(st.Body).Decode(&s)
		st.Body.Close()
		if err != nil {
			b.Fatal(err)
		}
		if s.MemoryStats.MaxUsage > 0 {
			usage = append(usage, s.MemoryStats.MaxUsage)
		}
	}
	if len(usage) == 0 {
		b.Fatalf("the engine reported no container's memory peak (max_usage is cgroup v1's)")
	}
	slices.Sort(usage)
	return append(peaks, peak{"max-container", mb(usage[len(usage)-1])}, peak{"median-container", mb(usage[len(usage)/2])})
}
