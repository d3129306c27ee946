package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"hermeshost/dispatch/runtime"
	"hermeshost/gateway"
	"hermeshost/internal/tail"
	"hermeshost/internal/unitnet"
	"hermeshost/lease"
	"hermeshost/mirror"
	"hermeshost/sartiq"
	"hermeshost/worker"
)

// delivery is one job in flight: its org's slot, its home: lease, and the two ways to stop
// it. Closing stop asks the worker to release the job (its held-open stdin ends); ending
// ctx kills it.
type delivery struct {
	home     lease.Lease
	stop     chan struct{}
	stopOnce sync.Once
	ctx      context.Context
	cancel   context.CancelFunc
}

func newDelivery(parent context.Context) *delivery {
	ctx, cancel := context.WithCancel(parent)
	return &delivery{stop: make(chan struct{}), ctx: ctx, cancel: cancel}
}

func (dl *delivery) askToStop() { dl.stopOnce.Do(func() { close(dl.stop) }) }

// stopReader is a worker's stdin after its assignment: it blocks until the delivery is
// asked to stop, then ends, which the worker takes as "release the job and exit".
type stopReader struct{ stop <-chan struct{} }

func (r stopReader) Read([]byte) (int, error) {
	<-r.stop
	return 0, io.EOF
}

// start records a claim and delivers it in the background; the org's slot and home lease,
// taken by the caller, are given back when the delivery ends. Deliveries outlive ctx: a job
// in flight is not cut off by the end of the cycle that claimed it, only by Shutdown.
func (d *Dispatcher) start(ctx context.Context, dl *delivery, claim *sartiq.Claim, kind string) {
	claimed := time.Now()
	if err := d.recordClaim(ctx, claim, kind); err != nil {
		d.cfg.Log.Error("record "+kind, "job", claim.Job.ID, "err", err)
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		func() {
			defer d.giveBack(claim.OrganizationID, dl)
			defer dl.cancel()
			defer dl.askToStop()
			kept := d.leases.Keep(dl.ctx, dl.home, d.cfg.LeaseTTL)
			d.deliver(kept.Context(), dl, claim, kept, claimed)
			dl.home = kept.Stop()
		}()
		// Its org's slot and home lease are given back: the org's next job (or this one,
		// queued again after a crash) is claimed now rather than at the next tick.
		d.kick(claim.OrganizationID)
	}()
}

// Wait waits for the jobs in flight.
func (d *Dispatcher) Wait() { d.wg.Wait() }

