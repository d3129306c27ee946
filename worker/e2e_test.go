package worker_test

import (
	"bytes"
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
	"slices"
	"strings"

	"testing"
	"time"

	"hermeshost/dispatch/runtime"
	"hermeshost/gateway"
	"hermeshost/internal/hosttest"
	"hermeshost/orghome"
	"hermeshost/sartiq"
	"hermeshost/sartiq/backend"
	"hermeshost/sartiq/backend/backendtest"
	"hermeshost/scriptedagent"
	"hermeshost/worker"
)

// The end-to-end tests run `hermes-host worker run-job` through the process runtime against
// the reference backend and the gateway's demo model, with the scripted agent standing in
// for the Hermes CLI.

var binDir string

const gatewaySecret = "test-gateway-secret"

type world struct {
	t        *testing.T
	backend  *backendtest.Backend
	bot      *sartiq.Client
	gateway  string
	orgsRoot string
	rt       runtime.Runtime
}

func newWorld(t *testing.T, kind string) *world {
	t.Helper()
	if binDir == "" {
		t.Fatal("binaries not built")
	}
	b := backendtest.Start(t, backend.Config{StaleAfter: 30 * time.Second})
	bot, err := sartiq.New(b.URL, backendtest.BotToken)
	if err != nil {
		t.Fatal(err)
	}
	gatewayURL := hosttest.DemoGateway(t, gatewaySecret, "host-key")
	root := t.TempDir()
	for _, org := range []string{"acme", "globex"} {
		if err := os.MkdirAll(filepath.Join(root, "orgs", org), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	cfg := runtime.Config{
		Instance: "worker-e2e", Scope: dockerScope, OrgsRoot: filepath.Join(root, "orgs"), WorkspacesRoot: filepath.Join(root, "workspaces"),
		WorkerIdle: []string{"hermes-host", "worker", "idle"}, BinDir: binDir, Output: io.Discard,
		Logger: slog.New(slog.DiscardHandler), Network: "host", WorkerImage: dockerImage, DashboardImage: dockerImage,
	}
	var rt runtime.Runtime
	var err2 error
	switch kind {
	case "process":
		rt, err2 = runtime.NewProcess(cfg)
	case "docker":
		requireEngine(t)
		hosttest.LockDemoOrgContainers(t, 3*time.Minute)
		rt, err2 = runtime.NewDocker(context.Background(), cfg)
	}
	if err2 != nil {
		t.Fatal(err2)
	}
	t.Cleanup(func() {
		_ = rt.Stop(context.Background(), "acme", runtime.RoleWorker)
		_ = rt.Stop(context.Background(), "globex", runtime.RoleWorker)
		rt.Close()
	})
	return &world{t: t, backend: b, bot: bot, gateway: gatewayURL, orgsRoot: filepath.Join(root, "orgs"), rt: rt}
}

func (w *world) home(org string) string { return filepath.Join(w.orgsRoot, org) }

func (w *world) knobs(org string, k scriptedagent.Knobs) {
	b, _ := json.Marshal(k)
	if err := os.WriteFile(filepath.Join(w.home(org), scriptedagent.KnobsFile), b, 0o600); err != nil {
		w.t.Fatal(err)
	}
}

type result struct {
	status   runtime.ExitStatus
	err      error
	stdout   string
	stderr   string
	events   []map[string]any
	outcome  worker.Outcome
	jobToken string
}

// runJob claims job for real and executes the worker for workerOrg with the assignment,
// after edit (if any) changes it.
func (w *world) runJob(ctx context.Context, workerOrg, job string, edit func(*worker.Assignment)) result {
	w.t.Helper()
	claim, err := w.bot.Claim(ctx, job)
	if err != nil {
		w.t.Fatal(err)
	}
	return w.exec(ctx, workerOrg, claim, edit)
}

func (w *world) exec(ctx context.Context, workerOrg string, claim *sartiq.Claim, edit func(*worker.Assignment)) result {
	w.t.Helper()
	return w.execLive(ctx, workerOrg, claim, edit, live{})
}

// live is what a test does with an exec while it runs.
type live struct {
	stdin  io.Reader // read after the assignment: stdin ends when it does
	stdout io.Writer // sees the exec's stdout as it comes
	env    []string  // more of run-job's environment
}

func (w *world) execLive(ctx context.Context, workerOrg string, claim *sartiq.Claim, edit func(*worker.Assignment), l live) result {
	w.t.Helper()
	a := worker.Assignment{Job: claim.Job, OrganizationID: claim.OrganizationID, ManifestURL: claim.ManifestURL}
	if edit != nil {
		edit(&a)
	}
	in, _ := json.Marshal(a)
	stdin := io.Reader(bytes.NewReader(in))
	if l.stdin != nil {
		stdin = io.MultiReader(stdin, l.stdin)
	}
	key, err := gateway.OrgKey(gatewaySecret, workerOrg)
	if err != nil {
		w.t.Fatal(err)
	}
	// As the dispatcher does: the host ensures the identity before the container starts,
	// so that SOUL.md can be mounted read-only.
	h, err := orghome.OpenHome(workerOrg, w.home(workerOrg))
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := h.EnsureSoul(orghome.Identity{OrgID: workerOrg, DisplayName: workerOrg}); err != nil {
		w.t.Fatal(err)
	}
	h.Close()
	if _, err := w.rt.EnsureWorker(ctx, workerOrg); err != nil {
		w.t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	out := io.Writer(&stdout)
	if l.stdout != nil {
		out = io.MultiWriter(&stdout, l.stdout)
	}
	st, err := w.rt.Exec(ctx, workerOrg, runtime.Command{
		Args: []string{"hermes-host", "worker", "run-job"},
		Env: append([]string{
			"SARTIQ_TOKEN=" + claim.JobToken, "SARTIQ_API_URL=" + w.backend.URL,
			"GATEWAY_URL=" + w.gateway, "GATEWAY_KEY=" + key, "WORKER_MODEL=demo-worker",
			"HERMES_BIN=scripted-agent", "HEARTBEAT_INTERVAL=200ms", "MAX_TURNS=10", "LOG_LEVEL=debug",
		}, l.env...),
		Stdin: stdin, Stdout: out, Stderr: &stderr,
	})
	r := result{status: st, err: err, stdout: stdout.String(), stderr: stderr.String(), jobToken: claim.JobToken}
	r.parseProgress()
	return r
}

// parseProgress reads the progress lines of stdout into events and outcome.
func (r *result) parseProgress() {
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var ev map[string]any
		if json.Unmarshal([]byte(line), &ev) == nil {
			r.events = append(r.events, ev)
			if ev["event"] == "outcome" {
				b, _ := json.Marshal(ev["data"])
				_ = json.Unmarshal(b, &r.outcome)
			}
		}
	}
}

func (r result) kinds() []string {
	var k []string
	for _, e := range r.events {
		k = append(k, fmt.Sprint(e["event"]))
	}
	return k
}

func (w *world) job(ctx context.Context, id string) sartiq.Job {
	w.t.Helper()
	page, err := w.bot.ListJobs(ctx, sartiq.ListJobsParams{Status: "QUEUED,CLAIMED,RUNNING,COMPLETED,FAILED", Type: w.jobType(ctx, id), Limit: 100})
	if err != nil {
		w.t.Fatal(err)
	}
	for _, j := range page.Jobs {
		if j.ID == id {
			return j
		}
	}
	w.t.Fatalf("job %s not listed", id)
	return sartiq.Job{}
}

func (w *world) jobType(ctx context.Context, id string) string {
	var typ string
	if err := w.backend.DB.QueryRow(ctx, `SELECT type FROM agent_jobs WHERE id = $1`, id).Scan(&typ); err != nil {
		w.t.Fatal(err)
	}
	return typ
}

func (w *world) guidelines(ctx context.Context, job string) []string {
	w.t.Helper()
	return w.column(w.backend.DB.Query(ctx, `SELECT category FROM guidelines_proposals WHERE job_id = $1 ORDER BY category`, job))
}

func (w *world) sessions(ctx context.Context, org string) []orghome.Session {
	w.t.Helper()
	h, err := orghome.OpenHome(org, w.home(org))
	if err != nil {
		w.t.Fatal(err)
	}
	defer h.Close()
	st, err := h.OpenState()
	if err != nil {
		w.t.Fatal(err)
	}
	defer st.Close()
	page, err := st.Sessions(ctx, orghome.SessionQuery{Limit: 50})
	if err != nil {
		w.t.Fatal(err)
	}
	return page.Sessions
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

func TestGuidelinesJobEndToEnd(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, kind string) {
		w := newWorld(t, kind)
		ctx := context.Background()
		job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
		// A workspace of a job long gone, past WORKSPACE_RETENTION (168h by default).
		stale := filepath.Join(w.home("acme"), "workspaces", "old-job")
		if err := os.MkdirAll(stale, 0o700); err != nil {
			t.Fatal(err)
		}
		month := time.Now().Add(-30 * 24 * time.Hour)
		if err := os.Chtimes(stale, month, month); err != nil {
			t.Fatal(err)
		}
		r := w.runJob(ctx, "acme", job, nil)
		if r.err != nil || r.status.Code != 0 || r.outcome.Status != "completed" {
			t.Fatalf("worker: %v %v outcome %+v\n%s", r.err, r.status, r.outcome, r.stderr)
		}
		// No write failed: the outcome says nothing of them.
		if strings.Contains(r.stdout, "file_write_errors") {
			t.Fatalf("a run without failed writes reports some:\n%s", r.stdout)
		}
		if _, err := os.Stat(stale); !os.IsNotExist(err) {
			t.Fatalf("the stale workspace was kept: %v", err)
		}
		if _, err := os.Stat(filepath.Join(w.home("acme"), "workspaces", job, "checkpoint.json")); err != nil {
			t.Fatalf("the job's own workspace: %v", err)
		}
		if got := w.guidelines(ctx, job); !slices.Equal(got, sorted(backend.DemoCategories)) {
			t.Fatalf("proposals: %v", got)
		}
		if j := w.job(ctx, job); j.Status != sartiq.StatusCompleted {
			t.Fatalf("job status %s", j.Status)
		}
		progress := 0
		for _, k := range r.kinds() {
			if k == "progress" {
				progress++
			}
		}
		if progress != len(backend.DemoCategories) || r.kinds()[0] != "start" {
			t.Fatalf("progress lines: %v", r.kinds())
		}
		// Each progress line and the agent's start say what a progress bar counts to: the
		// manifest's categories.
		for _, e := range r.events {
			if e["event"] != "progress" && e["event"] != "agent_start" {
				continue
			}
			data, _ := e["data"].(map[string]any)
			if total, _ := data["total"].(float64); int(total) != len(backend.DemoCategories) {
				t.Fatalf("%s line without the total of %d categories: %v", e["event"], len(backend.DemoCategories), e)
			}
		}
		sessions := w.sessions(ctx, "acme")
		if len(sessions) != 1 || sessions[0].Source != "tool" || sessions[0].MessageCount == 0 {
			t.Fatalf("state.db sessions: %+v", sessions)
		}
		soul, err := os.ReadFile(filepath.Join(w.home("acme"), "SOUL.md"))
		if err != nil || !strings.Contains(string(soul), "acme") {
			t.Fatalf("SOUL.md not ensured: %v", err)
		}
	})
}

func TestProductIngestJobEndToEnd(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, kind string) {
		w := newWorld(t, kind)
		ctx := context.Background()
		job := w.backend.DemoJob(t, "acme", sartiq.TypeProductIngest)
		r := w.runJob(ctx, "acme", job, nil)
		if r.err != nil || r.status.Code != 0 || r.outcome.Status != "completed" {
			t.Fatalf("worker: %v %v outcome %+v\n%s", r.err, r.status, r.outcome, r.stderr)
		}
		var n int
		if err := w.backend.DB.QueryRow(ctx, `SELECT count(*) FROM product_proposals WHERE job_id = $1 AND status = 'pending_review'`, job).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 3 {
			t.Fatalf("%d product proposals, want the 3 catalogue rows", n)
		}
		if j := w.job(ctx, job); j.Status != sartiq.StatusCompleted {
			t.Fatalf("job status %s", j.Status)
		}
	})
}

