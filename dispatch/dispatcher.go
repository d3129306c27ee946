// Package dispatch turns the backend's queue into finished work: it polls behind the gateway
// gate, claims (when CLAIM_ENABLED), runs each organization's jobs one at a time in that
// org's worker through a container runtime, and records claims and the workers' progress in
// the host's job mirror.
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
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"hermeshost/dispatch/runtime"
	"hermeshost/gateway"
	"hermeshost/orghome"
	"hermeshost/sartiq"
	"hermeshost/service"
	"hermeshost/worker"
)

// JobTypes are the types polled, one list request each (the API's type defaults to one).
var JobTypes = []string{sartiq.TypeProductIngest, sartiq.TypeGuidelinesExtraction}

// Config is one dispatcher's settings.
type Config struct {
	Instance string
	Bot      *sartiq.Client
	// APIURL is what workers are told to call (the backend as seen from a worker).
	APIURL  string
	Runtime runtime.Runtime
	DB      *pgxpool.Pool
	// OrgsRoot is the host path of the org homes, for SOUL.md before a worker starts.
	OrgsRoot string

	GatewayURL    string
	GatewayKey    service.Secret // the host's own key, for the gate
	GatewaySecret service.Secret // derives each org's key for its containers
	WorkerModel   string
	VisionModel   string

	ClaimEnabled bool
	// MaxAttempts is how many crashed or failed runs a job may have; past it recovery
	// re-claims the stale job and fails it with the reason.
	MaxAttempts int
	// WorkerEnv is passed to every run-job besides what the dispatcher sets (for example
	// HEARTBEAT_INTERVAL, MAX_TURNS, HERMES_BIN).
	WorkerEnv []string
	Log       *slog.Logger
	HTTP      *http.Client
}

// Dispatcher runs the cycle. At most one job per org is in flight.
type Dispatcher struct {
	cfg      Config
	mu       sync.Mutex
	inFlight map[string]bool
	wg       sync.WaitGroup
}

// New is a Dispatcher on cfg.
func New(cfg Config) *Dispatcher {
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 10 * time.Second}
	}
	return &Dispatcher{cfg: cfg, inFlight: map[string]bool{}}
}

// ErrGateClosed: the gateway is down or does not serve both models; nothing was polled.
var ErrGateClosed = errors.New("gateway gate closed")

// Cycle is one poll: the gateway gate first, then one list request per job type, then a
// claim (or, with claiming off, a log line) for each queued job of an org that has none in
// flight. It returns how many jobs it started.
func (d *Dispatcher) Cycle(ctx context.Context) (int, error) {
	if err := gateway.Gate(ctx, d.cfg.HTTP, d.cfg.GatewayURL, d.cfg.GatewayKey.Reveal(), d.cfg.WorkerModel, d.cfg.VisionModel); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrGateClosed, err)
	}
	started := 0
	recovered, err := d.recover(ctx)
	started += recovered
	if err != nil {
		return started, err
	}
	for _, typ := range JobTypes {
		page, err := d.cfg.Bot.ListJobs(ctx, sartiq.ListJobsParams{Status: sartiq.StatusQueued, Type: typ, Limit: 100})
		if err != nil {
			return started, fmt.Errorf("poll %s jobs: %w", typ, err)
		}
		for _, job := range page.Jobs {
			if !d.cfg.ClaimEnabled {
				d.cfg.Log.Info("CLAIM_ENABLED=false: would claim", "job", job.ID, "type", job.Type, "org", job.OrganizationID)
				continue
			}
			if !d.reserve(job.OrganizationID) {
				continue
			}
			claim, err := d.cfg.Bot.Claim(ctx, job.ID)
			if err != nil {
				d.release(job.OrganizationID)
				if sartiq.IsConflict(err) {
					continue // another claimant won
				}
				return started, fmt.Errorf("claim job %s: %w", job.ID, err)
			}
			d.start(ctx, claim, "claim")
			started++
		}
	}
	return started, nil
}

