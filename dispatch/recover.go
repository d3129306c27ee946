package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"hermeshost/sartiq"
	"hermeshost/worker"
)

// CrashedAttempts counts, from a job's event log in the backend, the runs that ended in a
// crash, attempt (the run ending now: a stale one being re-claimed, or one that just ended
// without an outcome) included. A re-claim says the attempt before it crashed (it went
// stale); a crash event, the attempt it was written under (the dispatcher ended it at once).
// An attempt is counted once whichever said so: one whose crash event was written but whose
// release was not went stale and was re-claimed too. Clean releases (a shutdown, a wrong
// org, a busy home) are not crashes; a failure is terminal and is never run again.
func CrashedAttempts(events []sartiq.Event, attempt int) int {
	crashed := map[int]bool{attempt: true}
	for _, e := range events {
		switch e.Kind {
		case sartiq.EventReclaim:
			crashed[e.Attempt-1] = true
		case sartiq.EventCrash:
			crashed[e.Attempt] = true
		}
	}
	return len(crashed)
}

// recover re-claims org's stale job: its worker died without a word. The backend's event
// log is the attempt count (it survives any host restart); claim_attempts, the host's record
// of the same, is checked against it. Below MaxAttempts the job runs again; at the cap it is
// re-claimed and failed at once with the reason, with the fresh token.
func (d *Dispatcher) recover(ctx context.Context, org string, job sartiq.Job) (bool, error) {
	dl, ok, err := d.prepareClaim(ctx, org)
	if !ok {
		return false, err
	}
	events, err := d.cfg.Bot.ListEvents(ctx, job.ID)
	if err != nil {
		d.giveBack(org, dl)
		return false, fmt.Errorf("attempts of job %s: %w", job.ID, err)
	}
	crashed := CrashedAttempts(events, job.Attempt)
	d.checkAttempts(ctx, job, crashed)
	c, err := d.cfg.Bot.Reclaim(ctx, job.ID)
	if err != nil {
		d.giveBack(org, dl)
		if sartiq.IsConflict(err) {
			return false, nil
		}
		return false, fmt.Errorf("re-claim job %s: %w", job.ID, err)
	}
	d.metrics.claims.WithLabelValues("reclaim").Inc()
	if d.wrongOrg(ctx, org, c) {
		d.giveBack(org, dl)
		return false, nil
	}
	// The stale attempt's worker is gone (its token is void now), and with it every
	// subagent it started: fail them before the next attempt starts its own.
	d.failSubagents(ctx, org, job.ID, fmt.Sprintf("the worker of job %s died: attempt %d went stale and was re-claimed", job.ID, job.Attempt))
	if crashed >= d.cfg.MaxAttempts {
		if err := d.recordClaim(ctx, c, "reclaim"); err != nil {
			d.cfg.Log.Error("record re-claim", "job", job.ID, "err", err)
		}
		d.giveUp(ctx, c, crashed)
		d.giveBack(org, dl)
		return false, nil
	}
	d.cfg.Log.Warn("re-claimed a stale job", "job", job.ID, "org", org, "crashed_attempts", crashed)
	d.start(ctx, dl, c, "reclaim")
	return true, nil
}

// checkAttempts compares the backend's count of crashed runs with the host's record: the
// attempts of the job that did not end cleanly (released, completed or failed). The backend
// wins; a difference (a record lost with a host, or a claim made elsewhere) is logged and
// counted.
func (d *Dispatcher) checkAttempts(ctx context.Context, job sartiq.Job, backend int) {
	var host int
	err := d.cfg.DB.QueryRow(ctx, `
SELECT count(*) FROM claim_attempts
 WHERE job_id = $1 AND (outcome IS NULL OR outcome NOT IN ('released', 'completed', 'failed'))`, job.ID).Scan(&host)
	if err != nil {
		d.cfg.Log.Warn("read claim_attempts", "job", job.ID, "err", err)
		return
	}
	if host != backend {
		d.metrics.attemptMismatch.Inc()
		d.cfg.Log.Warn("claim_attempts disagree with the backend's job log; the backend's count is used",
			"job", job.ID, "backend_crashed_attempts", backend, "host_unfinished_attempts", host)
	}
}

