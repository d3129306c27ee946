package dispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"hermeshost/internal/hosttest"
	"hermeshost/pg/pgtest"
	"hermeshost/sartiq"
	"hermeshost/sartiq/backend"
	"hermeshost/sartiq/backend/backendtest"
)

// replica is one `hermes-host dispatcher` process under test.
type replica struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan error
}

// replicaEnv is what every dispatcher process of a test shares.
type replicaEnv struct {
	dbURL, apiURL, gatewayURL, orgsRoot string
	extra                               []string
}

func startReplica(t *testing.T, e replicaEnv, name string) *replica {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "hermes-host"), "dispatcher")
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"DATABASE_URL=" + e.dbURL, "SARTIQ_API_URL=" + e.apiURL, "SARTIQ_BOT_TOKEN=" + backendtest.BotToken,
		"GATEWAY_URL=" + e.gatewayURL, "GATEWAY_KEY=host-key", "GATEWAY_SECRET=gw-secret",
		"CLAIM_ENABLED=true", "POLL_INTERVAL=200ms", "HERMES_INSTANCE=" + name, "ORGS_ROOT=" + e.orgsRoot,
		"HERMES_RUNTIME=process", "HERMES_BIN=scripted-agent", "HEARTBEAT_INTERVAL=300ms",
		"LEASE_TTL=2s", "CONTROL_ADDR=127.0.0.1:0", "JOB_GRACE=10s", "LOG_LEVEL=info",
	}, e.extra...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{name: name, cmd: cmd, log: logPath, done: make(chan error, 1)}
	go func() {
		r.done <- cmd.Wait()
		out.Close()
	}()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			_ = cmd.Process.Kill()
			<-r.done
		}
		if t.Failed() {
			raw, _ := os.ReadFile(logPath)
			lines := strings.Split(string(raw), "\n")
			t.Logf("last lines of %s:\n%s", name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	return r
}

// exited says whether the process has ended (and leaves that for stop and the cleanup).
func (r *replica) exited() bool {
	select {
	case err := <-r.done:
		r.done <- err
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (r *replica) stop(t *testing.T, within time.Duration) {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("%s did not exit cleanly on SIGTERM: %v", r.name, err)
		}
		r.done <- nil
	case <-time.After(within):
		t.Fatalf("%s did not stop within %s of SIGTERM", r.name, within)
	}
}

// url waits for the replica's "listening" log line and returns its control API URL.
func (r *replica) url(t *testing.T) string {
	t.Helper()
	var u string
	waitFor(t, 30*time.Second, r.name+" to listen", func() bool {
		raw, _ := os.ReadFile(r.log)
		for _, line := range strings.Split(string(raw), "\n") {
			var l struct{ Msg, Server, URL string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "listening" && l.Server == "dispatcher" {
				u = l.URL
				return true
			}
		}
		return false
	})
	return u
}

func countJobs(t *testing.T, db *pgxpool.Pool, status string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM agent_jobs WHERE status = $1`, status).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitFor(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// whileProgressing polls count until it reaches target (true), or returns false once it has
// not grown for stall.
func whileProgressing(stall time.Duration, count func() int, target int) bool {
	last, lastAt := count(), time.Now()
	for last < target {
		time.Sleep(200 * time.Millisecond)
		if n := count(); n > last {
			last, lastAt = n, time.Now()
		} else if time.Since(lastAt) > stall {
			return false
		}
	}
	return true
}

// dumpUnfinished logs what a stuck run leaves to read: the backend's jobs not completed
// with their last events, the host's leases and unfinished attempts, and every line of the
// replicas' logs that is not a routine job line.
func dumpUnfinished(t *testing.T, backendDB, db *pgxpool.Pool, replicas ...*replica) {
	t.Helper()
	ctx := context.Background()
	query := func(pool *pgxpool.Pool, title, sql string) {
		rows, err := pool.Query(ctx, sql)
		if err != nil {
			t.Logf("%s: %v", title, err)
			return
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Logf("%s: %v", title, err)
				return
			}
			out = append(out, fmt.Sprint(vals...))
		}
		t.Logf("%s (%d):\n%s", title, len(out), strings.Join(out, "\n"))
	}
	query(backendDB, "backend jobs not completed", `
SELECT j.id::text, ' ', j.organization_id, ' ', j.status, ' attempt ', j.attempt, ' claimed ', coalesce(j.claimed_at::text, '-'),
       ' heartbeat ', coalesce(j.last_heartbeat_at::text, '-'), ' now ', now()::text,
       ' events ', coalesce((SELECT string_agg(e.kind || '@' || e.attempt, ',' ORDER BY e.id) FROM agent_job_events e WHERE e.job_id = j.id), '')
  FROM agent_jobs j WHERE j.status <> 'COMPLETED' ORDER BY j.organization_id, j.created_at`)
	query(db, "leases held", `SELECT key, ' ', coalesce(holder, '-'), ' epoch ', epoch, ' expires ', coalesce(expires_at::text, '-'), ' now ', now()::text
  FROM leases WHERE holder IS NOT NULL ORDER BY key`)
	query(db, "claim_attempts without an outcome", `SELECT job_id::text, ' ', org, ' attempt ', attempt, ' ', instance, ' claimed ', claimed_at::text FROM claim_attempts WHERE outcome IS NULL ORDER BY org`)
	for _, r := range replicas {
		t.Logf("%s has exited: %v", r.name, r.exited())
		raw, _ := os.ReadFile(r.log)
		var keep []string
		for _, line := range strings.Split(string(raw), "\n") {
			if line != "" && !strings.Contains(line, `"msg":"exec ended"`) && !strings.Contains(line, `"msg":"job outcome"`) &&
				!strings.Contains(line, `"msg":"jobs started"`) && !strings.Contains(line, "proxy error: context canceled") {
				keep = append(keep, line)
			}
		}
		t.Logf("%s's other log lines (%d, the last 80):\n%s", r.name, len(keep), strings.Join(keep[max(0, len(keep)-80):], "\n"))
	}
}

// ownersOf maps each holder of an org: lease to its orgs.
func ownersOf(t *testing.T, db *pgxpool.Pool) map[string][]string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT holder, substr(key, 5) FROM leases WHERE key LIKE 'org:%' AND holder IS NOT NULL AND expires_at > now()`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var holder, org string
		if err := rows.Scan(&holder, &org); err != nil {
			t.Fatal(err)
		}
		out[holder] = append(out[holder], org)
	}
	return out
}

// checkOneRunPerOrg replays the backend's job log in commit order: a claim or re-claim opens
// a run of its job, a complete, fail or release closes it, and a re-claim also closes the
// run it took over. No org may ever have two runs open.
func checkOneRunPerOrg(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	rows, err := db.Query(context.Background(), `
SELECT e.job_id::text, j.organization_id, e.kind FROM agent_job_events e JOIN agent_jobs j ON j.id = e.job_id
 WHERE e.kind IN ('claim', 'reclaim', 'complete', 'fail', 'release') ORDER BY e.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	open := map[string]string{} // org -> job with a run open
	for rows.Next() {
		var job, org, kind string
		if err := rows.Scan(&job, &org, &kind); err != nil {
			t.Fatal(err)
		}
		switch kind {
		case "claim", "reclaim":
			if other, busy := open[org]; busy && !(kind == "reclaim" && other == job) {
				t.Errorf("org %s: job %s %sed while job %s was still running", org, job, kind, other)
			}
			open[org] = job
		default:
			if open[org] == job {
				delete(open, org)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// checkMirror asks the host's own record the same: no job completed twice, every job
// completed once except those whose last run belonged to the killed replica (its worker may
// have completed the job at the backend in the moment before the replica could record it),
// and per org the attempts' claim-to-outcome intervals are disjoint (an attempt left without
// an outcome by the killed replica ends where its job's next attempt began).
func checkMirror(t *testing.T, db *pgxpool.Pool, jobs int, killed string) {
	t.Helper()
	ctx := context.Background()
	var completed, twice, lostWithKilled int
	if err := db.QueryRow(ctx, `SELECT count(DISTINCT job_id) FROM claim_attempts WHERE outcome = 'completed'`).Scan(&completed); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM (SELECT job_id FROM claim_attempts WHERE outcome = 'completed' GROUP BY job_id HAVING count(*) > 1) x`).Scan(&twice); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(ctx, `
SELECT count(*) FROM claim_attempts a
 WHERE a.instance = $1 AND a.outcome IS NULL
   AND NOT EXISTS (SELECT 1 FROM claim_attempts n WHERE n.job_id = a.job_id AND n.attempt > a.attempt)`, killed).Scan(&lostWithKilled); err != nil {
		t.Fatal(err)
	}
	if twice != 0 || completed+lostWithKilled != jobs || lostWithKilled > 12 {
		t.Errorf("claim_attempts: %d jobs completed (%d twice), %d last run by the killed replica unrecorded; want %d jobs", completed, twice, lostWithKilled, jobs)
	}
	var overlaps int
	if err := db.QueryRow(ctx, `
WITH runs AS (
    SELECT a.id, a.org, a.claimed_at,
           coalesce(a.finished_at, (SELECT min(n.claimed_at) FROM claim_attempts n WHERE n.job_id = a.job_id AND n.attempt > a.attempt), 'infinity') AS ended
      FROM claim_attempts a
)
SELECT count(*) FROM runs x JOIN runs y ON x.org = y.org AND x.id < y.id AND y.claimed_at < x.ended AND x.claimed_at < y.ended`).Scan(&overlaps); err != nil {
		t.Fatal(err)
	}
	if overlaps != 0 {
		t.Errorf("the mirror shows %d pairs of runs of one org overlapping", overlaps)
	}
	var mirrored int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM mirror_jobs WHERE status = 'COMPLETED'`).Scan(&mirrored); err != nil || mirrored != completed {
		t.Errorf("mirror_jobs: %d COMPLETED (%v), want %d", mirrored, err, completed)
	}
}

func TestTwoReplicasRunEveryJobOnceAndTakeOverFromAKilledOne(t *testing.T) {
	if testing.Short() {
		t.Skip("124 jobs through two dispatcher processes")
	}
	b := backendtest.Start(t, backend.Config{StaleAfter: 3 * time.Second})
	b.Clock.Follow()
	// 20 orgs for 2 x MAX_ORGS=12: the replicas contend for orgs. Under the full race-enabled
	// run on two cores a job can take 10 s and a refresh of 2 s leases can miss:
	//   - LEASE_TTL=5s, as a replica whose instance: lease lapsed stops itself (as it must),
	//     which would leave nobody to take over once the test killed the other;
	//   - MAX_ATTEMPTS=10, as a lapsed home: lease ends a run as a crash, which is counted, and
	//     the default cap of 3 could fail a job the kill also hit;
	//   - progress, not a fixed time, bounds each wait: a minute without a job ending is a
	//     stall, and the failure prints the state it left.
	const orgs, perOrg, stall = 20, 6, time.Minute
	for i := range orgs {
		for j := range perOrg {
			typ := sartiq.TypeProductIngest
			if j%5 == 4 {
				typ = sartiq.TypeGuidelinesExtraction
			}
			b.AddJob(t, fmt.Sprintf("org-%02d", i), typ)
		}
	}
	total := orgs*perOrg + 2*len(backend.DemoOrganizations)
	dbURL, db := pgtest.Schema(t)
	env := replicaEnv{dbURL: dbURL, apiURL: b.URL, gatewayURL: hosttest.DemoGateway(t, "gw-secret", "host-key"),
		orgsRoot: filepath.Join(t.TempDir(), "orgs"), extra: []string{"MAX_ORGS=12", "MAX_ATTEMPTS=10", "LEASE_TTL=5s"}}
	a := startReplica(t, env, "replica-a")
	c := startReplica(t, env, "replica-b")

	// Mid-run, kill the replica that owns more orgs: the other must take them over.
	fail := func(format string, args ...any) {
		t.Helper()
		dumpUnfinished(t, b.DB, db, a, c)
		t.Fatalf(format, args...)
	}
	completed := func() int { return countJobs(t, b.DB, sartiq.StatusCompleted) }
	if !whileProgressing(stall, completed, total/4) {
		fail("no job completed for %s before a quarter of them had (%d of %d)", stall, completed(), total)
	}
	for _, r := range []*replica{a, c} {
		if r.exited() {
			fail("%s stopped on its own before the kill (its log's last lines say why)", r.name)
		}
	}
	owners := ownersOf(t, db)
	victim, survivor := a, c
	if len(owners[holderOf(owners, c.name)]) > len(owners[holderOf(owners, a.name)]) {
		victim, survivor = c, a
	}
	victimOrgs := owners[holderOf(owners, victim.name)]
	if len(victimOrgs) == 0 {
		t.Fatalf("the replica to kill owns no orgs: %v", owners)
	}
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	victim.done <- nil
	killedAt := completed()

	// A job failed at the attempt cap has ended too: waiting on it would only stall.
	ended := func() int { return completed() + countJobs(t, b.DB, sartiq.StatusFailed) }
	if !whileProgressing(stall, ended, total) {
		fail("no job ended for %s before every one had (%d of %d completed, %d ended)", stall, completed(), total, ended())
	}
	if n := completed(); n != total {
		fail("%d of %d jobs completed; the others failed (MAX_ATTEMPTS=10: no job of this run should reach it)", n, total)
	}
	survivor.stop(t, 30*time.Second)

	checkOneRunPerOrg(t, b.DB)
	checkMirror(t, db, total, victim.name)
	var takenOver int
	if err := db.QueryRow(context.Background(), `SELECT count(DISTINCT org) FROM claim_attempts WHERE instance = $1 AND org = ANY($2)
		AND claimed_at > (SELECT max(claimed_at) FROM claim_attempts WHERE instance = $3)`, survivor.name, victimOrgs, victim.name).Scan(&takenOver); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %s owning %d orgs with %d of %d jobs done; %s then ran jobs of %d of them", victim.name, len(victimOrgs), killedAt, total, survivor.name, takenOver)
	if takenOver == 0 {
		t.Errorf("%s ran none of the killed replica's orgs %v after the kill", survivor.name, victimOrgs)
	}
	var left int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM leases WHERE key LIKE 'org:%' AND holder LIKE $1`, "dispatcher/"+survivor.name+"/%").Scan(&left); err != nil || left != 0 {
		t.Errorf("the survivor left %d org leases held after SIGTERM (%v)", left, err)
	}
	var completions int
	if err := b.DB.QueryRow(context.Background(), `SELECT count(*) FROM agent_job_events WHERE kind = 'complete'`).Scan(&completions); err != nil || completions != total {
		t.Errorf("the backend logged %d completions for %d jobs (%v)", completions, total, err)
	}
}

func holderOf(owners map[string][]string, instance string) string {
	for h := range owners {
		if strings.HasPrefix(h, "dispatcher/"+instance+"/") {
			return h
		}
	}
	return ""
}