// recordClaim records the attempt and mirrors the claim, together.
func (d *Dispatcher) recordClaim(ctx context.Context, c *sartiq.Claim, kind string) error {
	err := pgx.BeginFunc(ctx, d.cfg.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
WITH a AS (
    INSERT INTO claim_attempts (job_id, org, attempt, instance, kind) VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (job_id, attempt) DO NOTHING
)
-- A re-claim says the runs before it crashed, whether or not anyone recorded it.
UPDATE claim_attempts SET outcome = 'crashed', reason = 're-claimed as stale', finished_at = now()
 WHERE job_id = $1 AND attempt < $3 AND outcome IS NULL`, c.Job.ID, c.OrganizationID, c.Job.Attempt, d.cfg.Instance, kind); err != nil {
			return err
		}
		_, err := d.mirror.Claimed(ctx, tx, mirror.Claim{
			JobID: c.Job.ID, Org: c.OrganizationID, Type: c.Job.Type, Attempt: c.Job.Attempt,
			Kind: kind, Data: map[string]any{"instance": d.cfg.Instance},
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("record %s of job %s: %w", kind, c.Job.ID, err)
	}
	return nil
}

// deliver runs the job and records its outcome. ctx ends when the home lease is lost or
// the dispatcher stops hard. A run that ended without an outcome is ended at once
// (endCrashed).
func (d *Dispatcher) deliver(ctx context.Context, dl *delivery, c *sartiq.Claim, kept *lease.Kept, claimed time.Time) {
	log := d.cfg.Log.With("job", c.Job.ID, "org", c.OrganizationID)
	outcome, reason, result := d.run(ctx, dl, c, kept, claimed, log)
	if cause := context.Cause(ctx); errors.Is(cause, lease.ErrLost) && outcome != "completed" && outcome != "failed" {
		reason = cause.Error()
	}
	status, jobReason := mirrorStatus(outcome), reason
	// A run the dispatcher killed as it stopped hard is left to go stale, as the shutdown
	// says; any other crash is ended now, while this dispatcher still holds the token.
	if outcome == "crashed" && d.hard.Err() == nil {
		status, jobReason = d.endCrashed(c, reason, log)
	}
	// The record is tried again for a while: Postgres restarting must not lose it (the
	// backend's log has the outcome either way, and a later owner reconciles a row left open).
	record, stopRecording := context.WithTimeout(context.WithoutCancel(ctx), recordOutcomeFor)
	defer stopRecording()
	for wait := 250 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		err := pgx.BeginFunc(record, d.cfg.DB, func(tx pgx.Tx) error {
			if _, err := tx.Exec(record, `UPDATE claim_attempts SET outcome = $3, reason = NULLIF($4, ''), finished_at = now() WHERE job_id = $1 AND attempt = $2`,
				c.Job.ID, c.Job.Attempt, outcome, reason); err != nil {
				return err
			}
			return d.mirror.Finished(record, tx, c.Job.ID, status, jobReason, result)
		})
		if err == nil {
			break
		}
		select {
		case <-record.Done():
			log.Error("record outcome", "err", err)
		case <-time.After(wait):
			log.Warn("record outcome: trying again", "err", err, "in", wait.String())
			continue
		}
		break
	}
	rec, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	// run-job has ended, and the agent with it: its subagents will never report. Fenced by
	// the home lease, so a run that lost it leaves the children of the attempt that took
	// over alone (recovery failed this run's when it re-claimed the job).
	if err := d.leases.WithFence(rec, kept.Lease(), func(tx pgx.Tx) error {
		_, err := d.subagents.FailJobTx(rec, tx, c.OrganizationID, c.Job.ID,
			fmt.Sprintf("job %s ended (%s) before the subagent reported", c.Job.ID, outcome))
		return err
	}); err != nil && !errors.Is(err, lease.ErrLost) {
		log.Warn("fail the subagents of an ended job", "err", err)
	}
	d.metrics.outcomes.WithLabelValues(outcome).Inc()
	log.Info("job outcome", "outcome", outcome, "reason", reason, "attempt", c.Job.Attempt)
}

// mirrorStatus is the backend status a worker outcome leaves the job in.
func mirrorStatus(outcome string) string {
	switch outcome {
	case "completed":
		return sartiq.StatusCompleted
	case "failed":
		return sartiq.StatusFailed
	case "released", "taken_away":
		return sartiq.StatusQueued
	}
	// crashed or unreported: still RUNNING at the backend until recovery re-claims it
	// (a crash the dispatcher ends at once says what it left instead: endCrashed).
	return sartiq.StatusRunning
}

// prepare does what must hold before the worker runs: the org's home and SOUL.md, its
// worker running, its exec environment, and the home lease still this delivery's.
func (d *Dispatcher) prepare(ctx context.Context, c *sartiq.Claim, kept *lease.Kept) (env []string, assignment []byte, err error) {
	// An org's first job makes its home; the id was validated by the backend and is checked
	// again here.
	if err := d.ensureSoul(c.OrganizationID); err != nil {
		return nil, nil, err
	}
	if _, err := d.cfg.Runtime.EnsureWorker(ctx, c.OrganizationID); err != nil {
		return nil, nil, err
	}
	if env, err = d.workerEnv(c); err != nil {
		return nil, nil, err
	}
	assignment, _ = json.Marshal(worker.Assignment{Job: c.Job, OrganizationID: c.OrganizationID, ManifestURL: d.unitManifest(c.ManifestURL), HoldStdin: true})
	// The agent starts only while the home lease is still this delivery's: a dispatcher
	// that woke up late after losing it never starts a second agent on the home.
	if err := d.leases.WithFence(ctx, kept.Lease(), func(tx pgx.Tx) error {
		_, err := d.mirror.Event(ctx, tx, c.OrganizationID, c.Job.ID, c.Job.Attempt, "deliver", map[string]any{"home_epoch": kept.Lease().Epoch, "runtime": d.cfg.Runtime.Kind()})
		return err
	}); err != nil {
		return nil, nil, fmt.Errorf("deliver: %w", err)
	}
	return env, assignment, nil
}

// unstarted gives back a job whose worker never started. That was the host's trouble (a
// runtime that cannot start the org's worker, a home lease lost first), not the job's, so
// the job is released rather than left to go stale as a crashed attempt; the org is then
// left alone for a while (backing off up to maxBackoff) so a broken host does not claim and
// release in a loop.
func (d *Dispatcher) unstarted(c *sartiq.Claim, cause error, log *slog.Logger) (outcome, reason string, result []byte) {
	reason = "the host could not start the worker: " + cause.Error()
	d.mu.Lock()
	wait := min(2*d.backoffStep(c.OrganizationID), maxBackoff)
	d.backoff[c.OrganizationID] = backoff{until: time.Now().Add(wait), step: wait}
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	api, err := sartiq.New(d.cfg.APIURL, c.JobToken)
	if err == nil {
		_, err = api.Release(ctx, c.Job.ID, reason)
	}
	if err != nil {
		log.Warn("release a job whose worker never started", "err", err)
		return "crashed", reason, nil
	}
	log.Warn("job released: its worker never started; the org backs off", "reason", reason, "backoff", wait.String())
	return "released", reason, nil
}

func (d *Dispatcher) run(ctx context.Context, dl *delivery, c *sartiq.Claim, kept *lease.Kept, claimed time.Time, log *slog.Logger) (outcome, reason string, result []byte) {
	env, assignment, err := d.prepare(ctx, c, kept)
	if err != nil {
		return d.unstarted(c, err, log)
	}
	d.mu.Lock()
	delete(d.backoff, c.OrganizationID)
	d.mu.Unlock()
	pr, pw := io.Pipe()
	// The worker's stderr holds the agent's: only its end is kept, however much comes.
	stderr := tail.New(stderrKept)
	done := make(chan worker.Outcome, 1)
	go func() { done <- d.record(ctx, c, kept, claimed, pr) }()
	st, err := d.cfg.Runtime.Exec(ctx, c.OrganizationID, runtime.Command{
		Args: []string{"hermes-host", "worker", "run-job"}, Env: env,
		Stdin: io.MultiReader(bytes.NewReader(assignment), stopReader{dl.stop}), Stdout: pw, Stderr: stderr,
	})
	pw.Close()
	out := <-done
	if n := stderr.Dropped(); n > 0 {
		d.metrics.outputDropped.WithLabelValues("stderr_bytes").Add(float64(n))
		log.Warn("the worker's stderr was cut to its end", "dropped_bytes", n)
	}
	status := out.Status
	if len(out.Result) > 0 {
		result = out.Result
	}
	if errors.Is(err, runtime.ErrNotRunning) || errors.Is(err, runtime.ErrNotStarted) {
		// The worker was gone before run-job could start in it (reaped as idle, say), or
		// run-job itself never started (an engine under load failing an exec).
		return d.unstarted(c, err, log)
	}
	if err != nil {
		return "crashed", err.Error(), nil
	}
	if status == "" {
		status = "crashed"
	}
	if status == "unreported" && out.Meant != "" {
		// The run ended, but its end did not reach the backend.
		return d.settle(c, out, log)
	}
	if st.OutOfMemory {
		// The kernel killed the worker, or its agent, for passing the org's memory limit:
		// the attempt ends with that reason. Unless the worker had settled the job with the
		// backend first (completed, failed, released), it is a crash, re-claimed and
		// counted like any other.
		reason := "out of memory"
		if out.Reason != "" {
			reason += " (" + out.Reason + ")"
		}
		log.Warn("worker ran out of memory", "status", st.String(), "worker_status", status,
			"stderr", lastBytes(tail.Redact(stderr.String(), secretsOf(env)...), 500))
		if status != "crashed" && status != "unreported" {
			return status, reason, result
		}
		return "crashed", reason, nil
	}
	if st.Code != 0 && status == "crashed" {
		// Whatever the agent printed may hold the keys it was given: never logged as is.
		log.Warn("worker exited", "status", st.String(), "stderr", lastBytes(tail.Redact(stderr.String(), secretsOf(env)...), 500))
		if out.Reason != "" {
			return status, out.Reason + " (" + st.String() + ")", nil
		}
		return status, st.String(), nil
	}
	return status, out.Reason, result
}

// recordOutcomeFor is how long a delivery tries to record its run's outcome in the host's
// database (a Postgres restart takes seconds).
const recordOutcomeFor = 30 * time.Second

// stderrKept is how much of a worker's stderr the dispatcher keeps: the end, for the log
// when the worker fails.
const stderrKept = 4 << 10

// secretsOf are the values of env that are secrets: the job token and the org's keys.
func secretsOf(env []string) []string {
	var out []string
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		switch name {
		case "SARTIQ_TOKEN", "GATEWAY_KEY", "CONTROL_KEY":
			out = append(out, value)
		}
	}
	return out
}

// lastBytes is the end of s, at most n bytes, as valid UTF-8.
func lastBytes(s string, n int) string {
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return strings.ToValidUTF8(s, "")
}

// workerEnv is the exec environment of run-job: the job token and the org's own keys, never
// in arguments.
func (d *Dispatcher) workerEnv(c *sartiq.Claim) ([]string, error) {
	key, err := gateway.OrgKey(d.cfg.GatewaySecret.Reveal(), c.OrganizationID)
	if err != nil {
		return nil, err
	}
	org := c.OrganizationID
	env := []string{
		"SARTIQ_TOKEN=" + c.JobToken, "SARTIQ_API_URL=" + d.unitURL(org, ServiceAPI, d.cfg.APIURL),
		"GATEWAY_URL=" + d.unitURL(org, ServiceGateway, d.cfg.GatewayURL), "GATEWAY_KEY=" + key, "WORKER_MODEL=" + d.cfg.WorkerModel,
	}
	if d.cfg.ControlURL != "" && d.cfg.ControlKey != nil {
		ck, err := d.cfg.ControlKey(org)
		if err != nil {
			return nil, err
		}
		env = append(env, "CONTROL_URL="+d.unitURL(org, ServiceControl, d.cfg.ControlURL), "CONTROL_KEY="+ck)
	}
	env = append(env, d.egressEnv(org)...)
	return append(env, d.cfg.WorkerEnv...), nil
}

// egressEnv names the egress proxy's socket (EGRESS_URL) for org's run-jobs and
// dashboards, where the runtime serves one.
func (d *Dispatcher) egressEnv(org string) []string {
	if u := d.cfg.Runtime.ServiceURL(org, ServiceEgress); u != "" {
		return []string{"EGRESS_URL=" + u}
	}
	return nil
}

// The host services an org's units may use (runtime.Config.Services), by name.
const (
	ServiceAPI     = "api"     // the Sartiq API, for the worker's calls with its job token
	ServiceGateway = "gateway" // the model gateway, for the agent with its org's key
	ServiceControl = "control" // the control API, with the org's control key
	ServiceEgress  = "egress"  // the public internet, through the egress proxy (UNIT_EGRESS=public)
)

// UnitServices are the host services an org's units reach through their sockets
// (runtime.Config.Services): the backend and the gateway passed on to their addresses, and
// the control API served by control. Each still asks for the unit's own credential (job
// token, org keys).
func UnitServices(apiURL, gatewayURL string, control, egress http.Handler) (map[string]http.Handler, error) {
	api, err := unitnet.Proxy(apiURL)
	if err != nil {
		return nil, fmt.Errorf("SARTIQ_API_URL: %w", err)
	}
	gw, err := unitnet.Proxy(gatewayURL)
	if err != nil {
		return nil, fmt.Errorf("GATEWAY_URL: %w", err)
	}
	services := map[string]http.Handler{ServiceAPI: api, ServiceGateway: gw, ServiceControl: control}
	if egress != nil {
		services[ServiceEgress] = egress
	}
	return services, nil
}

// unitURL is where org's units reach a host service: through the socket the runtime
// serves them, or at its own address when they share the host's network.
func (d *Dispatcher) unitURL(org, service, direct string) string {
	if u := d.cfg.Runtime.ServiceURL(org, service); u != "" {
		return u
	}
	return direct
}

// unitManifest is a claim's manifest URL as the worker is to fetch it: a URL on the API
// is given as its path, which the worker's client resolves against the address it
// reaches the API at (a unit off the host's network cannot reach the API's own).
func (d *Dispatcher) unitManifest(manifest string) string {
	m, err := url.Parse(manifest)
	api, err2 := url.Parse(d.cfg.APIURL)
	if err != nil || err2 != nil || m.Scheme != api.Scheme || m.Host != api.Host {
		return manifest
	}
	return (&url.URL{Path: m.Path, RawPath: m.RawPath, RawQuery: m.RawQuery}).String()
}

// Bounds of what the dispatcher reads of a worker's progress: the lines it mirrors of one
// run (the outcome is always read and mirrored), and a line's length.
const (
	maxProgressLines = 10_000
	maxProgressLine  = 1 << 20
)

// record mirrors the JSON progress lines of the worker, fenced by the home lease, and
// returns its outcome. A flood is cut and counted: past maxProgressLines only the outcome
// is mirrored, and a line longer than maxProgressLine is skipped. The failed file writes
// the outcome reports are counted and logged (the last outcome line's, should a worker
// print several).
func (d *Dispatcher) record(ctx context.Context, c *sartiq.Claim, kept *lease.Kept, claimed time.Time, r io.Reader) worker.Outcome {
	var outcome worker.Outcome
	var outcomeData json.RawMessage
	mirrored := 0
	eachLine(r, maxProgressLine, func() { d.metrics.outputDropped.WithLabelValues("long_lines").Inc() }, func(line []byte) {
		var ev struct {
			Event string          `json:"event"`
			Data  json.RawMessage `json:"data"`
		}
		if json.Unmarshal(line, &ev) != nil || ev.Event == "" {
			return
		}
		if ev.Event != "outcome" {
			if mirrored >= maxProgressLines {
				d.metrics.outputDropped.WithLabelValues("progress_lines").Inc()
				return
			}
			mirrored++
		}
		switch ev.Event {
		case "agent_start":
			d.metrics.claimToAgent.Observe(time.Since(claimed).Seconds())
		case "skills_cap":
			var capped struct {
				Disabled []string `json:"disabled"`
			}
			if json.Unmarshal(ev.Data, &capped) == nil {
				d.metrics.skillsDisabled.Add(float64(len(capped.Disabled)))
				d.cfg.Log.Info("skills cap disabled skills", "org", c.OrganizationID, "job", c.Job.ID, "disabled", capped.Disabled)
			}
		case "outcome":
			_ = json.Unmarshal(ev.Data, &outcome)
			outcomeData = ev.Data
		}
		err := d.leases.WithFence(ctx, kept.Lease(), func(tx pgx.Tx) error {
			if ev.Event == "start" {
				if err := d.mirror.Running(ctx, tx, c.Job.ID); err != nil {
					return err
				}
			}
			_, err := d.mirror.Event(ctx, tx, c.OrganizationID, c.Job.ID, c.Job.Attempt, ev.Event, ev.Data)
			return err
		})
		if err != nil && ctx.Err() == nil {
			d.cfg.Log.Warn("mirror progress", "job", c.Job.ID, "err", err)
		}
	})
	if failed := d.metrics.countWorkerWriteErrors(outcomeData); len(failed) > 0 {
		// The counter has no org label: the log says whose home it was.
		d.cfg.Log.Warn("the worker's file writes failed: the org home's disk (ORGS_ROOT)", "org", c.OrganizationID, "job", c.Job.ID, "file_write_errors", failed)
	}
	return outcome
}

// eachLine calls each with every line of r (without its newline) of at most max bytes,
// and tooLong for each longer one, which is skipped without being kept; it reads r to its end.
func eachLine(r io.Reader, max int, tooLong func(), each func([]byte)) {
	br := bufio.NewReaderSize(r, 64<<10)
	var line []byte
	long := false
	for {
		frag, err := br.ReadSlice('\n')
		if !long {
			if len(line)+len(frag) > max+1 { // +1: the newline
				long, line = true, line[:0]
			} else {
				line = append(line, frag...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if long {
			tooLong()
		} else if l := bytes.TrimSuffix(line, []byte("\n")); len(l) > 0 {
			each(l)
		}
		line, long = line[:0], false
		if err != nil {
			return
		}
	}
}
