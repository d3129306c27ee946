package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"hermeshost/atomicfile"
	"hermeshost/control"
	"hermeshost/hermescli"
	"hermeshost/orghome"
	"hermeshost/sartiq"
	"hermeshost/service"
)

// Assignment is what the dispatcher writes on the worker's stdin: the claim without its
// token, which comes in the exec environment instead.
//
// Without HoldStdin the caller may close stdin as soon as the assignment is written, and
// nothing more is read from it. With HoldStdin the caller keeps stdin open for the whole
// run, and closing it (EOF) is the one way to ask the worker to stop: the agent is killed
// and the job released, not failed, so the stop does not count as an attempt. That is how
// the dispatcher stops a job (a Docker engine's execs cannot be signalled anyway). A signal
// to such a worker is not its dispatcher asking: whoever sent it (the agent killing its
// parent, say), the run ends as a crash (ErrSignalled), the job is not released, and the
// attempt counts towards MAX_ATTEMPTS. Anything written after the assignment is ignored.
type Assignment struct {
	Job            sartiq.Job `json:"job"`
	OrganizationID string     `json:"organization_id"`
	ManifestURL    string     `json:"manifest_url"`
	HoldStdin      bool       `json:"hold_stdin,omitempty"`
}

// Config is one worker's settings.
type Config struct {
	Org        string // the org this container serves
	Home       string // its HERMES_HOME
	API        *url.URL
	Token      service.Secret
	HermesBin  string
	MaxTurns   int
	MaxResumes int
	Heartbeat  time.Duration
	GatewayURL string // the gateway's base URL; the agent's config.yaml names <url>/v1
	GatewayKey service.Secret
	Model      string
	// EgressURL is the unit's egress proxy on its loopback (EGRESS_URL, forwarded), the
	// agent's HTTPS_PROXY; empty: none.
	EgressURL string
	// BundledSkills is the image's read-only bundled skills (HERMES_BUNDLED_SKILLS), which
	// Hermes reads in place; empty for none.
	BundledSkills string
	// SkillsMax is how many authored skills stay enabled (SKILLS_MAX_AUTHORED); 0 applies
	// no cap.
	SkillsMax int
	// Plugin is the host's Hermes plugin, installed and enabled in the home before every
	// agent start; it carries the subagent hooks to the hook socket.
	Plugin orghome.Plugin
	// SartiqBin is the sartiq command the agent shell-calls (hermes-host under that name).
	SartiqBin string
	// Control is the control API with the org's key; with it the agent's subagent hooks
	// are served (see HookProxy), without it they are not.
	Control       *control.Client
	ReportEnabled bool
	Retention     orghome.Retention
	Log           *slog.Logger
	// Progress receives one JSON object per line: start, progress, checkpoint, outcome.
	Progress io.Writer
}

