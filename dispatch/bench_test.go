package dispatch_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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

	"hermeshost/internal/latency"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"

	"hermeshost/dispatch"
	"hermeshost/dispatch/runtime"
	"hermeshost/gateway"
	"hermeshost/internal/hosttest"
	"hermeshost/orghome"
	"hermeshost/pg/pgtest"
	"hermeshost/sartiq"
	"hermeshost/sartiq/backend"
	"hermeshost/sartiq/backend/backendtest"
	"hermeshost/scriptedagent"
	"hermeshost/worker"
)

// The dispatcher's benchmarks time what happens in this process: a claim when its response
// reaches the dispatcher's HTTP client, a worker's progress line when it leaves the worker
// for the dispatcher.

// benchSlow lets the runs at the product's default timings go (about a minute each);
// `make bench` sets it.
const benchSlow = "HERMES_BENCH_SLOW"

var runJob = []string{"hermes-host", "worker", "run-job"}

// mark is one thing that happened to one attempt of a job.
type mark struct {
	job     string
	attempt int
	kind    string // claim, reclaim, start, agent_start, exit, exit-failed
}

// timeline records when claims and workers' progress lines happened, and wakes whoever
// waits for one.
type timeline struct {
	mu      sync.Mutex
	at      map[mark]time.Time
	exitsOK int // run-job execs that exited 0
	changed chan struct{}
}

func newTimeline() *timeline {
	return &timeline{at: map[mark]time.Time{}, changed: make(chan struct{})}
}

// record notes m at t unless it was seen before (a resumed agent starts again).
func (tl *timeline) record(m mark, t time.Time) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if _, seen := tl.at[m]; !seen {
		tl.at[m] = t
	}
	tl.wake()
}

// exited notes how an attempt's run-job ended: kind exit when with status 0.
func (tl *timeline) exited(job string, attempt int, ok bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	kind := "exit-failed"
	if ok {
		kind = "exit"
		tl.exitsOK++
	}
	tl.at[mark{job, attempt, kind}] = time.Now()
	tl.wake()
}

func (tl *timeline) wake() {
	close(tl.changed)
	tl.changed = make(chan struct{})
}

func (tl *timeline) when(m mark) (time.Time, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	t, ok := tl.at[m]
	return t, ok
}

func (tl *timeline) okExits() int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.exitsOK
}

// wait blocks until cond, which is called with tl.mu held, holds.
func (tl *timeline) wait(b *testing.B, within time.Duration, what string, cond func() bool) {
	b.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		tl.mu.Lock()
		ok, changed := cond(), tl.changed
		tl.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			b.Fatalf("timed out after %s waiting for %s", within, what)
		}
	}
}

// jobCall matches the backend calls the timeline records.
var jobCall = regexp.MustCompile(`/agent-jobs/([^/]+)/(claim|reclaim)$`)

// observer is an HTTP transport that records claims and re-claims as their responses
// arrive.
type observer struct {
	tl   *timeline
	next http.RoundTripper
}

func (o observer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := o.next.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	m := jobCall.FindStringSubmatch(req.URL.Path)
	if m == nil {
		return resp, nil
	}
	at := time.Now()
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	var c sartiq.Claim
	if json.Unmarshal(body, &c) == nil {
		o.tl.record(mark{m[1], c.Job.Attempt, m[2]}, at)
	}
	return resp, nil
}

// observedRuntime records every run-job's start and agent_start lines as they leave the
// worker, and how each run-job ended.
type observedRuntime struct {
	runtime.Runtime
	tl *timeline
}

func (r observedRuntime) Exec(ctx context.Context, org string, cmd runtime.Command) (runtime.ExitStatus, error) {
	if !slices.Equal(cmd.Args, runJob) {
		return r.Runtime.Exec(ctx, org, cmd)
	}
	p := &progressStamper{tl: r.tl, next: cmd.Stdout}
	cmd.Stdout = p
	st, err := r.Runtime.Exec(ctx, org, cmd)
	job, attempt := p.attemptOf()
	r.tl.exited(job, attempt, err == nil && st.Code == 0)
	return st, err
}

// progressStamper passes a worker's stdout on, noting when its start and agent_start
// lines arrive.
type progressStamper struct {
	tl      *timeline
	next    io.Writer
	partial []byte

	mu      sync.Mutex
	job     string
	attempt int
}

