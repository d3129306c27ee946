package worker_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"hermeshost/gateway"
	"hermeshost/sartiq"
	"hermeshost/scriptedagent"
	"hermeshost/service"
	"hermeshost/worker"
)

// A worker asked to stop (its context ends: SIGTERM to run-job, or EOF on a held stdin)
// releases its job, which is then no attempt: QUEUED again, a release and neither a fail
// nor a re-claim in its log, and what was persisted kept for the next attempt.

// progressWatch passes on progress lines and closes reached once want of them went by.
type progressWatch struct {
	want    int
	seen    int
	partial []byte
	reached chan struct{}
}

func watchProgress(want int) *progressWatch {
	return &progressWatch{want: want, reached: make(chan struct{})}
}

func (p *progressWatch) Write(b []byte) (int, error) {
	p.partial = append(p.partial, b...)
	for {
		line, rest, ok := bytes.Cut(p.partial, []byte("\n"))
		if !ok {
			return len(b), nil
		}
		p.partial = rest
		if bytes.Contains(line, []byte(`"event":"progress"`)) {
			if p.seen++; p.seen == p.want {
				close(p.reached)
			}
		}
	}
}

// await waits until the run has written the watched progress, failing if it ended first.
func (p *progressWatch) await(t *testing.T, done <-chan result) {
	t.Helper()
	select {
	case <-p.reached:
	case r := <-done:
		t.Fatalf("the run ended before %d progress lines: %+v %v\n%s%s", p.want, r.outcome, r.err, r.stdout, r.stderr)
	case <-time.After(60 * time.Second):
		t.Fatalf("no %d progress lines within a minute", p.want)
	}
}

func awaitResult(t *testing.T, done <-chan result) result {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("the worker kept running after it was asked to stop")
		return result{}
	}
}

// workerConfig is what run-job would configure for org, for worker.Run in this process.
func (w *world) workerConfig(org, token string, progress io.Writer) worker.Config {
	w.t.Helper()
	key, err := gateway.OrgKey(gatewaySecret, org)
	if err != nil {
		w.t.Fatal(err)
	}
	api, err := url.Parse(w.backend.URL)
	if err != nil {
		w.t.Fatal(err)
	}
	// The test binary cannot be the sartiq command, as run-job is: hermes-host under that name.
	sartiqBin := filepath.Join(w.t.TempDir(), "sartiq")
	if err := os.Symlink(filepath.Join(binDir, "hermes-host"), sartiqBin); err != nil {
		w.t.Fatal(err)
	}
	return worker.Config{
		Org: org, Home: w.home(org), API: api, Token: service.Secret(token),
		HermesBin: filepath.Join(binDir, "scripted-agent"), MaxTurns: 10, MaxResumes: 3,
		Heartbeat: 200 * time.Millisecond, GatewayURL: w.gateway, GatewayKey: service.Secret(key),
		Model: "demo-worker", SartiqBin: sartiqBin, ReportEnabled: true,
		Log: slog.New(slog.NewTextHandler(w.t.Output(), nil)), Progress: progress,
	}
}

// runInProcess runs worker.Run for claim; it only reads its arguments, so it may run in
// a goroutine of its own.
func runInProcess(ctx context.Context, cfg worker.Config, claim *sartiq.Claim, edit func(*worker.Assignment)) result {
	var stdout bytes.Buffer
	if cfg.Progress == nil {
		cfg.Progress = &stdout
	} else {
		cfg.Progress = io.MultiWriter(&stdout, cfg.Progress)
	}
	a := worker.Assignment{Job: claim.Job, OrganizationID: claim.OrganizationID, ManifestURL: claim.ManifestURL}
	if edit != nil {
		edit(&a)
	}
	api, err := sartiq.New(cfg.API.String(), claim.JobToken)
	if err != nil {
		return result{err: err}
	}
	out, err := worker.Run(ctx, cfg, api, a)
	r := result{err: err, stdout: stdout.String(), jobToken: claim.JobToken}
	r.parseProgress()
	if out.Status != r.outcome.Status || out.Reason != r.outcome.Reason {
		r.err = fmt.Errorf("Run returned %+v, its outcome line says %+v", out, r.outcome)
	}
	return r
}

// eventKinds is the job's backend log, oldest first.
func (w *world) eventKinds(ctx context.Context, job string) []string {
	w.t.Helper()
	return w.column(w.backend.DB.Query(ctx, `SELECT kind FROM agent_job_events WHERE job_id = $1 ORDER BY id`, job))
}

// column collects a one-column text query, failing the test on any error.
func (w *world) column(rows pgx.Rows, err error) []string {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		w.t.Fatal(err)
	}
	return out
}