// endCrashed ends at once, with the job token the dispatcher still holds, an attempt whose
// run ended without an outcome (the worker or its container died, ran out of memory, its
// exec stream broke, or the worker reported a crash), instead of leaving the job to go
// stale: a crash event counts the attempt in the backend's log, then the job is released to
// the queue, and the next cycle claims it again. At the attempt cap it is failed with the
// reason instead. Releasing revokes the token, so a run that only lost its stream can no
// longer write to the backend (the runtime has also killed what the exec left), and the next
// attempt runs under a new home: lease. When the token is void already (the job was
// re-claimed as stale, or it ended after all) or the backend cannot be reached, the attempt
// is left to the stale-heartbeat path, as when the dispatcher itself dies.
//
// The attempt is recorded crashed with its own reason either way; it returns the status the
// job is left in at the backend and, when it was failed, the job's reason, for the mirror.
func (d *Dispatcher) endCrashed(c *sartiq.Claim, reason string, log *slog.Logger) (status, jobReason string) {
	status, jobReason = sartiq.StatusRunning, reason
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	api, err := sartiq.New(d.cfg.APIURL, c.JobToken)
	if err != nil {
		log.Error("end a crashed attempt", "err", err)
		return
	}
	msg := clip(fmt.Sprintf("attempt %d ended without an outcome: %s", c.Job.Attempt, reason), 1000)
	if _, err := api.AddEvent(ctx, c.Job.ID, sartiq.EventRequest{Kind: sartiq.EventCrash, Message: msg}); err != nil {
		log.Warn("could not end the crashed attempt at once: it goes stale and is re-claimed", "err", err)
		return
	}
	events, err := d.cfg.Bot.ListEvents(ctx, c.Job.ID)
	if err != nil {
		log.Warn("could not count the job's crashed attempts: it goes stale and is re-claimed", "err", err)
		return
	}
	crashed := CrashedAttempts(events, c.Job.Attempt)
	d.checkAttempts(ctx, c.Job, crashed)
	if crashed >= d.cfg.MaxAttempts {
		why := clip(fmt.Sprintf("gave up after %d crashed attempts (MAX_ATTEMPTS=%d); the last: %s", crashed, d.cfg.MaxAttempts, reason), 1000)
		if _, err := api.Fail(ctx, c.Job.ID, why); err != nil {
			log.Error("fail a job at its attempt cap: it goes stale, and recovery fails it", "err", err)
			return
		}
		d.metrics.crashesEnded.WithLabelValues("failed").Inc()
		d.metrics.gaveUp.Inc()
		log.Warn("job failed for good", "reason", why)
		return sartiq.StatusFailed, why
	}
	if _, err := api.Release(ctx, c.Job.ID, msg); err != nil {
		log.Warn("could not release the crashed attempt's job: it goes stale and is re-claimed", "err", err)
		return
	}
	d.metrics.crashesEnded.WithLabelValues("released").Inc()
	wait := crashBackoff(crashed, d.cfg.CrashBackoff)
	if wait > 0 {
		// The org's runs keep crashing: whatever is wrong may pass (a full disk, a service
		// restarting) before the last attempt is used.
		d.mu.Lock()
		d.backoff[c.OrganizationID] = backoff{until: time.Now().Add(wait), step: minBackoff / 2}
		d.mu.Unlock()
	}
	log.Warn("attempt crashed: the job is queued again", "attempt", c.Job.Attempt, "crashed_attempts", crashed, "reason", reason, "next_in", wait.String())
	return sartiq.StatusQueued, reason
}

// endOf is how the job's log says attempt ended (completed, failed or released), "" when
// it says no end.
func endOf(events []sartiq.Event, attempt int) string {
	end := ""
	for _, e := range events {
		if e.Attempt != attempt {
			continue
		}
		switch e.Kind {
		case sartiq.EventComplete:
			end = "completed"
		case sartiq.EventFail:
			end = "failed"
		case sartiq.EventRelease:
			end = "released"
		}
	}
	return end
}

// settleFor is how long a dispatcher tries to settle a run whose worker's terminal call did
// not land (settle).
const settleFor = 30 * time.Second

// settle ends a run whose worker could not make its terminal call (the backend, or its
// database, was down past the worker's retries), with the job token the dispatcher still
// holds: the job's log is read first, as the worker's call may have landed with its answer
// lost; then the call is made again, while the backend fails on the way or with a 5xx. The
// run ends as the backend has it: a run it cannot be brought to take is a crash (deliver
// then ends it with endCrashed, or leaves it to go stale), so the host never records an
// end the backend does not have.
func (d *Dispatcher) settle(c *sartiq.Claim, out worker.Outcome, log *slog.Logger) (outcome, reason string, result []byte) {
	// A hard stop ends it: the attempt is then left to go stale, as every run is then.
	ctx, cancel := context.WithTimeout(d.hard, settleFor)
	defer cancel()
	api, err := sartiq.New(d.cfg.APIURL, c.JobToken)
	if err != nil {
		return "crashed", err.Error(), nil
	}
	call := func() error {
		var err error
		switch out.Meant {
		case "completed":
			_, err = api.Complete(ctx, c.Job.ID, out.Result)
		case "failed":
			_, err = api.Fail(ctx, c.Job.ID, out.Reason)
		case "released":
			_, err = api.Release(ctx, c.Job.ID, out.Reason)
		default:
			err = fmt.Errorf("the worker meant %q, which no terminal call ends a job as", out.Meant)
		}
		return err
	}
	last, refused := errors.New(out.ReportError), false
retry:
	for wait := 250 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		events, err := d.cfg.Bot.ListEvents(ctx, c.Job.ID)
		if err == nil {
			if end := endOf(events, c.Job.Attempt); end != "" {
				log.Info("the worker's terminal call had landed", "outcome", end, "worker_error", out.ReportError)
				return end, out.Reason, out.Result
			}
			if refused {
				break retry // and the log shows no end: no call of this run landed
			}
			if err = call(); err == nil {
				log.Warn("the worker's terminal call failed; the dispatcher made it", "outcome", out.Meant, "worker_error", out.ReportError)
				return out.Meant, out.Reason, out.Result
			}
			// Refused (the token is void, say): the log is read once more, at once, as an
			// earlier call (the worker's) may have landed with its answer lost.
			refused = !sartiq.IsTransient(err)
		}
		last = err
		if refused {
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			break retry
		case <-t.C:
		}
	}
	return "crashed", clip(fmt.Sprintf("the run ended %s but the backend did not take it: %v", out.Meant, last), 1000), nil
}