func (p *progressStamper) Write(b []byte) (int, error) {
	at := time.Now()
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			break
		}
		p.line(p.partial[:i], at)
		p.partial = p.partial[i+1:]
	}
	if p.next == nil {
		return len(b), nil
	}
	return p.next.Write(b)
}

func (p *progressStamper) line(line []byte, at time.Time) {
	var ev struct {
		Event string `json:"event"`
		Data  struct {
			Job     string `json:"job"`
			Attempt int    `json:"attempt"`
		} `json:"data"`
	}
	if json.Unmarshal(line, &ev) != nil {
		return
	}
	switch ev.Event {
	case "start":
		p.mu.Lock()
		p.job, p.attempt = ev.Data.Job, ev.Data.Attempt
		p.mu.Unlock()
		p.tl.record(mark{ev.Data.Job, ev.Data.Attempt, "start"}, at)
	case "agent_start":
		if job, attempt := p.attemptOf(); job != "" {
			p.tl.record(mark{job, attempt, "agent_start"}, at)
		}
	}
}

func (p *progressStamper) attemptOf() (string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.job, p.attempt
}

// benchWorld is a backend (without its demo jobs), a gateway and a runtime for one
// benchmark, with a dispatcher configuration on them and a timeline of what happened.
type benchWorld struct {
	id      string // sets this world's orgs, containers and image apart
	backend *backendtest.Backend
	bot     *sartiq.Client
	rt      runtime.Runtime
	tl      *timeline
	cfg     dispatch.Config

	mu        sync.Mutex
	cycleErrs []error
}

type worldOptions struct {
	runtime    string        // "process" (the default) or "docker"
	staleAfter time.Duration // the backend's STALE_AFTER; zero for its default
	heartbeat  time.Duration // the workers' HEARTBEAT_INTERVAL; zero for its default
}

const (
	defaultHeartbeat = 10 * time.Second // HEARTBEAT_INTERVAL's default
	defaultPoll      = 5 * time.Second  // POLL_INTERVAL's default
	gatewaySecret    = "gw-secret"
)

func newBenchWorld(b *testing.B, o worldOptions) *benchWorld {
	b.Helper()
	ctx := context.Background()
	w := &benchWorld{id: strings.ToLower(rand.Text()[:6]), tl: newTimeline()}
	w.backend = backendtest.Start(b, backend.Config{StaleAfter: o.staleAfter})
	// The demo orgs' jobs would run beside the measured ones (and, on an engine, in
	// containers named for orgs another run may use).
	if _, err := w.backend.DB.Exec(ctx, `DELETE FROM agent_jobs WHERE seed_key LIKE 'demo:%'`); err != nil {
		b.Fatal(err)
	}
	bot, err := sartiq.New(w.backend.URL, backendtest.BotToken,
		sartiq.WithHTTPClient(&http.Client{Timeout: time.Minute, Transport: observer{tl: w.tl, next: http.DefaultTransport}}))
	if err != nil {
		b.Fatal(err)
	}
	w.bot = bot
	gatewayURL := hosttest.DemoGateway(b, gatewaySecret, "host-key")
	_, db := pgtest.Schema(b)
	root := b.TempDir()
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	rc := runtime.Config{
		Instance: "dispatch-bench", Scope: "dispatch-bench-" + w.id,
		OrgsRoot: filepath.Join(root, "orgs"), WorkspacesRoot: filepath.Join(root, "workspaces"),
		WorkerIdle: []string{"hermes-host", "worker", "idle"}, BinDir: binDir, Output: io.Discard,
		Logger: log, Network: "host",
	}
	var rt runtime.Runtime
	if o.runtime == "docker" {
		rc.WorkerImage = buildWorkerImage(b, rc.Scope, w.id)
		rc.DashboardImage = rc.WorkerImage
		rt, err = runtime.NewDocker(ctx, rc)
	} else {
		rt, err = runtime.NewProcess(rc)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rt.Close() })
	w.rt = observedRuntime{Runtime: rt, tl: w.tl}
	heartbeat := o.heartbeat
	if heartbeat == 0 {
		heartbeat = defaultHeartbeat
	}
	w.cfg = dispatch.Config{
		Instance: "dispatch-bench", Bot: bot, APIURL: w.backend.URL, Runtime: w.rt, DB: db, OrgsRoot: rc.OrgsRoot,
		GatewayURL: gatewayURL, GatewayKey: "host-key", GatewaySecret: gatewaySecret,
		WorkerModel: gateway.DemoWorkerModel, VisionModel: gateway.DemoVisionModel,
		ClaimEnabled: true, MaxOrgs: 64,
		WorkerEnv: []string{"HERMES_BIN=scripted-agent", "HEARTBEAT_INTERVAL=" + heartbeat.String()},
		Log:       log,
	}
	return w
}