func TestTurnLimitResumesTheSameSession(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, kind string) {
		w := newWorld(t, kind)
		ctx := context.Background()
		w.knobs("acme", scriptedagent.Knobs{StopAfterWrites: 2})
		job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
		r := w.runJob(ctx, "acme", job, nil)
		if r.outcome.Status != "completed" {
			t.Fatalf("outcome %+v\n%s", r.outcome, r.stderr)
		}
		if !slices.Contains(r.kinds(), "resume") {
			t.Fatalf("no resume: %v", r.kinds())
		}
		if got := w.guidelines(ctx, job); len(got) != 5 {
			t.Fatalf("proposals after resume: %v", got)
		}
		if s := w.sessions(ctx, "acme"); len(s) != 1 {
			t.Fatalf("want the one session resumed, got %d sessions", len(s))
		}
	})
}

func TestFinalAnswerNamingAnUnpersistedCategoryFails(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, kind string) {
		w := newWorld(t, kind)
		ctx := context.Background()
		w.knobs("acme", scriptedagent.Knobs{ClaimExtra: []string{"sound-design"}})
		job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
		r := w.runJob(ctx, "acme", job, nil)
		if r.outcome.Status != "failed" || !strings.Contains(r.outcome.Reason, "not persisted: sound-design") {
			t.Fatalf("outcome %+v", r.outcome)
		}
		j := w.job(ctx, job)
		if j.Status != sartiq.StatusFailed || j.Error == nil || !strings.Contains(*j.Error, "sound-design") {
			t.Fatalf("job %+v", j)
		}
	})
}

