package dispatch_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"hermeshost/sartiq"
	"hermeshost/sartiq/backend"
	"hermeshost/sartiq/backend/backendtest"
)

// A run whose end did not reach the backend through its worker (the backend's database
// restarting past the worker's retries, or the answer lost on the way back) is settled by
// the dispatcher, which holds the job token too: each demo job ends completed at its first
// attempt, recorded completed once, with no crash and no re-claim.
func TestTheDispatcherSettlesARunWhoseCompletionDidNotReachTheBackend(t *testing.T) {
	for _, tc := range []struct {
		name string
		// fault is what the backend's front does with a call to complete, the first of
		// them made at first.
		fault func(first time.Time) backendtest.Fault
		log   string // what the dispatcher logs of each job it settled
	}{
		{"refused past the worker's retries", func(first time.Time) backendtest.Fault {
			// Longer than run-job tries (10 s); the dispatcher tries for 30.
			if time.Since(first) < 12*time.Second {
				return backendtest.Refuse
			}
			return backendtest.Pass
		}, "the worker's terminal call failed; the dispatcher made it"},
		{"landed, its answer lost", func(time.Time) backendtest.Fault { return backendtest.LoseAnswer },
			"the worker's terminal call had landed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, true)
			f.cfg.ClaimEnabled = true
			var mu sync.Mutex
			var first time.Time
			f.behindFront(t, func(r *http.Request) backendtest.Fault {
				if !strings.HasSuffix(r.URL.Path, "/complete") {
					return backendtest.Pass
				}
				mu.Lock()
				if first.IsZero() {
					first = time.Now()
				}
				at := first
				mu.Unlock()
				return tc.fault(at)
			})
			cycleUntilDone(t, f, f.dispatcher(t), 3*time.Minute)
			checkDemoJobsDone(t, f, 4, 0)
			for _, org := range backend.DemoOrganizations {
				for _, typ := range []string{sartiq.TypeProductIngest, sartiq.TypeGuidelinesExtraction} {
					job := f.backend.DemoJob(t, org, typ)
					if got := strings.Join(runKinds(t, f, job), " "); got != "claim@1 complete@1" {
						t.Errorf("job %s's runs at the backend: %s, want claim@1 complete@1", job, got)
					}
				}
			}
			if n := strings.Count(f.logs.String(), tc.log); n == 0 {
				t.Errorf("no job was settled by the dispatcher (%q):\n%s", tc.log, f.logs.String())
			}
		})
	}
}

// A run whose completion the backend never takes, from the worker nor from the dispatcher:
// the attempt is ended as a crash, not recorded as completed, and the next attempt (a new
// token, which the backend takes) completes the job.
func TestARunWhoseCompletionTheBackendNeverTakesIsACrash(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	job := f.backend.DemoJob(t, "acme", sartiq.TypeProductIngest)
	var mu sync.Mutex
	refused := "" // the job token whose completions are refused: its first attempt's
	f.behindFront(t, func(r *http.Request) backendtest.Fault {
		if r.URL.Path != "/agent-jobs/"+job+"/complete" {
			return backendtest.Pass
		}
		mu.Lock()
		defer mu.Unlock()
		if refused == "" {
			refused = r.Header.Get("Authorization")
		}
		if r.Header.Get("Authorization") == refused {
			return backendtest.Refuse
		}
		return backendtest.Pass
	})
	cycleUntilDone(t, f, f.dispatcher(t), 4*time.Minute)
	if got := strings.Join(runKinds(t, f, job), " "); got != "claim@1 crash@1 release@1 claim@2 complete@2" {
		t.Errorf("the job's runs at the backend: %s, want claim@1 crash@1 release@1 claim@2 complete@2", got)
	}
	as := attemptsOf(t, f, job)
	if len(as) != 2 || as[0].Outcome != "crashed" || !strings.Contains(as[0].Reason, "the run ended completed but the backend did not take it") ||
		as[1].Outcome != "completed" {
		t.Errorf("the host's record of the job's attempts: %+v", as)
	}
}

// behindFront puts a backendtest.Front doing fault before the fixture's backend: the
// dispatcher's calls, its bot's and its units' go through it (the backend names its
// manifests at the address it was called at). A failed test prints the dispatcher's log.
func (f *fixture) behindFront(t *testing.T, fault func(*http.Request) backendtest.Fault) {
	t.Helper()
	f.cfg.APIURL = f.backend.Front(t, fault)
	bot, err := sartiq.New(f.cfg.APIURL, backendtest.BotToken)
	if err != nil {
		t.Fatal(err)
	}
	f.cfg.Bot = bot
	f.useProcess(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the dispatcher's log:\n%s", f.logs.String())
		}
	})
}