// buildWorkerImage builds the worker image FROM scratch from the test binaries, or skips
// the benchmark when no engine answers. The image and every container of scope are removed
// when the benchmark ends.
func buildWorkerImage(b *testing.B, scope, id string) string {
	b.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		b.Skipf("Docker run skipped: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pingCtx, cancelPing := context.WithTimeout(ctx, 5*time.Second)
	_, err = cli.Ping(pingCtx)
	cancelPing()
	if err != nil {
		cli.Close()
		b.Skipf("Docker run skipped: no engine answered at %s: %v", cli.DaemonHost(), err)
	}
	tag := "hermes-dispatch-bench:" + id
	b.Cleanup(func() {
		ctx := context.Background()
		list, err := cli.ContainerList(ctx, container.ListOptions{All: true,
			Filters: filters.NewArgs(filters.Arg("label", runtime.LabelScope+"="+scope))})
		if err != nil {
			b.Error(err)
		}
		for _, c := range list {
			if err := cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil {
				b.Error(err)
			}
		}
		if _, err := cli.ImageRemove(ctx, tag, image.RemoveOptions{Force: true, PruneChildren: true}); err != nil {
			b.Error(err)
		}
		cli.Close()
	})
	if _, err := runtime.BuildScratchImage(ctx, cli, runtime.ScratchImage{
		Tag:      tag,
		Binaries: []string{filepath.Join(binDir, "hermes-host"), filepath.Join(binDir, "scripted-agent")},
		Cmd:      []string{"hermes-host", "worker", "idle"},
	}); err != nil {
		b.Fatal(err)
	}
	return tag
}

func (w *benchWorld) org(name string) string { return "bench-" + w.id + "-" + name }

// warm makes org's home and SOUL.md as the dispatcher would, and starts its worker.
func (w *benchWorld) warm(b *testing.B, org string) runtime.Ensured {
	b.Helper()
	dir := filepath.Join(w.cfg.OrgsRoot, org)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	home, err := orghome.OpenHome(org, dir)
	if err != nil {
		b.Fatal(err)
	}
	home.Log = w.cfg.Log
	_, err = home.EnsureSoul(orghome.Identity{OrgID: org, DisplayName: org})
	home.Close()
	if err != nil {
		b.Fatal(err)
	}
	e, err := w.rt.EnsureWorker(context.Background(), org)
	if err != nil {
		b.Fatal(err)
	}
	return e
}

func (w *benchWorld) dispatcher(b *testing.B) *dispatch.Dispatcher {
	d := dispatch.New(w.cfg)
	b.Cleanup(d.Close)
	return d
}

// run runs d every poll until the benchmark ends, keeping the errors of its cycles.
func (w *benchWorld) run(b *testing.B, d *dispatch.Dispatcher, poll time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx, dispatch.RunOptions{Poll: poll, Cycled: func(_ int, err error) {
			if err != nil && ctx.Err() == nil {
				w.mu.Lock()
				w.cycleErrs = append(w.cycleErrs, err)
				w.mu.Unlock()
			}
		}})
	}()
	b.Cleanup(func() {
		cancel()
		<-done
		w.mu.Lock()
		defer w.mu.Unlock()
		if err := errors.Join(w.cycleErrs...); err != nil {
			b.Errorf("dispatcher cycles failed: %v", err)
		}
	})
}

// cycleOne queues a job for org, claims it with one cycle of d and waits for it to end.
func (w *benchWorld) cycleOne(b *testing.B, d *dispatch.Dispatcher, org string) string {
	b.Helper()
	job := w.backend.AddJob(b, org, sartiq.TypeProductIngest)
	n, err := d.Cycle(context.Background())
	if err != nil || n != 1 {
		b.Fatalf("cycle started %d jobs (%v), want the one queued", n, err)
	}
	d.Wait()
	if _, ok := w.tl.when(mark{job, 1, "exit"}); !ok {
		b.Fatalf("job %s did not end with its worker exiting 0", job)
	}
	return job
}