// clip is s cut to at most n bytes, as valid UTF-8.
func clip(s string, n int) string {
	if len(s) > n {
		s = s[:n]
	}
	return strings.ToValidUTF8(s, "")
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
	d.metrics.outcomes.WithLabelValues("failed").Inc()
	d.metrics.gaveUp.Inc()
	if err := pgx.BeginFunc(ctx, d.cfg.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE claim_attempts SET outcome = 'failed', reason = $3, finished_at = now() WHERE job_id = $1 AND attempt = $2`,
			c.Job.ID, c.Job.Attempt, reason); err != nil {
			return err
		}
		return d.mirror.Finished(ctx, tx, c.Job.ID, sartiq.StatusFailed, reason, nil)
	}); err != nil {
		d.cfg.Log.Error("record giving up", "job", c.Job.ID, "err", err)
	}
	d.cfg.Log.Warn("job failed for good", "job", c.Job.ID, "org", c.OrganizationID, "reason", reason)
}

// reconcile closes the host's record of org's attempts that no dispatcher will finish: rows
// without an outcome whose run the backend shows has ended (a replica that died between its
// worker's report and its own record of it), so the mirror does not show them running
// forever. Runs the backend still shows going are left to their worker or to recovery.
func (d *Dispatcher) reconcile(ctx context.Context, org string, active []sartiq.Job) error {
	rows, err := d.cfg.DB.Query(ctx, `SELECT job_id, attempt FROM claim_attempts WHERE org = $1 AND outcome IS NULL`, org)
	if err != nil {
		return fmt.Errorf("reconcile org %s: %w", org, err)
	}
	type run struct {
		job     string
		attempt int
	}
	var open []run
	for rows.Next() {
		var r run
		if err := rows.Scan(&r.job, &r.attempt); err != nil {
			rows.Close()
			return fmt.Errorf("reconcile org %s: %w", org, err)
		}
		open = append(open, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reconcile org %s: %w", org, err)
	}
	running := map[run]bool{}
	live := map[string]bool{} // jobs with some attempt going, whose children are its
	for _, j := range active {
		running[run{j.ID, j.Attempt}] = true
		live[j.ID] = true
	}
	for _, r := range open {
		if running[r] {
			continue
		}
		events, err := d.cfg.Bot.ListEvents(ctx, r.job)
		if err != nil {
			return fmt.Errorf("reconcile job %s: %w", r.job, err)
		}
		outcome, status := endOf(events, r.attempt), ""
		if outcome == "" {
			outcome = "lost"
		} else {
			status = mirrorStatus(outcome)
		}
		reason := "recorded from the backend's job log by " + d.holder + ": the dispatcher that ran it stopped first"
		if err := pgx.BeginFunc(ctx, d.cfg.DB, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE claim_attempts SET outcome = $3, reason = $4, finished_at = now() WHERE job_id = $1 AND attempt = $2 AND outcome IS NULL`,
				r.job, r.attempt, outcome, reason); err != nil {
				return err
			}
			return d.mirror.Reconciled(ctx, tx, r.job, r.attempt, status)
		}); err != nil {
			return fmt.Errorf("reconcile job %s: %w", r.job, err)
		}
		d.cfg.Log.Info("attempt reconciled from the backend", "job", r.job, "attempt", r.attempt, "outcome", outcome)
		if !live[r.job] {
			d.failSubagents(ctx, org, r.job, fmt.Sprintf("job %s ended (%s) under a dispatcher that stopped before its subagents reported", r.job, outcome))
		}
	}
	return nil
}

// failSubagents ends the live subagents of a job whose worker is gone. A failure is logged:
// the handles stay live in the dashboard until the next recovery, but no job waits on them.
func (d *Dispatcher) failSubagents(ctx context.Context, org, job, reason string) {
	if _, err := d.subagents.FailJob(ctx, org, job, reason); err != nil {
		d.cfg.Log.Warn("fail the subagents of an ended job", "job", job, "org", org, "err", err)
	}
}