func TestJobForAnotherOrgIsReleasedNotRun(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, kind string) {
		w := newWorld(t, kind)
		ctx := context.Background()
		job := w.backend.DemoJob(t, "globex", sartiq.TypeGuidelinesExtraction)
		r := w.runJob(ctx, "acme", job, nil)
		if r.outcome.Status != "released" || !strings.Contains(r.outcome.Reason, `"globex"`) {
			t.Fatalf("outcome %+v\n%s", r.outcome, r.stderr)
		}
		if j := w.job(ctx, job); j.Status != sartiq.StatusQueued {
			t.Fatalf("job status %s", j.Status)
		}
		if _, err := os.Stat(filepath.Join(w.home("acme"), "state.db")); !os.IsNotExist(err) {
			t.Fatalf("an agent ran for another org's job: %v", err)
		}
	})
}

func TestUnknownTypeFailsLoudly(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, kind string) {
		w := newWorld(t, kind)
		ctx := context.Background()
		job := w.backend.DemoJob(t, "acme", sartiq.TypeProductIngest)
		r := w.runJob(ctx, "acme", job, func(a *worker.Assignment) { a.Job.Type = "model_selection" })
		if r.outcome.Status != "failed" || !strings.Contains(r.outcome.Reason, `"model_selection"`) {
			t.Fatalf("outcome %+v", r.outcome)
		}
		if j := w.job(ctx, job); j.Status != sartiq.StatusFailed || !strings.Contains(*j.Error, "model_selection") {
			t.Fatalf("job %+v", j)
		}
	})
}

