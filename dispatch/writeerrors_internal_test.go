package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"hermeshost/lease"
	"hermeshost/sartiq"
	"hermeshost/worker"
)

// recordOutput runs record over a worker's stdout on a dispatcher of its own, and answers
// its outcome status, hermes_dispatch_worker_file_write_errors_total by cause and the log.
// Mirroring is left out: the context has ended, so no fenced write is tried.
func recordOutput(t *testing.T, stdout string) (status string, counted map[string]float64, log string) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	reg := prometheus.NewPedanticRegistry()
	var logs bytes.Buffer
	d := New(Config{DB: pool, Registerer: reg, Log: slog.New(slog.NewJSONHandler(&logs, nil))})
	t.Cleanup(d.Close)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	claim := &sartiq.Claim{OrganizationID: "acme", Job: sartiq.Job{ID: "job-1", OrganizationID: "acme", Attempt: 1}}
	out := d.record(ctx, claim, &lease.Kept{}, time.Now(), strings.NewReader(stdout))
	counted = map[string]float64{}
	for _, cause := range []string{"disk_full", "io", "read_only", "permission", "other"} {
		counted[cause] = testutil.ToFloat64(d.metrics.workerWrites.WithLabelValues(cause))
	}
	if n := testutil.CollectAndCount(d.metrics.workerWrites); n != len(counted) {
		t.Errorf("the counter has %d series, want one per cause (%d): a worker made up a label", n, len(counted))
	}
	return out.Status, counted, logs.String()
}

// The failed writes a worker's outcome reports are counted by cause; what a hostile worker
// reports instead (an unknown cause, a huge, negative, fractional or non-number count,
// several outcomes) is bounded, never a new label, and leaves the outcome as it was read.
func TestRecordCountsTheFailedWritesAnOutcomeReports(t *testing.T) {
	// The outcome as the worker writes it.
	honest, err := json.Marshal(map[string]any{"event": "outcome", "data": worker.Outcome{
		Status: "crashed", Reason: "disk full", FileWriteErrors: map[string]uint64{"disk_full": 2, "io": 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, stdout, status string
		want                 map[string]float64
	}{{
		name:   "honest",
		stdout: `{"event":"start","data":{}}` + "\n" + string(honest),
		status: "crashed", want: map[string]float64{"disk_full": 2, "io": 1},
	}, {
		name:   "none",
		stdout: `{"event":"outcome","data":{"status":"completed"}}`,
		status: "completed", want: map[string]float64{},
	}, {
		name:   "no outcome",
		stdout: `{"event":"start","data":{"file_write_errors":{"disk_full":5}}}`,
		status: "", want: map[string]float64{},
	}, {
		name: "hostile values",
		stdout: `{"event":"outcome","data":{"status":"completed","file_write_errors":{` +
			`"disk_full": 1e30 , "io":-3, "read_only":"7", "permission":2.9, "bogus\n{label}":5, "x":1e400, "y":true, "z":{"a":1}, "nan":-1e400}}}`,
		status: "completed", want: map[string]float64{"disk_full": 1e6, "permission": 2, "other": 1e6},
	}, {
		name:   "unknown causes add up to the bound",
		stdout: `{"event":"outcome","data":{"status":"failed","file_write_errors":{"a":600000,"b":600000,"other":3}}}`,
		status: "failed", want: map[string]float64{"other": 1e6},
	}, {
		name:   "not an object",
		stdout: `{"event":"outcome","data":{"status":"released","file_write_errors":[1,2,3]}}`,
		status: "released", want: map[string]float64{},
	}, {
		name: "several outcomes: the last counts",
		stdout: strings.Repeat(`{"event":"outcome","data":{"status":"crashed","file_write_errors":{"disk_full":1000000}}}`+"\n", 5) +
			`{"event":"outcome","data":{"status":"completed","file_write_errors":{"io":1}}}`,
		status: "completed", want: map[string]float64{"io": 1},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			status, counted, log := recordOutput(t, tc.stdout)
			if status != tc.status {
				t.Errorf("outcome status %q, want %q", status, tc.status)
			}
			// The counter has no org label: the log says whose home, with what was counted.
			logged := strings.Contains(log, `"msg":"the worker's file writes failed`)
			if wantLog := len(tc.want) > 0; logged != wantLog || (wantLog && !strings.Contains(log, `"org":"acme"`)) {
				t.Errorf("logged %v, want %v:\n%s", logged, wantLog, log)
			}
			if strings.Contains(log, "bogus") {
				t.Errorf("a cause the worker made up reached the log:\n%s", log)
			}
			for cause, n := range counted {
				if n != tc.want[cause] {
					t.Errorf("cause %s counted %v, want %v", cause, n, tc.want[cause])
				}
			}
		})
	}
}
