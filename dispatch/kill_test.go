package dispatch_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"hermeshost/dispatch"
	"hermeshost/dispatch/runtime"
	"hermeshost/sartiq"
	"hermeshost/scriptedagent"
)

// On the process runtime a worker is the org's long-lived unit process with each job's
// `hermes-host worker run-job` beside it: either may die under a job.
func TestKilledWorkerProcessJobIsReclaimedAndCompleted(t *testing.T) {
	t.Run("WorkerUnit", func(t *testing.T) {
		f := newFixture(t, true)
		var killed runtime.Unit
		reason := killMidJob(t, f, func(t *testing.T) {
			killed = workerUnit(t, f.cfg.Runtime, "acme")
			pid, err := strconv.Atoi(killed.ID)
			if err != nil {
				t.Fatal(err)
			}
			// The unit's own process only: its death must take the job along.
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill %s (pid %d): %v", killed.Name, pid, err)
			}
		})
		if !strings.Contains(reason, runtime.ErrWorkerGone.Error()) {
			t.Errorf("attempt 1 ended %q, want the worker gone", reason)
		}
		if now := workerUnit(t, f.cfg.Runtime, "acme"); !now.Running || now.ID == killed.ID {
			t.Errorf("acme's worker after the re-claim: %+v, want a fresh process in place of pid %s", now, killed.ID)
		}
	})
	t.Run("RunJob", func(t *testing.T) {
		f := newFixture(t, true)
		var unit runtime.Unit
		reason := killMidJob(t, f, func(t *testing.T) {
			unit = workerUnit(t, f.cfg.Runtime, "acme")
			pid := runJobPID(t, "acme")
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill run-job (pid %d): %v", pid, err)
			}
		})
		if want := "exit " + strconv.Itoa(128+int(syscall.SIGKILL)); reason != want {
			t.Errorf("attempt 1 ended %q, want %q", reason, want)
		}
		// Only the job died: the re-claim ran in the same worker.
		if now := workerUnit(t, f.cfg.Runtime, "acme"); !now.Running || now.ID != unit.ID {
			t.Errorf("acme's worker after the re-claim: %+v, want the same process, pid %s", now, unit.ID)
		}
	})
}

// runJobPID finds the `hermes-host worker run-job` this test process started for org.
func runJobPID(t *testing.T, org string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var found []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		cmdline, err1 := os.ReadFile(filepath.Join(dir, "cmdline"))
		environ, err2 := os.ReadFile(filepath.Join(dir, "environ"))
		stat, err3 := os.ReadFile(filepath.Join(dir, "stat"))
		if err1 != nil || err2 != nil || err3 != nil {
			continue // ended while we looked, or not ours to read
		}
		args := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
		// stat: pid (comm) state ppid ...; comm may hold spaces and parentheses.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(args) == 3 && filepath.Base(args[0]) == "hermes-host" && args[1] == "worker" && args[2] == "run-job" &&
			len(fields) > 1 && descendsFromTest(pid, fields[1]) &&
			bytes.Contains(append([]byte{0}, environ...), []byte("\x00HERMES_ORG="+org+"\x00")) {
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		t.Fatalf("run-job processes of %s started by this test: %v, want one", org, found)
	}
	return found[0]
}

// descendsFromTest says whether pid, whose parent is ppid, was started by this test: as its
// child, or in a sandbox, under bubblewrap and the sandbox's pid 1.
func descendsFromTest(pid int, ppid string) bool {
	for range 3 {
		if ppid == strconv.Itoa(os.Getpid()) {
			return true
		}
		stat, err := os.ReadFile("/proc/" + ppid + "/stat")
		if err != nil {
			return false
		}
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 2 {
			return false
		}
		ppid = fields[1]
	}
	return false
}

