package dispatch_test

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/sartiq"
)

// What the hostile-agent suite checks the same way on both runtimes.

// killTheWorker is an agent that kills its own worker, every attempt.
const killTheWorker = "kill -TERM $PPID\nexec sleep 30"

// checkKilledWorkersFailAtMaxAttempts asserts that every run of acme whose agent killed its
// worker was a crash (never a release), so that both of its jobs failed at MAX_ATTEMPTS
// while globex's completed.
func checkKilledWorkersFailAtMaxAttempts(t *testing.T, f *fixture) {
	t.Helper()
	if st := f.statuses(t); st[sartiq.StatusFailed] != 2 || st[sartiq.StatusCompleted] != 2 {
		t.Fatalf("want acme's two jobs failed and globex's two completed: %v", st)
	}
	rows, err := f.db.Query(context.Background(), `SELECT job_id, count(*) FILTER (WHERE outcome = 'crashed' AND reason LIKE '%signalled by something other than its dispatcher%'),
		count(*) FILTER (WHERE outcome = 'released') FROM claim_attempts WHERE org = 'acme' GROUP BY job_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	jobs := 0
	for rows.Next() {
		var job string
		var signalled, released int
		if err := rows.Scan(&job, &signalled, &released); err != nil {
			t.Fatal(err)
		}
		jobs++
		if signalled != f.cfg.MaxAttempts || released != 0 {
			t.Errorf("job %s: %d signalled crashes and %d releases; want MAX_ATTEMPTS=%d crashes and no release", job, signalled, released, f.cfg.MaxAttempts)
		}
	}
	if jobs != 2 {
		t.Fatalf("%d acme jobs in claim_attempts", jobs)
	}
}

// floodStderr is an agent that writes 1 GiB to stderr, then ends well.
const floodStderr = "head -c 1073741824 /dev/zero >&2\necho done"

// runTheFlood runs the fixture's jobs to their end with acme's agent flooding stderr, and
// asserts that the dispatcher's heap stayed far below the flood, that what it cut was
// counted (about 1 GiB), and that acme's runs ended with their outcome, not as crashes.
func runTheFlood(t *testing.T, f *fixture) {
	t.Helper()
	reg := prometheus.NewRegistry()
	f.cfg.Registerer = reg
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	d := f.dispatcher(t)
	for deadline := time.Now().Add(4 * time.Minute); ; {
		st := f.statuses(t)
		if st[sartiq.StatusQueued]+st[sartiq.StatusClaimed]+st[sartiq.StatusRunning] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 4 minutes the jobs are %v", st)
		}
		if _, err := d.Cycle(t.Context()); err != nil {
			t.Fatal(err)
		}
		d.Wait()
	}
	close(stop)
	<-sampled
	if grew := int64(peak.Load()) - int64(base.HeapInuse); grew > 200<<20 {
		t.Fatalf("the dispatcher's heap grew by %d MiB while the agent flooded stderr", grew>>20)
	}
	if cut := counterValue(t, reg, "hermes_dispatch_worker_output_dropped_total"); cut < 1<<30-(8<<10) {
		t.Fatalf("%.0f bytes counted as cut, want about 1 GiB", cut)
	}
	var outcomes []string
	rows, err := f.db.Query(context.Background(), `SELECT outcome FROM claim_attempts WHERE org = 'acme'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			t.Fatal(err)
		}
		outcomes = append(outcomes, o)
	}
	if len(outcomes) != 2 || strings.Contains(strings.Join(outcomes, " "), "crashed") {
		t.Fatalf("acme's runs ended %v: want each with the worker's outcome", outcomes)
	}
}

// On Docker too, an agent killing its worker is a crash each time: MAX_ATTEMPTS holds.
func TestDockerAgentThatKillsItsWorkerFailsItsJobsAtMaxAttempts(t *testing.T) {
	f := newFixture(t, true)
	useDockerWith(t, f, dockerOptions{shell: true})
	f.cfg.ClaimEnabled, f.cfg.MaxAttempts = true, 2
	dockerHostile(t, f, killTheWorker)
	cycleWithRestarts(t, f)
	checkKilledWorkersFailAtMaxAttempts(t, f)
}

// On Docker too, 1 GiB on stderr is cut and counted, the dispatcher's memory bounded.
func TestDockerGigabyteOnStderrIsCutAndCounted(t *testing.T) {
	f := newFixture(t, true)
	useDockerWith(t, f, dockerOptions{shell: true})
	f.cfg.ClaimEnabled = true
	dockerHostile(t, f, floodStderr)
	runTheFlood(t, f)
}

// checkOutOfMemoryAtMaxAttempts asserts what an agent past the memory limit leaves, at
// MAX_ATTEMPTS=1: each of acme's two jobs crashed once with the reason "out of memory" and
// was failed at once by its dispatcher, which had reached the cap (no re-claim); globex's
// jobs completed.
func checkOutOfMemoryAtMaxAttempts(t *testing.T, f *fixture) {
	t.Helper()
	if st := f.jobsOf(t, "acme"); st[sartiq.StatusFailed] != 2 {
		t.Errorf("acme's jobs: %v, want both failed at MAX_ATTEMPTS=1", st)
	}
	crashed := 0
	for _, a := range acmeAttempts(t, f) {
		if a.Outcome == "crashed" && strings.HasPrefix(a.Reason, "out of memory") {
			crashed++
			continue
		}
		t.Errorf("acme attempt %+v, want crashed, out of memory", a)
	}
	if crashed != 2 {
		t.Errorf("%d of acme's attempts ended out of memory, want 2: %+v", crashed, acmeAttempts(t, f))
	}
	checkOthersCompleted(t, f)
}
