package dispatch_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"hermeshost/gateway"
	"hermeshost/sartiq"
	"hermeshost/sartiq/backend/backendtest"
)

// hostileAgent is a stand-in for the Hermes CLI turned hostile: a shell script given as
// HERMES_BIN, run by the real worker. Orgs other than acme get the scripted agent.
func hostileAgent(t *testing.T, script string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hostile-agent")
	body := "#!/bin/sh\n[ \"${HERMES_HOME##*/}\" = acme ] || exec scripted-agent \"$@\"\n" + script + "\n"
	if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// An agent that kills its own worker, every attempt: each run is a crash, not a release,
// so acme's jobs fail at MAX_ATTEMPTS instead of coming back for ever; globex's complete.
func TestAnAgentThatKillsItsWorkerFailsItsJobsAtMaxAttempts(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled, f.cfg.MaxAttempts = true, 2
	f.cfg.WorkerEnv = append(f.cfg.WorkerEnv, "HERMES_BIN="+hostileAgent(t, killTheWorker))
	cycleWithRestarts(t, f)
	checkKilledWorkersFailAtMaxAttempts(t, f)
}

// An agent that writes 1 GiB to stderr: the dispatcher keeps the end of it only (its heap
// stays far below the flood), counts what it cut, and the job ends with its outcome.
func TestAGigabyteOnStderrIsCutAndCounted(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	f.cfg.WorkerEnv = append(f.cfg.WorkerEnv, "HERMES_BIN="+hostileAgent(t, floodStderr))
	runTheFlood(t, f)
}

// What an agent prints of the keys it was given never reaches the dispatcher's log: the
// stderr tail of a worker that died is logged with the job token and the org's keys
// redacted.
func TestAWorkersStderrTailIsLoggedWithItsSecretsRedacted(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled, f.cfg.MaxAttempts = true, 1
	f.cfg.WorkerEnv = append(f.cfg.WorkerEnv, "HERMES_BIN="+hostileAgent(t, `echo "the key is $HERMES_HOST_GATEWAY_KEY" >&2
sleep 1 # the worker passes the line on before it dies
kill -KILL $PPID
exec sleep 30`))
	d := f.dispatcher(t)
	n, err := d.Cycle(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	d.Wait()
	if n != 2 {
		t.Fatalf("%d jobs started, want one per org", n)
	}
	key, err := gateway.OrgKey("gw-secret", "acme")
	if err != nil {
		t.Fatal(err)
	}
	logs := f.logs.String()
	if !strings.Contains(logs, "the key is [redacted]") {
		t.Fatalf("no redacted stderr tail in the log:\n%s", logs)
	}
	if strings.Contains(logs, key) {
		t.Fatal("the org's gateway key reached the dispatcher's log")
	}
}

// A backend that answers a claim for another organization than the one the dispatcher
// reserved (a bug or a compromise upstream): the claim is released unrun with its own
// token and logged, acme's reservation is freed, and its job runs on the next cycle.
func TestAClaimForAnotherOrgIsReleasedAndTheReservedOrgRunsAgain(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.ClaimEnabled = true
	target, err := url.Parse(f.backend.URL)
	if err != nil {
		t.Fatal(err)
	}
	var rewritten atomic.Int32
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if !strings.HasSuffix(resp.Request.URL.Path, "/claim") || resp.StatusCode != http.StatusOK || rewritten.Load() > 0 {
			return nil
		}
		var c map[string]any
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(body, &c); err != nil || c["organization_id"] != "acme" {
			resp.Body = io.NopCloser(bytes.NewReader(body))
			return nil
		}
		rewritten.Add(1)
		c["organization_id"] = "globex"
		body, _ = json.Marshal(c)
		resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	lying := httptest.NewServer(proxy)
	t.Cleanup(lying.Close)
	bot, err := sartiq.New(lying.URL, backendtest.BotToken)
	if err != nil {
		t.Fatal(err)
	}
	// Workers reach the API through it too: manifests are named under the address a claim
	// came through.
	f.cfg.Bot, f.cfg.APIURL = bot, lying.URL
	d := f.dispatcher(t)
	if _, err := d.Cycle(t.Context()); err != nil {
		t.Fatal(err)
	}
	d.Wait()
	if rewritten.Load() != 1 {
		t.Fatal("no claim of acme's was answered for another org: the test proved nothing")
	}
	if !strings.Contains(f.logs.String(), "claim for the wrong organization") {
		t.Fatalf("the wrong-org claim was not logged:\n%s", f.logs.String())
	}
	var released int
	if err := f.backend.DB.QueryRow(t.Context(), `SELECT count(*) FROM agent_job_events e JOIN agent_jobs j ON j.id = e.job_id
		WHERE j.organization_id = 'acme' AND e.kind = 'release'`).Scan(&released); err != nil || released != 1 {
		t.Fatalf("%d releases of acme's jobs (%v), want the wrong-org claim's", released, err)
	}
	cycleUntilDone(t, f, d, 2*time.Minute)
}