// A worker killed mid-job while its dispatcher lives, at the product's default timings
// (poll 5s, STALE_AFTER 45s, heartbeat 10s): the dispatcher ends the attempt as soon as the
// run ends and its job is claimed again within one poll interval, long before it could go
// stale, and the crash is counted once.
func TestAKilledWorkersJobRunsAgainWithinOnePollWhileItsDispatcherLives(t *testing.T) {
	f := newFixture(t, true)
	f.backend.Clock.Follow()
	f.cfg.ClaimEnabled = true
	f.cfg.WorkerEnv = []string{"HERMES_BIN=scripted-agent"} // the default heartbeat
	writeKnobs(t, f, "acme", &scriptedagent.Knobs{StallAtWrite: 1})
	d := f.dispatcher(t)
	opts := dispatch.RunOptions{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Run(ctx, opts)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	const poll = 5 * time.Second // RunOptions' default
	if stale := f.backend.Config.StaleAfter; stale < 9*poll {
		t.Fatalf("the backend's STALE_AFTER is %s, not the default", stale)
	}
	var job string
	waitFor(t, 30*time.Second, "acme's agent to start", func() bool {
		err := f.db.QueryRow(ctx, `SELECT e.job_id FROM mirror_job_events e JOIN mirror_jobs j USING (job_id) WHERE j.org = 'acme' AND e.attempt = 1 AND e.kind = 'agent_start'`).Scan(&job)
		return err == nil
	})
	writeKnobs(t, f, "acme", nil)
	unit := workerUnit(t, f.cfg.Runtime, "acme")
	pid, err := strconv.Atoi(unit.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var claimedAgain time.Time
	waitFor(t, 2*poll, "the job to be claimed again", func() bool {
		err := f.backend.DB.QueryRow(ctx, `SELECT at FROM agent_job_events WHERE job_id = $1 AND attempt = 2 AND kind = 'claim'`, job).Scan(&claimedAgain)
		return err == nil
	})
	if took := claimedAgain.Sub(killed); took > poll {
		t.Errorf("claimed again %s after the kill, want within one poll interval (%s)", took, poll)
	}
	waitFor(t, time.Minute, "the demo jobs to complete", func() bool {
		return f.statuses(t)[sartiq.StatusCompleted] == 4
	})
	if kinds := runKinds(t, f, job); !slices.Equal(kinds, []string{"claim@1", "crash@1", "release@1", "claim@2", "complete@2"}) {
		t.Errorf("the killed job's log reads %v, want claim@1 crash@1 release@1 claim@2 complete@2", kinds)
	}
	if got := attemptsOf(t, f, job); len(got) != 2 || got[0].Outcome != "crashed" || got[1].Outcome != "completed" {
		t.Errorf("claim_attempts of the killed job: %+v, want one crash, then completed", got)
	}
}

// The outcome of a run is recorded even when the host's database refuses it for a while (a
// Postgres restart): the delivery tries again until it is written.
func TestARunsOutcomeIsRecordedAfterTheDatabaseRefusedItForAWhile(t *testing.T) {
	f := newFixture(t, true)
	_, job := stallAcme(t, f)
	ctx := t.Context()
	waitFor(t, 30*time.Second, "acme's agent to start", func() bool {
		var ok bool
		err := f.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM mirror_job_events WHERE job_id = $1 AND kind = 'agent_start')`, job).Scan(&ok)
		return err == nil && ok
	})
	// The outcome's write is refused, as by a database that is down.
	if _, err := f.db.Exec(ctx, `REVOKE UPDATE ON claim_attempts FROM CURRENT_USER`); err != nil {
		t.Fatal(err)
	}
	granted := false
	grant := func() {
		if !granted {
			granted = true
			if _, err := f.db.Exec(context.Background(), `GRANT UPDATE ON claim_attempts TO CURRENT_USER`); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(grant)
	if err := syscall.Kill(runJobPID(t, "acme"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the delivery to try the record again", func() bool {
		return strings.Contains(f.logs.String(), `"msg":"record outcome: trying again"`)
	})
	grant()
	waitFor(t, 20*time.Second, "the outcome to be recorded", func() bool {
		a := attemptsOf(t, f, job)
		return len(a) == 1 && a[0].Outcome == "crashed"
	})
	if strings.Contains(f.logs.String(), `"msg":"record outcome","`) {
		t.Errorf("the record was given up:\n%s", f.logs.String())
	}
}