// recover re-claims jobs whose worker died: CLAIMED or RUNNING jobs the backend reports
// stale. The job's event log in the backend is the attempt count (it survives any host
// restart): each re-claim says the attempt before it crashed, and the stale attempt itself
// crashed too. Below MaxAttempts the job runs again; at the cap it is re-claimed and failed
// at once with the reason, with the fresh token.
func (d *Dispatcher) recover(ctx context.Context) (int, error) {
	started := 0
	for _, typ := range JobTypes {
		page, err := d.cfg.Bot.ListJobs(ctx, sartiq.ListJobsParams{Status: sartiq.StatusClaimed + "," + sartiq.StatusRunning, Type: typ, Limit: 100})
		if err != nil {
			return started, fmt.Errorf("poll stale %s jobs: %w", typ, err)
		}
		for _, job := range page.Jobs {
			if !job.Stale {
				continue
			}
			if !d.cfg.ClaimEnabled {
				d.cfg.Log.Info("CLAIM_ENABLED=false: would re-claim a stale job", "job", job.ID, "org", job.OrganizationID)
				continue
			}
			if !d.reserve(job.OrganizationID) {
				continue
			}
			events, err := d.cfg.Bot.ListEvents(ctx, job.ID)
			if err != nil {
				d.release(job.OrganizationID)
				return started, fmt.Errorf("attempts of job %s: %w", job.ID, err)
			}
			crashed := 1
			for _, e := range events {
				if e.Kind == sartiq.EventReclaim {
					crashed++
				}
			}
			claim, err := d.cfg.Bot.Reclaim(ctx, job.ID)
			if err != nil {
				d.release(job.OrganizationID)
				if sartiq.IsConflict(err) {
					continue
				}
				return started, fmt.Errorf("re-claim job %s: %w", job.ID, err)
			}
			if crashed >= d.cfg.MaxAttempts {
				if err := d.recordClaim(ctx, claim, "reclaim"); err != nil {
					d.cfg.Log.Error("record re-claim", "job", job.ID, "err", err)
				}
				d.giveUp(ctx, claim, crashed)
				d.release(job.OrganizationID)
				continue
			}
			d.cfg.Log.Warn("re-claimed a stale job", "job", job.ID, "org", job.OrganizationID, "crashed_attempts", crashed)
			d.start(ctx, claim, "reclaim")
			started++
		}
	}
	return started, nil
}

func (d *Dispatcher) giveUp(ctx context.Context, c *sartiq.Claim, crashed int) {
	reason := fmt.Sprintf("gave up after %d crashed attempts (MAX_ATTEMPTS=%d)", crashed, d.cfg.MaxAttempts)
	api, err := sartiq.New(d.cfg.APIURL, c.JobToken)
	if err == nil {
		_, err = api.Fail(ctx, c.Job.ID, reason)
	}
	if err != nil {
		d.cfg.Log.Error("fail a job past its attempts", "job", c.Job.ID, "err", err)
		return
	}
	if _, err := d.cfg.DB.Exec(ctx, `
WITH a AS (UPDATE claim_attempts SET outcome = 'failed', reason = $3, finished_at = now() WHERE job_id = $1 AND attempt = $2)
UPDATE mirror_jobs SET status = 'FAILED', error = $3, updated_at = now() WHERE job_id = $1`, c.Job.ID, c.Job.Attempt, reason); err != nil {
		d.cfg.Log.Error("record giving up", "job", c.Job.ID, "err", err)
	}
	d.cfg.Log.Warn("job failed for good", "job", c.Job.ID, "org", c.OrganizationID, "reason", reason)
}

// start records a claim and delivers it in the background; the org's slot, reserved by the
// caller, is freed when the delivery ends. Deliveries outlive ctx: a job in flight is not
// cut off by the end of the cycle that claimed it.
func (d *Dispatcher) start(ctx context.Context, claim *sartiq.Claim, kind string) {
	if err := d.recordClaim(ctx, claim, kind); err != nil {
		d.cfg.Log.Error("record "+kind, "job", claim.Job.ID, "err", err)
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer d.release(claim.OrganizationID)
		d.deliver(context.WithoutCancel(ctx), claim)
	}()
}

// Wait waits for the jobs in flight.
func (d *Dispatcher) Wait() { d.wg.Wait() }

func (d *Dispatcher) reserve(org string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inFlight[org] {
		return false
	}
	d.inFlight[org] = true
	return true
}

func (d *Dispatcher) release(org string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.inFlight, org)
}

func (d *Dispatcher) recordClaim(ctx context.Context, c *sartiq.Claim, kind string) error {
	_, err := d.cfg.DB.Exec(ctx, `
WITH a AS (
    INSERT INTO claim_attempts (job_id, org, attempt, instance, kind) VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (job_id, attempt) DO NOTHING
), m AS (
    INSERT INTO mirror_jobs (job_id, org, type, status, attempt) VALUES ($1, $2, $6, 'CLAIMED', $3)
    ON CONFLICT (job_id) DO UPDATE SET status = 'CLAIMED', attempt = EXCLUDED.attempt, updated_at = now()
)
SELECT 1`, c.Job.ID, c.OrganizationID, c.Job.Attempt, d.cfg.Instance, kind, c.Job.Type)
	if err != nil {
		return fmt.Errorf("record %s of job %s: %w", kind, c.Job.ID, err)
	}
	return d.mirrorEvent(ctx, c.Job.ID, c.Job.Attempt, kind, map[string]any{"instance": d.cfg.Instance})
}

func (d *Dispatcher) mirrorEvent(ctx context.Context, job string, attempt int, kind string, data any) error {
	raw, err := json.Marshal(data)
	if err != nil {
		return err
	}
	_, err = d.cfg.DB.Exec(ctx, `INSERT INTO mirror_job_events (job_id, attempt, kind, data) VALUES ($1, $2, $3, $4)`, job, attempt, kind, raw)
	if err != nil {
		return fmt.Errorf("mirror event of job %s: %w", job, err)
	}
	return nil
}