// completed counts the backend's COMPLETED jobs.
func (w *benchWorld) completed(b *testing.B) int {
	b.Helper()
	var n int
	if err := w.backend.DB.QueryRow(context.Background(), `SELECT count(*) FROM agent_jobs WHERE status = 'COMPLETED'`).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkClaimToAgentStart is, per job on a warm worker, the time from the dispatcher's
// claim to the worker's agent_start line, beside a bare runtime exec of `hermes-host
// --help` in the same worker: the difference is what the dispatcher and the worker do
// before the agent starts (record the claim, keep the home lease, check SOUL.md, ensure the
// worker, fence the delivery; fetch the manifest, lock the home, start the job, open the
// token proxy). ns/op is a whole job, from queueing it to its worker's exit.
func BenchmarkClaimToAgentStart(b *testing.B) {
	for _, kind := range []string{"process", "docker"} {
		b.Run(kind, func(b *testing.B) {
			w := newBenchWorld(b, worldOptions{runtime: kind})
			ctx := context.Background()
			org := w.org("warm")
			warmed := w.warm(b, org)
			d := w.dispatcher(b)
			// Cycles come from the benchmark; the org lease is kept fresh as Run would.
			keep, stopKeeping := context.WithCancel(ctx)
			var kept sync.WaitGroup
			kept.Go(func() { d.KeepOwnership(keep) })
			defer func() {
				stopKeeping()
				kept.Wait()
			}()
			w.cycleOne(b, d, org) // owns the org and warms every connection before timing
			b.Run("baseline-exec-help", func(b *testing.B) {
				lat := make([]time.Duration, 0, 256)
				for b.Loop() {
					began := time.Now()
					st, err := w.rt.Exec(ctx, org, runtime.Command{Args: []string{"hermes-host", "--help"}})
					lat = append(lat, time.Since(began))
					if err != nil || st.Code != 0 {
						b.Fatalf("exec hermes-host --help: %v %v", st, err)
					}
				}
				latency.Report(b, lat)
			})
			b.Run("dispatcher", func(b *testing.B) {
				lat := make([]time.Duration, 0, 256)
				for b.Loop() {
					job := w.cycleOne(b, d, org)
					claimed, ok1 := w.tl.when(mark{job, 1, "claim"})
					agent, ok2 := w.tl.when(mark{job, 1, "agent_start"})
					if !ok1 || !ok2 {
						b.Fatalf("job %s: claim seen %v, agent_start seen %v", job, ok1, ok2)
					}
					lat = append(lat, agent.Sub(claimed))
				}
				latency.Report(b, lat)
			})
			if e, err := w.rt.EnsureWorker(ctx, org); err != nil || e.Cold || e.ID != warmed.ID {
				b.Fatalf("the worker did not stay warm: %+v (was %s) %v", e, warmed.ID, err)
			}
		})
	}
}

// Each iteration of BenchmarkJobsPerSecond queues jobsPerOrg jobs for each of benchOrgs
// orgs (one product_ingest and one guidelines_extraction) and drains them.
const benchOrgs, jobsPerOrg = 50, 2

// BenchmarkJobsPerSecond drains 50 orgs' small jobs with the scripted agent on the process
// runtime, through one dispatcher running Run with a 100 ms poll. The baseline claims and
// runs the same jobs with `worker run-job` directly, one goroutine per org and no
// dispatcher (no poll, no leases, no mirror): the most this machine does with these jobs
// at the same concurrency, so the ratio is what the dispatcher itself costs. (One org run
// serially would mostly measure the cores and the poll interval instead.) Both time from
// the first job queued to the last worker's exit, with every worker warm.
func BenchmarkJobsPerSecond(b *testing.B) {
	b.Run("baseline-run-job", func(b *testing.B) {
		w := newBenchWorld(b, worldOptions{})
		orgs := w.warmOrgs(b)
		w.runDirect(b, orgs, 1) // warms every connection before timing
		for b.Loop() {
			w.runDirect(b, orgs, jobsPerOrg)
		}
		w.reportRate(b, orgs)
	})
	b.Run("dispatcher", func(b *testing.B) {
		w := newBenchWorld(b, worldOptions{})
		orgs := w.warmOrgs(b)
		w.run(b, w.dispatcher(b), 100*time.Millisecond)
		w.drain(b, orgs, 1) // the dispatcher owns every org before timing
		for b.Loop() {
			w.drain(b, orgs, jobsPerOrg)
		}
		w.reportRate(b, orgs)
	})
}

func (w *benchWorld) warmOrgs(b *testing.B) []string {
	orgs := make([]string, benchOrgs)
	for i := range orgs {
		orgs[i] = w.org(fmt.Sprintf("%02d", i))
		w.warm(b, orgs[i])
	}
	return orgs
}

func (w *benchWorld) reportRate(b *testing.B, orgs []string) {
	b.Helper()
	jobs := b.N * len(orgs) * jobsPerOrg
	if done := w.completed(b); done != jobs+len(orgs) {
		b.Fatalf("%d jobs completed at the backend, want %d", done, jobs+len(orgs))
	}
	b.ReportMetric(float64(jobs)/b.Elapsed().Seconds(), "jobs/s")
}

// addJobs queues per jobs for org, alternating the two types.
func (w *benchWorld) addJobs(b *testing.B, org string, per int) []string {
	jobs := make([]string, per)
	for i := range jobs {
		typ := sartiq.TypeProductIngest
		if i%2 == 1 {
			typ = sartiq.TypeGuidelinesExtraction
		}
		jobs[i] = w.backend.AddJob(b, org, typ)
	}
	return jobs
}

// drain queues per jobs for every org and waits until as many more run-jobs exited 0.
func (w *benchWorld) drain(b *testing.B, orgs []string, per int) {
	b.Helper()
	target := w.tl.okExits() + len(orgs)*per
	for _, org := range orgs {
		w.addJobs(b, org, per)
	}
	w.tl.wait(b, 5*time.Minute, fmt.Sprintf("%d jobs to end", len(orgs)*per), func() bool { return w.tl.exitsOK >= target })
}

// runDirect queues per jobs for every org and runs each org's jobs in turn, claimed by
// the bot and handed to `worker run-job` as the dispatcher would hand them, orgs at once.
func (w *benchWorld) runDirect(b *testing.B, orgs []string, per int) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(orgs))
	for _, org := range orgs {
		jobs := w.addJobs(b, org, per)
		wg.Go(func() {
			for _, job := range jobs {
				if err := w.runJob(org, job); err != nil {
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
}

// claimBare claims job of org with the bot and makes what a bare `worker run-job` is given
// for it, as the dispatcher would give it: the environment and the assignment.
func (w *benchWorld) claimBare(ctx context.Context, org, job string) (env []string, assignment []byte, err error) {
	c, err := w.bot.Claim(ctx, job)
	if err != nil {
		return nil, nil, err
	}
	return w.bareRun(org, c)
}

// bareRun is what a bare `worker run-job` is given for claim c of org.
func (w *benchWorld) bareRun(org string, c *sartiq.Claim) (env []string, assignment []byte, err error) {
	key, err := gateway.OrgKey(gatewaySecret, org)
	if err != nil {
		return nil, nil, err
	}
	assignment, _ = json.Marshal(worker.Assignment{Job: c.Job, OrganizationID: c.OrganizationID, ManifestURL: c.ManifestURL})
	env = append([]string{
		"SARTIQ_TOKEN=" + c.JobToken, "SARTIQ_API_URL=" + w.cfg.APIURL,
		"GATEWAY_URL=" + w.cfg.GatewayURL, "GATEWAY_KEY=" + key, "WORKER_MODEL=" + w.cfg.WorkerModel,
	}, w.cfg.WorkerEnv...)
	return env, assignment, nil
}

func (w *benchWorld) runJob(org, job string) error {
	ctx := context.Background()
	env, assignment, err := w.claimBare(ctx, org, job)
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	st, err := w.rt.Exec(ctx, org, runtime.Command{Args: runJob, Env: env, Stdin: bytes.NewReader(assignment), Stderr: &stderr})
	if err != nil || st.Code != 0 {
		return fmt.Errorf("run-job %s of %s: %v %v\n%s", job, org, st, err, stderr.String())
	}
	return nil
}

// BenchmarkKillToRerun is the time from SIGKILL of an org's worker, mid-job, to the next
// attempt's claim, start and agent_start lines, with the backend's clock following real
// time. The kill lands as the agent starts, right after the claim (the job's last sign of
// life before any heartbeat). The dispatcher, alive, ends the attempt as soon as the run
// ends and asks for a cycle at once, which claims the job again; stale-after-kill-s is
// when the job would have gone stale, what a dead dispatcher's job waits for (the
// stale-heartbeat path, re-claimed on the poll after it). The run at the product's defaults
// (heartbeat 10s, STALE_AFTER 45s, poll 5s) goes only with HERMES_BENCH_SLOW=1 (make bench
// sets it).
func BenchmarkKillToRerun(b *testing.B) {
	for _, s := range []struct {
		heartbeat, stale, poll time.Duration
		slow                   bool
	}{
		{200 * time.Millisecond, 2 * time.Second, 200 * time.Millisecond, false},
		{defaultHeartbeat, backend.DefaultStaleAfter, defaultPoll, true},
	} {
		b.Run(fmt.Sprintf("heartbeat=%s,stale=%s,poll=%s", s.heartbeat, s.stale, s.poll), func(b *testing.B) {
			if s.slow && os.Getenv(benchSlow) == "" {
				b.Skipf("about a minute a kill at the default timings; set %s=1 to run it (make bench does)", benchSlow)
			}
			w := newBenchWorld(b, worldOptions{staleAfter: s.stale, heartbeat: s.heartbeat})
			w.backend.Clock.Follow()
			org := w.org("kill")
			w.warm(b, org)
			w.run(b, w.dispatcher(b), s.poll)
			// The first attempt stalls before its first write, so the kill finds it running.
			knobs := filepath.Join(w.cfg.OrgsRoot, org, scriptedagent.KnobsFile)
			stall, _ := json.Marshal(scriptedagent.Knobs{StallAtWrite: 1})
			within := 2*(s.stale+s.poll) + time.Minute
			var floor, toReclaim, toStart, toAgent []time.Duration
			for b.Loop() {
				if err := os.WriteFile(knobs, stall, 0o600); err != nil {
					b.Fatal(err)
				}
				job := w.backend.AddJob(b, org, sartiq.TypeProductIngest)
				w.tl.wait(b, within, "the first attempt's agent to start", func() bool {
					_, ok := w.tl.at[mark{job, 1, "agent_start"}]
					return ok
				})
				// The agent read its knobs as it started; the re-claimed attempt runs through.
				if err := os.Remove(knobs); err != nil {
					b.Fatal(err)
				}
				killed := w.killWorker(b, org)
				w.tl.wait(b, within, "the re-claimed attempt to end", func() bool {
					_, ok := w.tl.at[mark{job, 2, "exit"}]
					_, failed := w.tl.at[mark{job, 2, "exit-failed"}]
					return ok || failed
				})
				claimed, ok := w.tl.when(mark{job, 1, "claim"})
				if !ok {
					b.Fatalf("job %s: no claim of attempt 1", job)
				}
				floor = append(floor, claimed.Add(s.stale).Sub(killed))
				// Attempt 2 is a claim when the dispatcher ended the crashed attempt at
				// once, a re-claim when the job had to go stale first.
				rerun := "claim"
				if _, stale := w.tl.when(mark{job, 2, "reclaim"}); stale {
					rerun = "reclaim"
				}
				for _, m := range []struct {
					kind string
					into *[]time.Duration
				}{{rerun, &toReclaim}, {"start", &toStart}, {"agent_start", &toAgent}, {"exit", nil}} {
					at, ok := w.tl.when(mark{job, 2, m.kind})
					if !ok {
						b.Fatalf("job %s: no %s of attempt 2", job, m.kind)
					}
					if m.into != nil {
						*m.into = append(*m.into, at.Sub(killed))
					}
				}
			}
			if done := w.completed(b); done != len(toAgent) {
				b.Fatalf("%d jobs completed at the backend after %d kills", done, len(toAgent))
			}
			b.ReportMetric(median(floor).Seconds(), "stale-after-kill-s")
			b.ReportMetric(median(toReclaim).Seconds(), "kill-to-claim-s")
			b.ReportMetric(median(toStart).Seconds(), "kill-to-start-s")
			b.ReportMetric(median(toAgent).Seconds(), "kill-to-agent-s")
			b.ReportMetric(slices.Max(toAgent).Seconds(), "max-kill-to-agent-s")
		})
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// killWorker sends SIGKILL to org's worker process (the process runtime's unit, as a
// container's main process on an engine): the run-job beside it and its agent die with it.
func (w *benchWorld) killWorker(b *testing.B, org string) time.Time {
	b.Helper()
	units, err := w.rt.List(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	for _, u := range units {
		if u.Org != org || u.Role != runtime.RoleWorker || !u.Running {
			continue
		}
		pid, err := strconv.Atoi(u.ID)
		if err != nil {
			b.Fatalf("worker %s: %v", u.Name, err)
		}
		killed := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		return killed
	}
	b.Fatalf("no running worker of %s: %+v", org, units)
	return time.Time{}
}