// Outcome is how a job ended for this worker.
type Outcome struct {
	Status string          `json:"status"` // completed, failed, released, taken_away, crashed, unreported
	Reason string          `json:"reason,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	// Meant is the status the run ended with when its terminal call to the backend failed
	// (Status is then unreported, ReportError why); Reason and Result are still the run's.
	// Empty when nothing was meant to be reported (REPORT_ENABLED=false).
	Meant       string `json:"meant,omitempty"`
	ReportError string `json:"report_error,omitempty"`
	// SkillsDisabled are the authored skills the cap disabled before this job's agent starts.
	SkillsDisabled []string `json:"skills_disabled,omitempty"`
	// FileWriteErrors are this run's failed file writes (its checkpoint, the home's files)
	// by atomicfile's cause, none left out: run-job is never scraped, so the dispatcher
	// counts them for it. Absent when none failed.
	FileWriteErrors map[string]uint64 `json:"file_write_errors,omitempty"`
}

// ErrTakenAway: the backend refused a heartbeat with 409; the job is someone else's now.
var ErrTakenAway = errors.New("job taken away (heartbeat refused)")

// errStopped: Run's context ended before the agent finished.
var errStopped = errors.New("stopped before the agent finished")

// reportTimeout bounds a terminal call (complete, fail, release). The call gets a context
// of its own because Run's may have ended already: a stop still has to release the job.
const reportTimeout = 10 * time.Second

type runner struct {
	cfg         Config
	api         *sartiq.Client
	job         sartiq.Job
	manifestURL string
	cap         *Capability
	home        *orghome.Home
	ws          string
	check       *Checkpoint
	bundled     *orghome.Bundled
	emitMu      sync.Mutex
	accepts     int
	total       int      // the manifest's categories, once read: progress events state it
	disabled    []string // skills the cap disabled during this job
}

// Run runs one job end to end and reports its outcome to the backend (unless
// REPORT_ENABLED is false) and on Progress. When ctx ends first (the host is stopping the
// worker) the agent is killed and the job released, unless it was taken away already;
// checkpoints stay, so the next attempt resumes from them.
func Run(ctx context.Context, cfg Config, api *sartiq.Client, a Assignment) (Outcome, error) {
	before := atomicfile.WriteErrorCounts()
	r := &runner{cfg: cfg, api: api, job: a.Job, manifestURL: a.ManifestURL}
	r.emit("start", map[string]any{"job": a.Job.ID, "type": a.Job.Type, "org": a.OrganizationID, "attempt": a.Job.Attempt})
	out, err := r.run(ctx, a)
	out.SkillsDisabled = r.disabled
	out.FileWriteErrors = writeErrorsSince(before)
	r.emit("outcome", out)
	return out, err
}

// writeErrorsSince are the failed writes counted (atomicfile.WriteErrorCounts) since
// before, by cause; nil when there were none.
func writeErrorsSince(before map[string]uint64) map[string]uint64 {
	var since map[string]uint64
	for cause, n := range atomicfile.WriteErrorCounts() {
		if n > before[cause] {
			if since == nil {
				since = make(map[string]uint64)
			}
			since[cause] = n - before[cause]
		}
	}
	return since
}

func (r *runner) emit(kind string, data any) {
	r.emitMu.Lock()
	defer r.emitMu.Unlock()
	line, _ := json.Marshal(map[string]any{"event": kind, "at": time.Now().UTC(), "data": data})
	fmt.Fprintf(r.cfg.Progress, "%s\n", line)
}

// release puts the job back in the queue, even when ctx has ended.
func (r *runner) release(ctx context.Context, reason string) (Outcome, error) {
	r.cfg.Log.Warn("releasing job", "job", r.job.ID, "reason", reason)
	repeated, err := r.terminal(ctx, "release", func(ctx context.Context) error {
		_, err := r.api.Release(ctx, r.job.ID, reason)
		return err
	})
	if sartiq.IsConflict(err) && !repeated {
		// The token is no longer the job's: it was re-claimed meanwhile.
		return Outcome{Status: "taken_away", Reason: err.Error()}, nil
	}
	if err != nil {
		return unreported(Outcome{Status: "released", Reason: reason}, err), fmt.Errorf("release job %s: %w", r.job.ID, err)
	}
	return Outcome{Status: "released", Reason: reason}, nil
}

// terminal makes a terminal call (complete, fail, release), again while it fails on the
// way or with a 5xx (sartiq.IsTransient), for up to reportTimeout, even when ctx has ended:
// a backend restarting must not lose a job's end. A repeat is safe, as the first call that
// lands revokes the token; repeated says one was made, so a refusal may answer an earlier
// call of its own.
func (r *runner) terminal(ctx context.Context, what string, call func(context.Context) error) (repeated bool, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportTimeout)
	defer cancel()
	for wait := 250 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		if err = call(ctx); err == nil || !sartiq.IsTransient(err) {
			return repeated, err
		}
		r.cfg.Log.Warn("report "+what+": trying again", "job", r.job.ID, "err", err, "in", wait.String())
		select {
		case <-ctx.Done():
			return repeated, err
		case <-time.After(wait):
			repeated = true
		}
	}
}

// unreported is out, meant for the backend, as its terminal call did not land (or may not
// have): the dispatcher, which holds the job's token too, settles it from the job's log.
func unreported(out Outcome, err error) Outcome {
	out.Meant, out.Status, out.ReportError = out.Status, "unreported", err.Error()
	return out
}

// ErrSignalled is the cause of a run ended by a signal its dispatcher did not send (see
// Assignment): a crash, not a stop.
var ErrSignalled = errors.New("the worker was signalled by something other than its dispatcher")

// stop releases the job after ctx ended: the worker was asked to stop, which is no fault of
// the job and must not count as an attempt. A run ended by ErrSignalled is a crash: the job
// is left as it is (the agent is already killed), to go stale and be re-claimed as a new
// attempt.
func (r *runner) stop(ctx context.Context) (Outcome, error) {
	if cause := context.Cause(ctx); errors.Is(cause, ErrSignalled) {
		r.cfg.Log.Warn("the run was signalled, not stopped by its dispatcher: the job is not released and the attempt counts", "job", r.job.ID, "cause", cause.Error())
		return Outcome{Status: "crashed", Reason: cause.Error()}, nil
	}
	return r.release(ctx, fmt.Sprintf("the host stopped the worker (%v): the job is released to run again", context.Cause(ctx)))
}

func (r *runner) run(ctx context.Context, a Assignment) (Outcome, error) {
	// The org comes from the backend's organization_id; a job for another org is never run.
	if a.OrganizationID != r.cfg.Org || a.Job.OrganizationID != r.cfg.Org {
		return r.release(ctx, fmt.Sprintf("job for organization %q reached the worker of %q", a.OrganizationID, r.cfg.Org))
	}
	c, err := CapabilityFor(a.Job.Type)
	if err != nil {
		return r.finish(ctx, Outcome{Status: "failed", Reason: err.Error()})
	}
	r.cap = c
	lock, err := LockHome(r.cfg.Home)
	if errors.Is(err, ErrHomeBusy) {
		return r.release(ctx, "another agent is running on this organization's home")
	}
	if err != nil {
		return Outcome{Status: "crashed", Reason: err.Error()}, err
	}
	defer lock.Unlock() //nolint:errcheck // the kernel drops it with the process anyway

	if r.home, err = orghome.OpenHome(r.cfg.Org, r.cfg.Home); err != nil {
		return Outcome{Status: "crashed", Reason: err.Error()}, err
	}
	defer r.home.Close()
	if err := r.prepare(ctx); err != nil {
		if ctx.Err() != nil {
			return r.stop(ctx)
		}
		return Outcome{Status: "crashed", Reason: err.Error()}, err
	}
	if a.Job.Status == sartiq.StatusClaimed {
		if _, err := r.api.Start(ctx, r.job.ID); err != nil {
			if ctx.Err() != nil {
				return r.stop(ctx)
			}
			return Outcome{Status: "crashed", Reason: err.Error()}, fmt.Errorf("start job %s: %w", r.job.ID, err)
		}
	}

	agentCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	beats := r.heartbeat(agentCtx, cancel)
	out, err := r.runAgent(agentCtx)
	cancel(nil)
	<-beats
	if cause := context.Cause(agentCtx); errors.Is(cause, ErrTakenAway) {
		return Outcome{Status: "taken_away", Reason: cause.Error()}, nil
	}
	if errors.Is(err, errStopped) {
		return r.stop(ctx)
	}
	if err != nil {
		return out, err
	}
	return r.finish(ctx, out)
}

// prepare makes the workspace, downloads the manifest, ensures SOUL.md and loads the
// checkpoint, merged with what the backend's log says was persisted by earlier attempts.
func (r *runner) prepare(ctx context.Context) error {
	rel, err := orghome.WorkspacePath(r.job.ID)
	if err != nil {
		return err
	}
	ws := filepath.Join(r.cfg.Home, rel)
	if err := os.MkdirAll(ws, 0o700); err != nil {
		return fmt.Errorf("workspace of job %s: %w", r.job.ID, err)
	}
	r.ws = ws
	manifest, err := r.api.Manifest(ctx, r.manifestURL)
	if err != nil {
		return fmt.Errorf("manifest of job %s: %w", r.job.ID, err)
	}
	doc, err := jsonIndent(manifest)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(ws, "manifest.json"), doc, 0o600); err != nil {
		return err
	}
	if r.cfg.SartiqBin == "" {
		if r.cfg.SartiqBin, err = linkSartiq(ws); err != nil {
			return err
		}
	}
	if r.check, err = OpenCheckpoint(ws, r.job.ID); err != nil {
		return err
	}
	if r.cfg.SkillsMax > 0 {
		// The image's skills are never capped, and an authored skill sharing a name with
		// one is never disabled (that would disable both): the cap needs to know them.
		if r.bundled, err = orghome.ReadBundled(r.cfg.BundledSkills); err != nil {
			return err
		}
	}
	events, err := r.api.ListEvents(ctx, r.job.ID)
	if err != nil {
		return fmt.Errorf("events of job %s: %w", r.job.ID, err)
	}
	var earlier []string
	for _, e := range events {
		var d struct {
			Surface  string `json:"surface"`
			Category string `json:"category"`
		}
		if e.Kind == sartiq.EventProposal && json.Unmarshal(e.Data, &d) == nil && d.Surface == "guidelines" && d.Category != "" {
			earlier = append(earlier, d.Category)
		}
	}
	if err := r.check.Add(earlier...); err != nil {
		return err
	}
	if len(earlier) > 0 {
		r.emit("checkpoint", map[string]any{"categories": r.check.Categories(), "from": "job log"})
	}
	return nil
}

// heartbeat beats every interval until ctx ends; a 409 cancels ctx with ErrTakenAway,
// which kills the agent at once.
func (r *runner) heartbeat(ctx context.Context, cancel context.CancelCauseFunc) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(r.cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			progress := map[string]any{"persisted": r.check.Categories(), "accepted_writes": r.acceptedWrites()}
			_, err := r.api.Heartbeat(ctx, r.job.ID, progress)
			if sartiq.IsConflict(err) {
				r.cfg.Log.Warn("heartbeat refused: the job was taken away; stopping the agent", "job", r.job.ID)
				cancel(ErrTakenAway)
				return
			}
			if err != nil && ctx.Err() == nil {
				r.cfg.Log.Warn("heartbeat failed", "job", r.job.ID, "err", err)
			}
		}
	}()
	return done
}

func (r *runner) acceptedWrites() int {
	r.emitMu.Lock()
	defer r.emitMu.Unlock()
	return r.accepts
}

func (r *runner) onAccepted(a Accepted) {
	r.emitMu.Lock()
	r.accepts++
	r.emitMu.Unlock()
	if a.Category != "" {
		if err := r.check.Add(a.Category); err != nil {
			r.cfg.Log.Error("checkpoint write failed", "job", r.job.ID, "err", err)
		}
	}
	progress := map[string]any{"operation": a.Operation, "category": a.Category, "persisted": r.check.Categories()}
	r.emitMu.Lock()
	if r.total > 0 {
		progress["total"] = r.total
	}
	r.emitMu.Unlock()
	r.emit("progress", progress)
}

// runAgent runs the agent, resuming its session while it stops at the turn limit with work
// left, and gates the result. It returns errStopped when ctx ends before the agent is done.
func (r *runner) runAgent(ctx context.Context) (Outcome, error) {
	// A unix socket path is limited to 108 bytes, which a workspace path can pass: the socket
	// goes in a private folder of its own (0700, random name) instead.
	sockDir, err := os.MkdirTemp("", "hermes-sartiq-")
	if err != nil {
		return Outcome{Status: "crashed", Reason: err.Error()}, fmt.Errorf("token proxy folder: %w", err)
	}
	defer os.RemoveAll(sockDir)
	proxy, err := StartTokenProxy(filepath.Join(sockDir, "sartiq.sock"), r.cfg.API, r.cfg.Token, r.cfg.Log, r.onAccepted)
	if err != nil {
		return Outcome{Status: "crashed", Reason: err.Error()}, err
	}
	defer proxy.Close()
	hooks := ""
	if r.cfg.Control != nil {
		hp, err := StartHookProxy(filepath.Join(sockDir, "hooks.sock"), r.cfg.Control, r.job.ID, r.cfg.Log, r.emit)
		if err != nil {
			return Outcome{Status: "crashed", Reason: err.Error()}, err
		}
		defer hp.Close()
		hooks = hp.Path()
	}
	prompt, err := r.cap.Prompt(r.cfg.Org, r.job.ID)
	if err != nil {
		return Outcome{Status: "crashed", Reason: err.Error()}, err
	}
	var manifest struct {
		Categories []string `json:"categories"`
	}
	if err := atomicfile.LoadJSON(filepath.Join(r.ws, "manifest.json"), &manifest); err != nil {
		return Outcome{Status: "failed", Reason: err.Error()}, nil
	}
	r.emitMu.Lock()
	r.total = len(manifest.Categories)
	r.emitMu.Unlock()
	session := ""
	for run := 0; ; run++ {
		if out, stop := r.beforeAgentStart(ctx); stop {
			return out, nil
		}
		start := map[string]any{"run": run, "resume": session != ""}
		if len(manifest.Categories) > 0 {
			// A checkpointed run: where it stands, and what a progress bar counts to.
			start["persisted"], start["total"] = r.check.Categories(), len(manifest.Categories)
		}
		r.emit("agent_start", start)
		res, code, err := r.exec(ctx, hermescli.Args(prompt, r.cfg.MaxTurns, session), proxy.Path(), hooks)
		if ctx.Err() != nil {
			return Outcome{}, errStopped
		}
		if err != nil {
			return Outcome{Status: "crashed", Reason: err.Error()}, err
		}
		if code != 0 {
			// A crashed agent is a crashed attempt: no terminal call, so the job goes stale
			// and recovery re-claims it, counting the attempt.
			reason := fmt.Sprintf("the agent exited with status %d", code)
			return Outcome{Status: "crashed", Reason: reason}, fmt.Errorf("job %s: %s", r.job.ID, reason)
		}
		if res.TurnLimit {
			// The CLI's own line says so; its summary may well hold JSON, which is no final
			// answer.
			switch {
			case !r.cap.Resumable:
				return Outcome{Status: "failed", Reason: fmt.Sprintf("the agent reached its turn limit (%d turns) before finishing", r.cfg.MaxTurns)}, nil
			case run >= r.cfg.MaxResumes:
				return Outcome{Status: "failed", Reason: fmt.Sprintf("the agent reached its turn limit (%d turns) %d times; MAX_RESUMES is %d", r.cfg.MaxTurns, run+1, r.cfg.MaxResumes)}, nil
			case res.SessionID == "":
				return Outcome{Status: "failed", Reason: "the agent stopped at its turn limit but printed no session_id line: its session cannot be resumed"}, nil
			}
			session = res.SessionID
			if err := r.check.TurnLimit(session); err != nil {
				return Outcome{Status: "crashed", Reason: err.Error()}, err
			}
			r.emit("resume", map[string]any{"session": session, "persisted": r.check.Categories()})
			continue
		}
		if res.StdoutCut {
			r.cfg.Log.Warn("the agent's output was cut", "job", r.job.ID, "kept_bytes", len(res.Stdout))
		}
		result, err := r.cap.Gate(FinalAnswer(res.Stdout), manifest.Categories, Persisted{Categories: r.check.Categories(), Writes: r.acceptedWrites()})
		if err != nil {
			return Outcome{Status: "failed", Reason: err.Error()}, nil
		}
		return Outcome{Status: "completed", Result: result}, nil
	}
}

// beforeAgentStart makes the home one the real CLI runs in (config.yaml, plugin, bundled
// skills) and applies the skills cap, before every start: a resumed run too, since the
// home may have changed in between. It returns the job's outcome when the job cannot go on:
// a config.yaml that does not parse fails it with the file and line, untouched.
func (r *runner) beforeAgentStart(ctx context.Context) (Outcome, bool) {
	// Every start, a resumed run's too: the agent of the run before may have edited the
	// generated block.
	if _, err := r.home.EnsureSoul(orghome.Identity{OrgID: r.cfg.Org, DisplayName: r.cfg.Org}); err != nil {
		return Outcome{Status: "crashed", Reason: "ensure SOUL.md: " + err.Error()}, true
	}
	_, err := r.home.EnsureAgentSetup(hermescli.Setup(r.cfg.GatewayURL, r.cfg.Model, r.cfg.BundledSkills, r.cfg.Plugin))
	var cfgErr *orghome.ConfigError
	switch {
	case errors.As(err, &cfgErr):
		r.cfg.Log.Error("the home's config.yaml cannot be read; the job fails", "job", r.job.ID, "err", err)
		return Outcome{Status: "failed", Reason: err.Error()}, true
	case err != nil:
		return Outcome{Status: "crashed", Reason: err.Error()}, true
	}
	if r.cfg.SkillsMax <= 0 {
		return Outcome{}, false
	}
	res, err := r.home.EnforceSkillCap(ctx, r.cfg.SkillsMax, r.bundled)
	switch {
	case errors.As(err, &cfgErr):
		return Outcome{Status: "failed", Reason: err.Error()}, true
	case errors.Is(err, orghome.ErrStateBusy):
		// Usage unknown: guessing would disable skills in use. The next start tries again.
		r.cfg.Log.Warn("skills cap not applied this time", "job", r.job.ID, "err", err)
		return Outcome{}, false
	case err != nil:
		return Outcome{Status: "crashed", Reason: err.Error()}, true
	}
	if len(res.Disabled) > 0 {
		names := make([]string, len(res.Disabled))
		for i, u := range res.Disabled {
			names[i] = u.Name
		}
		r.disabled = append(r.disabled, names...)
		r.emit("skills_cap", map[string]any{"max": res.Max, "authored": res.Authored, "disabled": names})
	}
	return Outcome{}, false
}

// exec runs the agent as every agent start does (hermescli.Launch), with what a job adds:
// the sockets of the token proxy and the hooks, and sartiq on PATH. No job token, no bot
// credential, nothing of another org.
func (r *runner) exec(ctx context.Context, args []string, socket, hooks string) (hermescli.Result, int, error) {
	env := []string{"SARTIQ_PROXY_SOCKET=" + socket}
	if hooks != "" {
		env = append(env, hermescli.HooksSocketEnv+"="+hooks)
	}
	env = append(env, hermescli.ProxyEnv(r.cfg.EgressURL)...)
	return hermescli.Launch{
		Bin: r.cfg.HermesBin, Args: args, Home: r.cfg.Home, GatewayKey: r.cfg.GatewayKey.Reveal(),
		Dir: r.ws, PathFirst: filepath.Dir(r.cfg.SartiqBin), Env: env, Stderr: os.Stderr,
	}.Run(ctx, nil)
}

// linkSartiq makes <workspace>/.bin/sartiq name this executable, which runs the sartiq CLI
// under that name, for images and installs that do not ship the name themselves.
func linkSartiq(ws string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the sartiq command: %w", err)
	}
	dir := filepath.Join(ws, ".bin")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("link the sartiq command: %w", err)
	}
	link := filepath.Join(dir, "sartiq")
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("link the sartiq command: %w", err)
	}
	if err := os.Symlink(self, link); err != nil {
		return "", fmt.Errorf("link the sartiq command: %w", err)
	}
	return link, nil
}

// finish reports the outcome unless REPORT_ENABLED is false, then prunes old workspaces.
// A result reached just as ctx ends is still reported.
func (r *runner) finish(ctx context.Context, out Outcome) (Outcome, error) {
	defer r.prune()
	if !r.cfg.ReportEnabled {
		r.cfg.Log.Warn("REPORT_ENABLED=false: leaving out the terminal call", "job", r.job.ID, "would", out.Status, "reason", out.Reason)
		out.Status = "unreported"
		return out, nil
	}
	_, err := r.terminal(ctx, out.Status, func(ctx context.Context) error {
		var err error
		switch out.Status {
		case "completed":
			_, err = r.api.Complete(ctx, r.job.ID, out.Result)
		case "failed":
			_, err = r.api.Fail(ctx, r.job.ID, out.Reason)
		}
		return err
	})
	if err != nil {
		err = fmt.Errorf("report %s of job %s: %w", out.Status, r.job.ID, err)
		return unreported(out, err), err
	}
	r.cfg.Log.Info("job finished", "job", r.job.ID, "status", out.Status, "reason", out.Reason)
	return out, nil
}

func (r *runner) prune() {
	if r.home == nil {
		return
	}
	if _, err := r.home.PruneWorkspaces(r.cfg.Retention, time.Now(), r.job.ID); err != nil {
		r.cfg.Log.Warn("workspace pruning failed", "err", err)
	}
}