// deliver ensures the org's identity and worker, execs run-job with the token in the exec
// environment only, records each progress line, and records the outcome.
func (d *Dispatcher) deliver(ctx context.Context, c *sartiq.Claim) {
	log := d.cfg.Log.With("job", c.Job.ID, "org", c.OrganizationID)
	outcome, reason := d.run(ctx, c, log)
	if _, err := d.cfg.DB.Exec(ctx, `
WITH a AS (
    UPDATE claim_attempts SET outcome = $3, reason = NULLIF($4, ''), finished_at = now() WHERE job_id = $1 AND attempt = $2
)
UPDATE mirror_jobs SET status = $5, error = NULLIF($4, ''), updated_at = now() WHERE job_id = $1`,
		c.Job.ID, c.Job.Attempt, outcome, reason, mirrorStatus(outcome)); err != nil {
		log.Error("record outcome", "err", err)
	}
	log.Info("job outcome", "outcome", outcome, "reason", reason)
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
	// crashed or unreported: still RUNNING at the backend until recovery re-claims it.
	return sartiq.StatusRunning
}

func (d *Dispatcher) run(ctx context.Context, c *sartiq.Claim, log *slog.Logger) (outcome, reason string) {
	dir := filepath.Join(d.cfg.OrgsRoot, c.OrganizationID)
	// An org's first job makes its home; the id was validated by the backend and is checked
	// again by OpenHome.
	if err := orghome.ValidID(c.OrganizationID); err != nil {
		return "crashed", err.Error()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "crashed", fmt.Sprintf("make the home of %s: %v", c.OrganizationID, err)
	}
	home, err := orghome.OpenHome(c.OrganizationID, dir)
	if err != nil {
		return "crashed", err.Error()
	}
	_, err = home.EnsureSoul(orghome.Identity{OrgID: c.OrganizationID, DisplayName: c.OrganizationID})
	home.Close()
	if err != nil {
		return "crashed", err.Error()
	}
	if _, err := d.cfg.Runtime.EnsureWorker(ctx, c.OrganizationID); err != nil {
		return "crashed", err.Error()
	}
	key, err := gateway.OrgKey(d.cfg.GatewaySecret.Reveal(), c.OrganizationID)
	if err != nil {
		return "crashed", err.Error()
	}
	assignment, _ := json.Marshal(worker.Assignment{Job: c.Job, OrganizationID: c.OrganizationID, ManifestURL: c.ManifestURL})
	env := append([]string{
		"SARTIQ_TOKEN=" + c.JobToken, "SARTIQ_API_URL=" + d.cfg.APIURL,
		"GATEWAY_URL=" + d.cfg.GatewayURL, "GATEWAY_KEY=" + key, "WORKER_MODEL=" + d.cfg.WorkerModel,
	}, d.cfg.WorkerEnv...)
	pr, pw := io.Pipe()
	var stderr bytes.Buffer
	done := make(chan string, 1)
	go func() { done <- d.record(ctx, c, pr) }()
	st, err := d.cfg.Runtime.Exec(ctx, c.OrganizationID, runtime.Command{
		Args: []string{"hermes-host", "worker", "run-job"}, Env: env,
		Stdin: bytes.NewReader(assignment), Stdout: pw, Stderr: &stderr,
	})
	pw.Close()
	status := <-done
	if err != nil {
		return "crashed", err.Error()
	}
	if status == "" {
		status = "crashed"
	}
	if st.Code != 0 && status == "crashed" {
		tail := stderr.Bytes()
		if len(tail) > 500 {
			tail = tail[len(tail)-500:]
		}
		log.Warn("worker exited", "status", st.String(), "stderr", string(tail))
		return status, st.String()
	}
	return status, ""
}

// record mirrors every JSON progress line of the worker and returns its outcome status.
func (d *Dispatcher) record(ctx context.Context, c *sartiq.Claim, r io.Reader) string {
	status := ""
	lines := bufio.NewScanner(r)
	lines.Buffer(make([]byte, 64<<10), 1<<20)
	for lines.Scan() {
		var ev struct {
			Event string          `json:"event"`
			Data  json.RawMessage `json:"data"`
		}
		if json.Unmarshal(lines.Bytes(), &ev) != nil || ev.Event == "" {
			continue
		}
		if err := d.mirrorEvent(ctx, c.Job.ID, c.Job.Attempt, ev.Event, ev.Data); err != nil {
			d.cfg.Log.Warn("mirror progress", "job", c.Job.ID, "err", err)
		}
		if ev.Event == "outcome" {
			var out worker.Outcome
			if json.Unmarshal(ev.Data, &out) == nil {
				status = out.Status
			}
		}
	}
	_, _ = io.Copy(io.Discard, r)
	return status
}