// requireReleased checks that the job went back to the queue without counting an attempt.
func (w *world) requireReleased(ctx context.Context, job string) {
	w.t.Helper()
	if j := w.job(ctx, job); j.Status != sartiq.StatusQueued {
		w.t.Fatalf("job status %s, want QUEUED", j.Status)
	}
	kinds := w.eventKinds(ctx, job)
	if !slices.Contains(kinds, sartiq.EventRelease) || slices.Contains(kinds, sartiq.EventFail) || slices.Contains(kinds, sartiq.EventReclaim) {
		w.t.Fatalf("job log %v: want a release, and neither a fail nor a reclaim", kinds)
	}
}

func (w *world) proposalWrites(ctx context.Context, job string) int {
	w.t.Helper()
	var n int
	if err := w.backend.DB.QueryRow(ctx, `SELECT count(*) FROM agent_job_events WHERE job_id = $1 AND kind = 'proposal'`, job).Scan(&n); err != nil {
		w.t.Fatal(err)
	}
	return n
}

func TestStopMidRunReleasesTheJobAndKeepsItsCheckpoint(t *testing.T) {
	w := newWorld(t, "process")
	ctx := context.Background()
	w.knobs("acme", scriptedagent.Knobs{StallAtWrite: 3})
	job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
	claim, err := w.bot.Claim(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	watch := watchProgress(2)
	cfg := w.workerConfig("acme", claim.JobToken, watch)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan result, 1)
	go func() { done <- runInProcess(runCtx, cfg, claim, nil) }()
	watch.await(t, done)
	stop()
	r := awaitResult(t, done)
	if r.err != nil || r.outcome.Status != "released" || !strings.Contains(r.outcome.Reason, "the host stopped the worker") {
		t.Fatalf("outcome %+v, %v", r.outcome, r.err)
	}
	w.requireReleased(ctx, job)
	if left := w.agentProcs(t, job); len(left) > 0 {
		t.Fatalf("agents left running: %v", left)
	}
	check, err := worker.OpenCheckpoint(filepath.Join(w.home("acme"), "workspaces", job), job)
	if err != nil || len(check.Categories()) != 2 {
		t.Fatalf("checkpoint after the stop: %v %v", check, err)
	}

	// The next attempt resumes from what was persisted and completes.
	w.knobs("acme", scriptedagent.Knobs{})
	again := w.runJob(ctx, "acme", job, nil)
	if again.outcome.Status != "completed" {
		t.Fatalf("next attempt %+v\n%s", again.outcome, again.stderr)
	}
	if n := w.proposalWrites(ctx, job); n != 5 {
		t.Fatalf("%d proposal writes: the next attempt re-proposed persisted categories", n)
	}
}

func TestStopBeforeTheAgentStartsReleasesTheJob(t *testing.T) {
	for _, tc := range []struct {
		name string
		// hang serves the manifest and never answers; without it the run is stopped
		// before it begins.
		hang bool
	}{
		{name: "during the manifest download", hang: true},
		{name: "before the run begins"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, "process")
			ctx := context.Background()
			job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
			claim, err := w.bot.Claim(ctx, job)
			if err != nil {
				t.Fatal(err)
			}
			cfg := w.workerConfig("acme", claim.JobToken, nil)
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			var edit func(*worker.Assignment)
			asked := make(chan struct{})
			if tc.hang {
				var once sync.Once
				manifest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					once.Do(func() { close(asked) })
					<-r.Context().Done()
				}))
				defer manifest.Close()
				edit = func(a *worker.Assignment) { a.ManifestURL = manifest.URL + "/manifest" }
			} else {
				stop()
				close(asked)
			}
			done := make(chan result, 1)
			go func() { done <- runInProcess(runCtx, cfg, claim, edit) }()
			select {
			case <-asked:
			case r := <-done:
				t.Fatalf("the run ended before fetching its manifest: %+v %v", r.outcome, r.err)
			}
			stop()
			r := awaitResult(t, done)
			if r.err != nil || r.outcome.Status != "released" || !strings.Contains(r.outcome.Reason, "the host stopped the worker") {
				t.Fatalf("outcome %+v, %v", r.outcome, r.err)
			}
			w.requireReleased(ctx, job)
			if kinds := w.eventKinds(ctx, job); slices.Contains(kinds, sartiq.EventStart) {
				t.Fatalf("job log %v: the job was started", kinds)
			}
			if _, err := os.Stat(filepath.Join(w.home("acme"), "state.db")); !os.IsNotExist(err) {
				t.Fatalf("an agent ran: %v", err)
			}
		})
	}
}

