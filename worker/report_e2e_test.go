package worker_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"hermeshost/sartiq"
	"hermeshost/sartiq/backend/backendtest"
)

// completeBehindFront runs acme's demo guidelines job with run-job reaching the backend
// through a front that does to each call to complete what fault says, given how many came
// before it. It returns the run, the job and how many calls to complete were made.
func completeBehindFront(t *testing.T, w *world, fault func(n int32) backendtest.Fault) (result, string, int32) {
	t.Helper()
	ctx := context.Background()
	var calls atomic.Int32
	front := w.backend.Front(t, func(r *http.Request) backendtest.Fault {
		if strings.HasSuffix(r.URL.Path, "/complete") {
			return fault(calls.Add(1) - 1)
		}
		return backendtest.Pass
	})
	job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
	claim, err := w.bot.Claim(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	claim.ManifestURL = front + strings.TrimPrefix(claim.ManifestURL, w.backend.URL) // the API's, at the front
	r := w.execLive(ctx, "acme", claim, nil, live{env: []string{"SARTIQ_API_URL=" + front}})
	return r, job, calls.Load()
}

// A backend that refuses the completion for a while (its database restarting): run-job
// makes the call again, and the job completes.
func TestACompletionRefusedForAWhileIsMadeAgain(t *testing.T) {
	w := newWorld(t, "process")
	r, job, calls := completeBehindFront(t, w, func(n int32) backendtest.Fault {
		if n < 2 {
			return backendtest.Refuse
		}
		return backendtest.Pass
	})
	if r.err != nil || r.status.Code != 0 || r.outcome.Status != "completed" || r.outcome.Meant != "" {
		t.Fatalf("worker: %v %v outcome %+v\n%s", r.err, r.status, r.outcome, r.stderr)
	}
	if calls != 3 {
		t.Errorf("%d calls to complete, want 3 (two refused, then the one that landed)", calls)
	}
	if st := w.job(context.Background(), job).Status; st != sartiq.StatusCompleted {
		t.Errorf("the job is %s at the backend, want COMPLETED", st)
	}
}

// A completion refused past the worker's retries: its outcome says it is unreported, what
// the run meant, why, and keeps the result, for the dispatcher to settle; run-job exits
// non-zero, and the job is still RUNNING at the backend, not ended behind its back.
func TestACompletionRefusedThroughoutLeavesTheRunUnreported(t *testing.T) {
	w := newWorld(t, "process")
	r, job, calls := completeBehindFront(t, w, func(int32) backendtest.Fault { return backendtest.Refuse })
	o := r.outcome
	if r.err != nil || r.status.Code == 0 || o.Status != "unreported" || o.Meant != "completed" ||
		!strings.Contains(o.ReportError, "503") || len(o.Result) == 0 {
		t.Fatalf("worker: %v %v outcome %+v\n%s", r.err, r.status, o, r.stderr)
	}
	if calls < 2 {
		t.Errorf("%d calls to complete: a refusal with a 503 is made again", calls)
	}
	if st := w.job(context.Background(), job).Status; st != sartiq.StatusRunning {
		t.Errorf("the job is %s at the backend, want RUNNING", st)
	}
}