// agentProcs lists the running scripted agents of job with their command lines and
// environments, told apart from other tests' (other packages run beside this one) by their
// working directory, the job's own workspace, in a process and in a container alike.
func (w *world) agentProcs(t *testing.T, job string) map[int]string {
	t.Helper()
	procs := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(filepath.Join(binDir, "scripted-agent"))) && !bytes.Contains(cmdline, []byte("scripted-agent\x00chat")) {
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err != nil || !strings.HasSuffix(cwd, "/workspaces/"+job) {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		procs[pid] = string(cmdline) + "\n" + string(env)
	}
	return procs
}

func TestReclaimMidRunStopsTheAgentAndTheTokenIsNeverInItsReach(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, kind string) {
		w := newWorld(t, kind)
		ctx := context.Background()
		w.knobs("acme", scriptedagent.Knobs{StallAtWrite: 3})
		job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
		claim, err := w.bot.Claim(ctx, job)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan result, 1)
		go func() { done <- w.exec(ctx, "acme", claim, nil) }()

		// Wait until the agent has persisted two categories and stalls before the third.
		var seen map[int]string
		for range 600 {
			if len(w.guidelines(ctx, job)) == 2 {
				if seen = w.agentProcs(t, job); len(seen) > 0 {
					break
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(seen) == 0 {
			t.Fatal("the agent never reached its stall")
		}
		for pid, env := range seen {
			if strings.Contains(env, claim.JobToken) {
				t.Fatalf("the job token is in agent %d's argv or environment", pid)
			}
		}
		err = filepath.WalkDir(w.home("acme"), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Type()&os.ModeSocket != 0 || d.Type()&os.ModeSymlink != 0 {
				return err
			}
			b, _ := os.ReadFile(path)
			if bytes.Contains(b, []byte(claim.JobToken)) {
				t.Errorf("the job token is in %s", path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}

		// The backend re-claims the job (its worker looks dead to it). The
		// worker keeps heartbeating on the advanced clock, so a heartbeat that
		// lands between the advance and the re-claim makes the job fresh
		// again: advance once more and retry (bounded).
		var fresh *sartiq.Claim
		for try := 0; ; try++ {
			w.backend.Clock.Advance(time.Minute)
			fresh, err = w.bot.Reclaim(ctx, job)
			if err == nil {
				break
			}
			if try >= 20 || !sartiq.IsConflict(err) {
				t.Fatal(err)
			}
		}
		reclaimed := time.Now()
		var r result
		select {
		case r = <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("the worker kept running after the re-claim")
		}
		if stopped := time.Since(reclaimed); stopped > 5*time.Second {
			t.Fatalf("the agent stopped %s after the re-claim", stopped)
		}
		if r.outcome.Status != "taken_away" || r.status.Code == 0 {
			t.Fatalf("outcome %+v exit %v\n%s", r.outcome, r.status, r.stderr)
		}
		if left := w.agentProcs(t, job); len(left) > 0 {
			t.Fatalf("agents left running: %v", left)
		}
		// The old token can write nothing more.
		old, _ := sartiq.New(w.backend.URL, claim.JobToken)
		if _, err := old.ProposeGuidelines(ctx, "acme", "imagery", sartiq.GuidelinesRequest{Content: "late"}); !sartiq.IsConflict(err) {
			t.Fatalf("a write with the superseded token: %v", err)
		}
		// The new attempt skips what is persisted and completes.
		w.knobs("acme", scriptedagent.Knobs{})
		r2 := w.exec(ctx, "acme", fresh, nil)
		if r2.outcome.Status != "completed" {
			t.Fatalf("second attempt %+v\n%s", r2.outcome, r2.stderr)
		}
		var writes int
		if err := w.backend.DB.QueryRow(ctx, `SELECT count(*) FROM agent_job_events WHERE job_id = $1 AND kind = 'proposal'`, job).Scan(&writes); err != nil {
			t.Fatal(err)
		}
		if writes != 5 {
			t.Fatalf("%d proposal writes: the second attempt re-proposed persisted categories", writes)
		}
	})
}

// forEachRuntime runs a test through the process runtime and the Docker runtime.
func forEachRuntime(t *testing.T, test func(t *testing.T, kind string)) {
	for _, kind := range []string{"process", "docker"} {
		t.Run(kind, func(t *testing.T) { test(t, kind) })
	}
}

func TestCrashedAgentLeavesTheJobForRecovery(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, kind string) {
		w := newWorld(t, kind)
		ctx := context.Background()
		w.knobs("acme", scriptedagent.Knobs{CrashAtWrite: 2})
		job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
		r := w.runJob(ctx, "acme", job, nil)
		if r.outcome.Status != "crashed" || !strings.Contains(r.outcome.Reason, "exited with status 70") || r.status.Code == 0 {
			t.Fatalf("outcome %+v exit %v\n%s", r.outcome, r.status, r.stderr)
		}
		// No terminal call: the job stays RUNNING until it goes stale and is re-claimed,
		// which is how a crash counts as an attempt.
		if j := w.job(ctx, job); j.Status != sartiq.StatusRunning {
			t.Fatalf("job status %s", j.Status)
		}
		if got := w.guidelines(ctx, job); len(got) != 1 {
			t.Fatalf("proposals before the crash: %v", got)
		}
	})
}