func TestRunJobWithHoldStdinReleasesWhenStdinCloses(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, kind string) {
		w := newWorld(t, kind)
		ctx := context.Background()
		w.knobs("acme", scriptedagent.Knobs{StallAtWrite: 3})
		job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
		claim, err := w.bot.Claim(ctx, job)
		if err != nil {
			t.Fatal(err)
		}
		held, hold := io.Pipe()
		defer hold.Close()
		// What follows the assignment on stdin, such as the newline a json.Encoder writes,
		// is no stop.
		go func() { _, _ = hold.Write([]byte("\n")) }()
		watch := watchProgress(2)
		done := make(chan result, 1)
		go func() {
			done <- w.execLive(ctx, "acme", claim, func(a *worker.Assignment) { a.HoldStdin = true }, live{stdin: held, stdout: watch})
		}()
		watch.await(t, done)
		hold.Close()
		r := awaitResult(t, done)
		if r.err != nil || r.status.Code != 0 || r.outcome.Status != "released" || !strings.Contains(r.outcome.Reason, "stdin closed") {
			t.Fatalf("exit %v %v outcome %+v\n%s", r.status, r.err, r.outcome, r.stderr)
		}
		w.requireReleased(ctx, job)
	})
}

// With a held stdin only its dispatcher stops the run (by closing stdin): a SIGTERM from
// anyone else, the agent killing its parent included, is a crash. The job is not released
// and stays the attempt's, to go stale and be re-claimed, so MAX_ATTEMPTS holds.
func TestRunJobWithHoldStdinTreatsASignalAsACrash(t *testing.T) {
	hostile := filepath.Join(t.TempDir(), "agent-that-kills-its-worker")
	if err := os.WriteFile(hostile, []byte("#!/bin/sh\nkill -TERM $PPID\nexec sleep 30\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		agent []string // HERMES_BIN for the run; none: the scripted agent, signalled by the test
	}{{name: "SIGTERM from outside"}, {name: "the agent kills its parent", agent: []string{"HERMES_BIN=" + hostile}}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, "process")
			ctx := context.Background()
			w.knobs("acme", scriptedagent.Knobs{StallAtWrite: 3})
			job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
			claim, err := w.bot.Claim(ctx, job)
			if err != nil {
				t.Fatal(err)
			}
			held, hold := io.Pipe()
			defer hold.Close()
			watch := watchProgress(2)
			done := make(chan result, 1)
			go func() {
				done <- w.execLive(ctx, "acme", claim, func(a *worker.Assignment) { a.HoldStdin = true }, live{stdin: held, stdout: watch, env: tc.agent})
			}()
			if tc.agent == nil {
				watch.await(t, done)
				if err := syscall.Kill(runJobPID(t), syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			}
			r := awaitResult(t, done)
			if r.err != nil || r.status.Code == 0 || r.outcome.Status != "crashed" || !strings.Contains(r.outcome.Reason, "signalled by something other than its dispatcher") {
				t.Fatalf("exit %v %v outcome %+v\n%s", r.status, r.err, r.outcome, r.stderr)
			}
			if j := w.job(ctx, job); j.Status != sartiq.StatusRunning {
				t.Fatalf("job status %s, want RUNNING: the attempt is the crashed worker's until it goes stale", j.Status)
			}
			if kinds := w.eventKinds(ctx, job); slices.Contains(kinds, sartiq.EventRelease) {
				t.Fatalf("job log %v: a signalled worker released its job", kinds)
			}
			if left := w.agentProcs(t, job); len(left) > 0 {
				t.Fatalf("agents left running: %v", left)
			}
		})
	}
}

func TestRunJobWithoutHoldStdinCompletesWhenStdinClosesAfterTheAssignment(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, kind string) {
		w := newWorld(t, kind)
		ctx := context.Background()
		job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
		// exec's stdin is the assignment alone: it ends right after it.
		r := w.runJob(ctx, "acme", job, nil)
		if r.err != nil || r.status.Code != 0 || r.outcome.Status != "completed" {
			t.Fatalf("exit %v %v outcome %+v\n%s", r.status, r.err, r.outcome, r.stderr)
		}
		if kinds := w.eventKinds(ctx, job); slices.Contains(kinds, sartiq.EventRelease) {
			t.Fatalf("job log %v", kinds)
		}
	})
}

// runJobPID is the `hermes-host worker run-job` the process runtime started for this test.
func runJobPID(t *testing.T) int {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Equal(cmdline, []byte(filepath.Join(binDir, "hermes-host")+"\x00worker\x00run-job\x00")) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after its parenthesis.
		// In a sandbox the test's child is bubblewrap, whose child is the sandbox's pid 1.
		for range 3 {
			var state string
			var ppid int
			if _, err := fmt.Sscan(string(stat[bytes.LastIndexByte(stat, ')')+1:]), &state, &ppid); err != nil {
				break
			}
			if ppid == os.Getpid() {
				return pid
			}
			if stat, err = os.ReadFile(filepath.Join("/proc", strconv.Itoa(ppid), "stat")); err != nil {
				break
			}
		}
	}
	t.Fatal("no run-job process of this test")
	return 0
}