// SOUL.md's generated block is put right before every agent start, a resumed run's too: a
// wrapper agent (a stand-in for a Hermes that turned on its own identity) overwrites
// SOUL.md on its first run, which stops at the turn limit; the resumed run finds the block
// restored.
func TestAResumedRunStartsWithTheSoulBlockRestored(t *testing.T) {
	w := newWorld(t, "process")
	ctx := context.Background()
	w.knobs("acme", scriptedagent.Knobs{StopAfterWrites: 2})
	agent := filepath.Join(t.TempDir(), "agent-that-rewrites-its-soul")
	script := `#!/bin/sh
case " $* " in
*" --resume "*) cp "$HERMES_HOME/SOUL.md" "$HERMES_HOME/soul-at-resume.md" ;;
*) printf 'I am someone else now.\n' > "$HERMES_HOME/SOUL.md" ;;
esac
exec "` + filepath.Join(binDir, "scripted-agent") + `" "$@"
`
	if err := os.WriteFile(agent, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
	claim, err := w.bot.Claim(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	r := w.execLive(ctx, "acme", claim, nil, live{env: []string{"HERMES_BIN=" + agent}})
	if r.outcome.Status != "completed" || !slices.Contains(r.kinds(), "resume") {
		t.Fatalf("outcome %+v, events %v\n%s", r.outcome, r.kinds(), r.stderr)
	}
	seen, err := os.ReadFile(filepath.Join(w.home("acme"), "soul-at-resume.md"))
	if err != nil {
		t.Fatalf("the resumed run did not record SOUL.md: %v", err)
	}
	want := orghome.RenderSoulBlock(orghome.Identity{OrgID: "acme", DisplayName: "acme"})
	if !strings.HasPrefix(string(seen), want) {
		t.Fatalf("the resumed run started with SOUL.md:\n%s\nwant it to begin with the generated block:\n%s", seen, want)
	}
}

// A backend reached under a path prefix (SARTIQ_API_URL=http://host/api): the guidelines
// job completes, its writes seen by the checkpoint and the completion gate.
func TestAGuidelinesJobThroughABackendUnderAPathPrefixCompletes(t *testing.T) {
	w := newWorld(t, "process")
	ctx := context.Background()
	target, err := url.Parse(w.backend.URL)
	if err != nil {
		t.Fatal(err)
	}
	under := httptest.NewServer(http.StripPrefix("/api", httputil.NewSingleHostReverseProxy(target)))
	t.Cleanup(under.Close)
	job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
	claim, err := w.bot.Claim(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	// As a backend served under the prefix names it.
	claim.ManifestURL = under.URL + "/api" + strings.TrimPrefix(claim.ManifestURL, w.backend.URL)
	r := w.execLive(ctx, "acme", claim, nil, live{env: []string{"SARTIQ_API_URL=" + under.URL + "/api"}})
	if r.err != nil || r.status.Code != 0 || r.outcome.Status != "completed" {
		t.Fatalf("worker: %v %v outcome %+v\n%s", r.err, r.status, r.outcome, r.stderr)
	}
	if got := w.guidelines(ctx, job); !slices.Equal(got, sorted(backend.DemoCategories)) {
		t.Fatalf("proposals: %v", got)
	}
	progress := 0
	for _, k := range r.kinds() {
		if k == "progress" {
			progress++
		}
	}
	if progress != len(backend.DemoCategories) {
		t.Fatalf("the checkpoint saw %d accepted writes, want %d: %v", progress, len(backend.DemoCategories), r.kinds())
	}
}
