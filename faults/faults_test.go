package faults

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite" // state.db, read as the dashboard reads it

	"hermeshost/atomicfile"
	"hermeshost/dispatch/runtime"
	"hermeshost/gateway"
	"hermeshost/internal/hosttest"
	"hermeshost/orghome"
	"hermeshost/sartiq"
	"hermeshost/sartiq/backend"
	"hermeshost/scriptedagent"
)

// The fault suite: backend, gateway (its OAuth login refreshed from a provider stand-in),
// two dispatchers on the Docker runtime, the launcher and dashboards, the scripted agent,
// on a Postgres cluster and a dockerd of the suite's own. Jobs flow while faults drawn from
// a seeded schedule are applied; then the faults stop, every job is let end, every process
// is stopped cleanly, and the invariants (invariants.go) are checked from durable state.

const (
	staleAfter  = 3 * time.Second
	leaseTTL    = 2 * time.Second
	maxAttempts = 3
	operator    = "fault-op"
	password    = "fault-suite-password-1"
	botToken    = "fault-suite-bot-token-0123456789"
	gwSecret    = "fault-suite-gateway-secret"
	hostKey     = "fault-suite-host-key"
	dashSecret  = "fault-suite-dashboard-secret-0123456789"
	ctlSecret   = "fault-suite-control-secret-0123456789"
	identity    = "fault-suite-login"
	subagentOrg = "acme"   // its jobs delegate a child that waits for an operator's message
	chatOrg     = "globex" // the org whose dashboard chats (and is killed mid-chat)
	fullOrg     = "acme"   // the org whose home is a tmpfs the suite fills
)

var orgs = []string{"acme", "globex", "initech", "umbrella"}

// settings is how long the faults go on and how far apart they come: bounded in make test,
// longer with HERMES_FAULTS_SOAK=1 (or HERMES_FAULTS_DURATION).
func settings(t *testing.T) (duration time.Duration) {
	duration = 60 * time.Second
	if os.Getenv("HERMES_FAULTS_SOAK") == "1" {
		duration = 15 * time.Minute
	}
	if v := os.Getenv("HERMES_FAULTS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("HERMES_FAULTS_DURATION=%q is not a positive duration", v)
		}
		duration = d
	}
	return duration
}

func seedOf(t *testing.T) uint64 {
	if v := os.Getenv("HERMES_FAULT_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("HERMES_FAULT_SEED=%q is not an unsigned integer", v)
		}
		return s
	}
	return uint64(time.Now().UnixNano())
}

// recT is the suite's *testing.T, keeping each failure's message: a failed run ends by
// saying them again, after the processes' last lines, where a log cut to its end (CI's)
// still shows them.
type recT struct {
	*testing.T
	mu       sync.Mutex
	failures []string
}

func (r *recT) keep(msg string) {
	if len(msg) > 1500 {
		msg = msg[:1500] + " [...]"
	}
	r.mu.Lock()
	r.failures = append(r.failures, msg)
	r.mu.Unlock()
}

func (r *recT) Errorf(format string, args ...any) {
	r.Helper()
	r.keep(fmt.Sprintf(format, args...))
	r.T.Errorf(format, args...)
}

func (r *recT) Error(args ...any) {
	r.Helper()
	r.keep(fmt.Sprint(args...))
	r.T.Error(args...)
}

func (r *recT) Fatalf(format string, args ...any) {
	r.Helper()
	r.keep(fmt.Sprintf(format, args...))
	r.T.Fatalf(format, args...)
}

func (r *recT) Fatal(args ...any) {
	r.Helper()
	r.keep(fmt.Sprint(args...))
	r.T.Fatal(args...)
}

// sayFailures logs, once the test has failed, every failure it kept, in order, after what
// (how to replay the run).
func (r *recT) sayFailures(what string) {
	if !r.Failed() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Logf("%s failed (%s); its %d failures, again:\n- %s", r.Name(), what, len(r.failures), strings.Join(r.failures, "\n- "))
}

type suite struct {
	t         *recT
	seed      uint64
	root      string // everything of the run is below it
	bins      string
	orgsRoot  string
	credsDir  string
	pg        *pgCluster
	dk        *dockerd
	db        *pgxpool.Pool // the cluster's hermes database; tables schema-qualified
	provider  *provider
	upstream  string
	procs     map[string]*proc
	backend   string
	gateway   string
	launcher  string
	dispatchN []string
	started   time.Time

	mu         sync.Mutex
	applied    []Applied
	actions    []OperatorAction
	sent       []SentMessage
	files      []File
	notes      []string // what the faults saw, for the log
	killedDash map[string]bool
	workRand   *rand.Rand
}

func (s *suite) logf(format string, args ...any) {
	s.t.Logf("%s "+format, append([]any{time.Since(s.started).Round(time.Millisecond)}, args...)...)
}

func (s *suite) apply(kind Kind, target, note string) {
	s.mu.Lock()
	s.applied = append(s.applied, Applied{At: time.Now(), Kind: kind, Target: target, Note: note})
	s.mu.Unlock()
	s.logf("fault: %s of %s %s", kind, target, note)
}

func (s *suite) act(a OperatorAction) {
	a.At = time.Now()
	s.mu.Lock()
	s.actions = append(s.actions, a)
	s.mu.Unlock()
}

func TestFaults(t *testing.T) {
	if os.Getenv("HERMES_FAULTS") != "1" {
		t.Skip("the fault suite runs only with HERMES_FAULTS=1 (make test-faults): it owns a Postgres cluster and a dockerd and stops them mid-run")
	}
	seed := seedOf(t)
	replay := fmt.Sprintf("seed %d; replay with HERMES_FAULT_SEED=%d make test-faults", seed, seed)
	t.Logf("fault %s", replay)
	if os.Geteuid() != 0 {
		t.Fatal("the fault suite needs root: it mounts tmpfs, runs initdb as the postgres user and runs a dockerd")
	}
	duration := settings(t)
	plan := Plan(seed, duration, 2500*time.Millisecond, 5*time.Second, AllKinds)
	for _, p := range plan {
		t.Logf("planned: %s", p)
	}

	s := &suite{t: &recT{T: t}, seed: seed, procs: map[string]*proc{}, killedDash: map[string]bool{},
		workRand: rand.New(rand.NewPCG(seed, 1))}
	// Registered before setUp's, so it runs after them: the failures come last.
	t.Cleanup(func() { s.t.sayFailures(replay) })
	s.setUp(2)

	s.started = time.Now()
	s.logf("the system is up; faults for %s", duration)
	ctx, stopWork := context.WithCancel(context.Background())
	var work sync.WaitGroup
	work.Add(2)
	go func() { defer work.Done(); s.feed(ctx) }()
	go func() { defer work.Done(); s.operate(ctx) }()
	s.chatOnce()
	// A loaded machine makes everything slow: the faults and the drain stop in time for the
	// checks and the cleanup to run before go test's -timeout (which runs no cleanup).
	left := func() time.Duration {
		if end, ok := t.Deadline(); ok {
			return time.Until(end)
		}
		return time.Hour
	}
	for i, p := range plan {
		if left() < 8*time.Minute {
			s.logf("%d planned faults left out: %s is left before the test's deadline", len(plan)-i, left().Round(time.Second))
			break
		}
		if wait := time.Until(s.started.Add(p.At)); wait > 0 {
			time.Sleep(wait)
		}
		s.inject(p)
	}
	stopWork()
	work.Wait()
	// Every org gets work after the last fault: it must get done.
	lastFault := time.Now()
	for _, org := range orgs {
		if err := s.addJob(org); err != nil {
			s.t.Errorf("queue a job for %s after the faults: %v", org, err)
		}
	}
	s.logf("faults done; letting every job end")
	s.drain(min(10*time.Minute, left()-5*time.Minute), 90*time.Second)
	s.reopenDashboards()
	s.stopAll()
	st := s.collect()
	st.Orgs, st.LastFault = orgs, lastFault
	vs := CheckAll(st)
	Attribute(vs, s.applied)
	s.logf("%d jobs, %d job events, %d attempts, %d lease events, %d messages sent, %d operator actions, %d faults applied",
		len(st.Jobs), len(st.JobEvents), len(st.Attempts), len(st.LeaseEvents), len(st.Sent), len(st.Actions), len(s.applied))
	for _, n := range s.notes {
		t.Log(n)
	}
	if len(vs) > 0 || t.Failed() {
		s.saveArtifacts(st, vs)
	}
	if len(vs) > 0 {
		s.t.Errorf("%d invariant violations (%s):\n%s", len(vs), replay, Report(vs))
	}
}

// setUp builds and starts everything, with n dispatchers; each part is stopped and removed
// when the test ends.
func (s *suite) setUp(n int) {
	t := s.t
	root, err := os.MkdirTemp("", "hermes-faults-")
	if err != nil {
		t.Fatal(err)
	}
	// The postgres user must reach the cluster's folder.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unmountUnder(t, root)
		if err := os.RemoveAll(root); err != nil {
			t.Errorf("remove %s: %v", root, err)
		}
	})
	s.root = root
	s.bins = filepath.Join(root, "bin")
	if err := hosttest.BuildBinaries(s.bins); err != nil {
		t.Fatal(err)
	}
	s.pg = startPostgres(t, root)
	s.dk = startDockerd(t, root)
	build := exec.Command(filepath.Join(s.bins, "hermes-host"), "images", "build", filepath.Join(s.bins, "hermes-host"), filepath.Join(s.bins, "scripted-agent"))
	build.Env = []string{"PATH=" + os.Getenv("PATH"), "DOCKER_HOST=" + s.dk.host(),
		"HERMES_WORKER_IMAGE=hermes-host-worker:faults", "HERMES_DASHBOARD_IMAGE=hermes-host-dashboard:faults"}
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("images build: %v\n%s", err, out)
	}

	// Homes: acme's is a tmpfs the suite fills; each has SOUL.md with a free section of
	// its own (the host adds its block and must keep the rest) and the agent's knobs.
	s.orgsRoot = filepath.Join(root, "orgs")
	tmpfs(t, filepath.Join(s.orgsRoot, fullOrg), 64<<20)
	for _, org := range orgs {
		home := filepath.Join(s.orgsRoot, org)
		if err := os.MkdirAll(home, 0o700); err != nil {
			t.Fatal(err)
		}
		free := []byte("Notes of " + org + " kept by its people: the host must keep these bytes.\n")
		s.writeHomeFile(home, "SOUL.md", free)
		s.files = append(s.files, File{Path: filepath.Join(home, "SOUL.md"), Want: free, Check: soulCheck(org, home, free)})
		s.writeKnobs(org, false)
	}

	// The gateway's login: a provider stand-in rotating the refresh token at each grant,
	// the file on a tmpfs the suite fills.
	s.provider = newProvider()
	prov := httptest.NewServer(s.provider)
	t.Cleanup(prov.Close)
	demo := httptest.NewServer(gateway.Demo())
	t.Cleanup(demo.Close)
	s.upstream = demo.URL + "/v1"
	s.credsDir = filepath.Join(root, "gateway")
	tmpfs(t, s.credsDir, 1<<20)
	auth := filepath.Join(s.credsDir, "auth.json")
	if err := gateway.SaveLogin(auth, gateway.Credentials{Version: 1, Identity: identity, RefreshToken: s.provider.issue(),
		UpdatedAt: time.Now().UTC()}, false); err != nil {
		t.Fatal(err)
	}
	s.files = append(s.files, File{Path: auth, Check: s.provider.checkCredentials})

	dbURL := s.pg.url()
	s.db, err = pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.db.Close)
	base := []string{"PATH=" + s.bins + ":" + os.Getenv("PATH"), "LOG_LEVEL=info", "SHUTDOWN_GRACE=5s"}
	hh := filepath.Join(s.bins, "hermes-host")
	logs := filepath.Join(root, "logs")
	if err := os.Mkdir(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	newProc := func(name, health string, env []string, argv ...string) *proc {
		p := &proc{name: name, argv: append([]string{hh}, argv...), env: append(slices.Clone(base), env...), health: health,
			logPath: filepath.Join(logs, name+".log")}
		s.procs[name] = p
		return p
	}
	bport, gport, lport := hosttest.FreePort(t), hosttest.FreePort(t), hosttest.FreePort(t)
	s.backend = fmt.Sprintf("http://127.0.0.1:%d", bport)
	s.gateway = fmt.Sprintf("http://127.0.0.1:%d", gport)
	s.launcher = fmt.Sprintf("http://127.0.0.1:%d", lport)
	b := newProc("backend", s.backend+"/healthz", []string{"DATABASE_URL=" + dbURL, "SARTIQ_BOT_TOKEN=" + botToken, "STALE_AFTER=" + staleAfter.String()},
		"backend", "--addr", fmt.Sprintf("127.0.0.1:%d", bport), "--seed-demo")
	g := newProc("gateway", s.gateway+"/healthz", []string{"GATEWAY_SECRET=" + gwSecret, "GATEWAY_KEY=" + hostKey,
		"GATEWAY_OAUTH_TOKEN_URL=" + prov.URL + "/token", "GATEWAY_OAUTH_CLIENT_ID=fault-suite", "GATEWAY_ORG_RPS=200", "GATEWAY_ORG_CONCURRENCY=16"},
		"gateway", "--addr", fmt.Sprintf("127.0.0.1:%d", gport), "--upstream", s.upstream, "--auth-file", auth)
	l := newProc("launcher", s.launcher+"/healthz", []string{"DATABASE_URL=" + dbURL, "DASHBOARD_SECRET=" + dashSecret, "SESSION_COOKIE_SECURE=false"},
		"launcher", "--addr", fmt.Sprintf("127.0.0.1:%d", lport))
	for _, p := range []*proc{b, g} {
		p.supervise(t)
		if err := p.ready(60 * time.Second); err != nil {
			t.Fatalf("%v\n%s", err, p.tail(30))
		}
	}
	// The backend made its schema and the demo jobs; the other orgs get theirs.
	s.seedJobs(2)
	for i, name := range []string{"dispatcher-a", "dispatcher-b"}[:n] {
		cport := hosttest.FreePort(t)
		d := newProc(name, fmt.Sprintf("http://127.0.0.1:%d/healthz", cport), []string{
			"DATABASE_URL=" + dbURL, "SARTIQ_API_URL=" + s.backend, "SARTIQ_BOT_TOKEN=" + botToken,
			"GATEWAY_URL=" + s.gateway, "GATEWAY_KEY=" + hostKey, "GATEWAY_SECRET=" + gwSecret,
			"CLAIM_ENABLED=true", "POLL_INTERVAL=300ms", "HEARTBEAT_INTERVAL=500ms", "LEASE_TTL=" + leaseTTL.String(),
			"MAX_ATTEMPTS=" + strconv.Itoa(maxAttempts), "JOB_GRACE=5s", "WORKER_IDLE_TIMEOUT=20s",
			"HERMES_INSTANCE=" + name, "HERMES_RUNTIME=docker", "DOCKER_HOST=" + s.dk.host(),
			"HERMES_WORKER_IMAGE=hermes-host-worker:faults", "HERMES_DASHBOARD_IMAGE=hermes-host-dashboard:faults",
			"HERMES_BIN=scripted-agent", "ORGS_ROOT=" + s.orgsRoot, "RUN_ROOT=" + filepath.Join(root, "run-"+strconv.Itoa(i)),
			"CONTROL_ADDR=" + fmt.Sprintf("127.0.0.1:%d", cport), "CONTROL_SECRET=" + ctlSecret,
			"DASHBOARD_SECRET=" + dashSecret, "UNIT_MEMORY_LIMIT=512MiB",
		}, "dispatcher")
		s.dispatchN = append(s.dispatchN, name)
		d.supervise(t)
		if err := d.ready(60 * time.Second); err != nil {
			t.Fatalf("%v\n%s", err, d.tail(30))
		}
	}
	l.supervise(t)
	if err := l.ready(60 * time.Second); err != nil {
		t.Fatalf("%v\n%s", err, l.tail(30))
	}
	t.Cleanup(func() {
		// A failed test stops what still runs; the logs say what happened.
		for _, p := range s.procs {
			if err := p.stop(30 * time.Second); err != nil {
				t.Log(err)
			}
			if t.Failed() {
				t.Logf("last lines of %s:\n%s", p.name, p.tail(25))
			}
		}
	})

	// The operator, as one is made: the CLI, a password from stdin, grants.
	s.cli(strings.NewReader(password+"\n"), "operator", "add", "--password-stdin", operator)
	s.act(OperatorAction{Kind: "add", Operator: operator})
	s.cli(nil, append([]string{"operator", "grant", operator}, orgs...)...)
	for _, org := range orgs {
		s.act(OperatorAction{Kind: "grant", Operator: operator, Org: org})
	}
}

// cli runs hermes-host with args, as an operator on this host would.
func (s *suite) cli(stdin io.Reader, args ...string) string {
	cmd := exec.Command(filepath.Join(s.bins, "hermes-host"), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + s.pg.url(), "USER=root"}
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Errorf("hermes-host %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// writeHomeFile writes a file into an org's home as its units' user owns it.
func (s *suite) writeHomeFile(home, name string, data []byte) {
	path := filepath.Join(home, name)
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		s.t.Errorf("write %s: %v", path, err)
		return
	}
	// The home's owner: the org's own uid (UNIT_UIDS), given to it at its units' start.
	if st, err := os.Stat(home); err == nil {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			_ = os.Chown(path+".tmp", int(sys.Uid), int(sys.Gid))
		}
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		s.t.Errorf("write %s: %v", path, err)
	}
}

// writeKnobs sets an org's agent: a pace slow enough for faults to land mid-job, acme's
// child waiting for an operator's message, globex's chat slow enough to be killed in, and
// with stall, a stall before the first write.
func (s *suite) writeKnobs(org string, stall bool) {
	k := scriptedagent.Knobs{StepMS: 150}
	if org == subagentOrg {
		k.Subagent = &scriptedagent.SubagentKnob{Goal: "collect what the operator says", WaitMS: 5000}
	}
	if org == chatOrg {
		k.ChatStepMS = 1500
	}
	if stall {
		k.StallAtWrite = 1
	}
	raw, _ := json.Marshal(k)
	s.writeHomeFile(filepath.Join(s.orgsRoot, org), scriptedagent.KnobsFile, raw)
}

func soulCheck(org, home string, free []byte) func([]byte) error {
	return func([]byte) error {
		h, err := orghome.OpenHome(org, home)
		if err != nil {
			return err
		}
		defer h.Close()
		soul, err := h.ReadSoul()
		switch {
		case err != nil:
			return err
		case soul.Problem != "":
			return fmt.Errorf("SOUL.md: %s", soul.Problem)
		case soul.Free != string(free):
			return fmt.Errorf("SOUL.md's free section is %q, want %q", soul.Free, free)
		}
		return nil
	}
}

// seedJobs queues n small jobs for each org besides the demo ones.
func (s *suite) seedJobs(n int) {
	for _, org := range orgs {
		for range n {
			if err := s.addJob(org); err != nil {
				s.t.Fatal(err)
			}
		}
	}
}

func (s *suite) addJob(org string) error {
	_, err := s.queueJob(org)
	return err
}

// queueJob queues a small job for org and returns its id.
func (s *suite) queueJob(org string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, s.pg.url()+"&search_path=sartiq_backend")
	if err != nil {
		return "", err
	}
	defer pool.Close()
	if err := backend.EnsureOrganization(ctx, pool, org, "Org "+org, time.Now()); err != nil {
		return "", err
	}
	s.mu.Lock()
	guidelines := s.workRand.IntN(3) == 0
	s.mu.Unlock()
	j := backend.NewJob{Type: sartiq.TypeProductIngest, OrganizationID: org, Instructions: "Propose one product for each row of catalog.csv.",
		Sources: []sartiq.ManifestSource{{Name: "catalog.csv", MediaType: "text/csv", Content: "sku,name,price\n" + org + "-1,Trail Shoe,89.00\n" + org + "-2,Rain Shell,129.00\n"}}}
	if guidelines {
		j = backend.NewJob{Type: sartiq.TypeGuidelinesExtraction, OrganizationID: org, Instructions: "Extract the brand guidelines of every category from brand-book.md.",
			Categories: backend.DemoCategories[:2],
			Sources:    []sartiq.ManifestSource{{Name: "brand-book.md", MediaType: "text/markdown", Content: "# Brand book\n\n## Tone of voice\nPlain and warm.\n\n## Logo usage\nNever recolour.\n"}}}
	}
	return backend.CreateJob(ctx, pool, j, time.Now())
}

// feed queues a job every two seconds for an org drawn from the seed, while the faults go on.
func (s *suite) feed(ctx context.Context) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.mu.Lock()
		org := orgs[s.workRand.IntN(len(orgs))]
		s.mu.Unlock()
		if err := s.addJob(org); err != nil {
			s.logf("queue a job for %s: %v (the database may be restarting)", org, err)
		}
	}
}

// operate is the operator at work: every running child of acme's jobs gets a message
// (one in five is cancelled instead), through the CLI.
func (s *suite) operate(ctx context.Context) {
	done := map[string]bool{}
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		rows, err := s.db.Query(ctx, `SELECT id FROM hermes_host.subagents WHERE org = $1 AND status = 'running'`, subagentOrg)
		if err != nil {
			continue
		}
		var ids []string
		for rows.Next() {
			var id string
			if rows.Scan(&id) == nil && !done[id] {
				ids = append(ids, id)
			}
		}
		rows.Close()
		for _, id := range ids {
			done[id] = true
			n++
			if n%5 == 0 {
				out, err := s.cliTry(nil, "subagent", "cancel", "--org", subagentOrg, "--as", operator, "--reason", "the fault suite", id)
				if err == nil {
					s.act(OperatorAction{Kind: "cancel", Operator: operator, Org: subagentOrg, Target: id})
				} else {
					s.logf("cancel %s: %v %s", id, err, out)
				}
				continue
			}
			body := fmt.Sprintf("note-%d from the fault suite", n)
			out, err := s.cliTry(nil, "subagent", "send", "--org", subagentOrg, "--as", operator, id, body)
			m := regexp.MustCompile(`queued message (\d+)`).FindStringSubmatch(out)
			if err != nil || m == nil {
				s.logf("send to %s refused: %v %s", id, err, strings.TrimSpace(out))
				continue
			}
			msgID, _ := strconv.ParseInt(m[1], 10, 64)
			s.act(OperatorAction{Kind: "send", Operator: operator, Org: subagentOrg, Target: id})
			s.mu.Lock()
			s.sent = append(s.sent, SentMessage{ID: msgID, Org: subagentOrg, Subagent: id, Sender: "operator:" + operator, Body: body, At: time.Now()})
			s.mu.Unlock()
		}
	}
}

func (s *suite) cliTry(stdin io.Reader, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(s.bins, "hermes-host"), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + s.pg.url(), "USER=root"}
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// browser is the operator logged in to the launcher.
type browser struct {
	s  *suite
	hc *http.Client
}

func (s *suite) login() (*browser, error) {
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.PostForm(s.launcher+"/login", url.Values{"name": {operator}, "password": {password}})
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		return nil, fmt.Errorf("login: %s", resp.Status)
	}
	s.act(OperatorAction{Kind: "login", Operator: operator})
	return &browser{s: s, hc: hc}, nil
}

func (b *browser) get(path string) (int, string, error) {
	resp, err := b.hc.Get(b.s.launcher + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// open asks for org's dashboard until it answers.
func (b *browser) open(org string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		code, body, err := b.get("/orgs/" + org + "/")
		if err == nil && code == http.StatusOK {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the dashboard of %s did not answer within %s: %d %v %.300s", org, within, code, err, body)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// chat posts a message to org's chat and returns the turn's page.
func (b *browser) chat(org, message string) (string, error) {
	req, _ := http.NewRequest(http.MethodPost, b.s.launcher+"/orgs/"+org+"/chat", strings.NewReader(url.Values{"message": {message}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", b.s.launcher)
	resp, err := b.hc.Do(req)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		return "", fmt.Errorf("chat: %s", resp.Status)
	}
	return resp.Header.Get("Location"), nil
}

var answerRe = regexp.MustCompile(`(?s)data-testid="chat-answer"[^>]*>([^<]*)<`)

// chatOnce is an operator's chat turn before the faults: it must be answered.
func (s *suite) chatOnce() {
	b, err := s.login()
	if err == nil {
		err = b.open(chatOrg, 90*time.Second)
	}
	var turn string
	if err == nil {
		turn, err = b.chat(chatOrg, "What ships on Tuesdays?")
	}
	if err != nil {
		s.t.Errorf("the operator's chat turn: %v", err)
		return
	}
	// Three steps of 1.5 s each; a loaded machine takes far longer.
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		_, page, err := b.get(turn)
		if m := answerRe.FindStringSubmatch(page); err == nil && m != nil && strings.TrimSpace(m[1]) != "" {
			if !strings.Contains(m[1], "demo reply") {
				s.t.Errorf("the chat turn's answer: %q", m[1])
			}
			s.logf("the operator's chat turn was answered")
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	s.t.Errorf("the operator's chat turn %s got no answer within 3 minutes", turn)
}

// inject applies one planned fault.
func (s *suite) inject(p Planned) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pick := func(from []string) string { return from[p.Target%len(from)] }
	switch p.Kind {
	case KillWorker:
		// Among the workers running now: an idle one is reaped, so the orgs' names may
		// name none.
		workers := s.running(ctx, runtime.RoleWorker)
		if len(workers) == 0 {
			s.apply(p.Kind, "no worker", "(none was running)")
			return
		}
		name := pick(workers)
		err := s.dk.engine.ContainerKill(ctx, name, "KILL")
		s.apply(p.Kind, name, errNote(err))
	case KillDispatcher:
		name := pick(s.dispatchN)
		err := s.procs[name].signal(syscall.SIGKILL)
		s.apply(p.Kind, name, errNote(err))
	case KillGateway:
		err := s.procs["gateway"].signal(syscall.SIGKILL)
		s.apply(p.Kind, "gateway", errNote(err))
	case KillDashboard:
		s.killDashboardMidChat(ctx)
	case RestartDB:
		s.apply(p.Kind, "postgres", "")
		s.pg.crash(s.t)
		time.Sleep(time.Second)
		s.pg.start(s.t)
		s.logf("postgres is back")
	case FillHome:
		from := time.Now()
		s.fillFor(p.Kind, filepath.Join(s.orgsRoot, fullOrg), "the home of "+fullOrg, nil)
		s.noteFullHome(ctx, from)
	case FillCreds:
		s.fillFor(p.Kind, s.credsDir, "the gateway's credentials", s.forceRefresh)
	case StallAgent:
		s.stallAgent(ctx, pick(orgs))
	case PauseHolder:
		name := pick(s.dispatchN)
		err := s.procs[name].signal(syscall.SIGSTOP)
		s.apply(p.Kind, name, fmt.Sprintf("SIGSTOP for %s %s", 2*leaseTTL+time.Second, errNote(err)))
		time.Sleep(2*leaseTTL + time.Second)
		_ = s.procs[name].signal(syscall.SIGCONT)
		s.logf("SIGCONT %s", name)
	case RestartDocker:
		s.apply(p.Kind, "dockerd", "")
		if err := s.dk.stop(); err != nil {
			s.t.Error(err)
		}
		time.Sleep(2 * time.Second)
		if err := s.dk.start(); err != nil {
			s.t.Fatalf("dockerd did not start again: %v", err)
		}
		s.logf("dockerd is back")
	case ForceRelease:
		s.forceRelease(ctx, p.Target)
	default:
		s.t.Fatalf("unknown fault %s", p.Kind)
	}
}

func errNote(err error) string {
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return ""
}

// fillFor fills the tmpfs at dir for six seconds, doing what else during it, then frees it.
func (s *suite) fillFor(kind Kind, dir, what string, during func() string) {
	path, n, err := fill(dir)
	s.apply(kind, what, fmt.Sprintf("%d bytes written until the disk was full %s", n, errNote(err)))
	note := ""
	if during != nil {
		time.Sleep(1500 * time.Millisecond)
		note = during()
	}
	time.Sleep(6 * time.Second)
	if err := os.Remove(path); err != nil {
		s.t.Errorf("free %s: %v", dir, err)
	}
	s.logf("freed %s %s", what, note)
}

// noteFullHome says what the attempts of fullOrg that ended while its home was full said.
func (s *suite) noteFullHome(ctx context.Context, from time.Time) {
	var ended, full int
	err := s.db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE reason ILIKE '%disk%full%')
		FROM hermes_host.claim_attempts WHERE org = $1 AND finished_at BETWEEN $2 AND now() AND outcome <> 'completed'`, fullOrg, from).Scan(&ended, &full)
	note := fmt.Sprintf("fill-home: %d attempts of %s ended unfinished while its home was full, %d saying the disk was full (%v)", ended, fullOrg, full, err)
	s.mu.Lock()
	s.notes = append(s.notes, note)
	s.mu.Unlock()
}

// forceRefresh makes the gateway refresh its login while its disk is full (each access
// token lives 31 s and is refreshed 30 s before its end), and reports what its metrics say
// of the write that failed.
func (s *suite) forceRefresh() string {
	key, _ := gateway.OrgKey(gwSecret, chatOrg)
	body := `{"model":"demo-worker","messages":[{"role":"user","content":"hello"}]}`
	req, _ := http.NewRequest(http.MethodPost, s.gateway+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "(a model call failed: " + err.Error() + ")"
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	failures := s.metric(s.gateway+"/metrics", "gateway_auth_persist_failures_total")
	full := s.metric(s.gateway+"/metrics", `hermes_file_write_errors_total{cause="disk_full"}`)
	s.mu.Lock()
	s.notes = append(s.notes, fmt.Sprintf("fill-credentials: a model call answered %s; the gateway counts %s failed writes of its login, %q writes failed on a full disk",
		resp.Status, failures, full))
	s.mu.Unlock()
	if failures == "" || failures == "0" {
		s.t.Errorf("the gateway's login could not be written (disk full) but its metrics count no failure (%q)", failures)
	}
	return "(failed writes of the login: " + failures + ")"
}

// metric is the value of a series (its name with its labels, as the page writes them) from
// a /metrics page, "" when absent.
func (s *suite) metric(u, name string) string {
	resp, err := http.Get(u)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			return f[1]
		}
	}
	return ""
}

// stallAgent makes org's next agent stall before its first write, waits until one does and
// the stall has lasted past STALE_AFTER (its worker heartbeats on), then kills that agent.
func (s *suite) stallAgent(ctx context.Context, org string) {
	name := runtime.UnitName(org, runtime.RoleWorker)
	before := map[string]bool{}
	for _, pid := range s.agentPIDs(ctx, name) {
		before[pid] = true
	}
	s.writeKnobs(org, true)
	s.apply(StallAgent, org, "its next agent stalls before its first write")
	if err := s.addJob(org); err != nil {
		s.logf("queue a job for %s to stall: %v", org, err)
	}
	var stalled string
	deadline := time.Now().Add(30 * time.Second)
	for stalled == "" && time.Now().Before(deadline) {
		for _, pid := range s.agentPIDs(ctx, name) {
			if !before[pid] {
				stalled = pid
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.writeKnobs(org, false)
	if stalled == "" {
		var jobs, holder string
		_ = s.db.QueryRow(ctx, `SELECT coalesce(string_agg(status || ' ' || n, ', '), 'none') FROM (SELECT status, count(*) AS n FROM sartiq_backend.agent_jobs
			WHERE organization_id = $1 GROUP BY status) x`, org).Scan(&jobs)
		_ = s.db.QueryRow(ctx, `SELECT coalesce(max(holder), 'nobody') FROM hermes_host.leases WHERE key = 'home:' || $1`, org).Scan(&holder)
		s.logf("no agent of %s started within 30s to stall (its jobs: %s; its home lease: %s)", org, jobs, holder)
		return
	}
	time.Sleep(staleAfter + 2*time.Second)
	pid, _ := strconv.Atoi(stalled)
	err := syscall.Kill(pid, syscall.SIGKILL)
	s.logf("killed %s's agent (pid %d) after its stall %s", org, pid, errNote(err))
}

// running are the names of the running containers of a role on the suite's engine, sorted.
func (s *suite) running(ctx context.Context, role runtime.Role) []string {
	list, err := s.dk.engine.ContainerList(ctx, container.ListOptions{})
	if err != nil {
		return nil
	}
	var names []string
	for _, c := range list {
		if c.Labels[runtime.LabelRole] == string(role) && len(c.Names) > 0 {
			names = append(names, strings.TrimPrefix(c.Names[0], "/"))
		}
	}
	slices.Sort(names)
	return names
}

// agentPIDs are the host pids of the scripted agents running in a container.
func (s *suite) agentPIDs(ctx context.Context, name string) []string {
	top, err := s.dk.engine.ContainerTop(ctx, name, nil)
	if err != nil {
		return nil
	}
	pidCol, cmdCol := slices.Index(top.Titles, "PID"), slices.Index(top.Titles, "CMD")
	var pids []string
	for _, p := range top.Processes {
		if pidCol >= 0 && cmdCol >= 0 && strings.Contains(p[cmdCol], "scripted-agent") {
			pids = append(pids, p[pidCol])
		}
	}
	return pids
}

// killDashboardMidChat opens chatOrg's dashboard, starts a chat turn, and kills the
// dashboard's container while the (slow) turn runs.
func (s *suite) killDashboardMidChat(ctx context.Context) {
	b, err := s.login()
	if err == nil {
		err = b.open(chatOrg, 30*time.Second)
	}
	turn := ""
	if err == nil {
		turn, err = b.chat(chatOrg, "Tell me about the brand book, slowly.")
	}
	if err != nil {
		s.apply(KillDashboard, chatOrg, "(no chat turn to kill: "+err.Error()+")")
		return
	}
	time.Sleep(1500 * time.Millisecond)
	name := runtime.UnitName(chatOrg, runtime.RoleDashboard)
	err = s.dk.engine.ContainerKill(ctx, name, "KILL")
	s.apply(KillDashboard, name, "in the middle of chat turn "+turn+" "+errNote(err))
	s.mu.Lock()
	s.killedDash[chatOrg] = true
	s.mu.Unlock()
}

// forceRelease is an operator freeing a held home: lease from the org's dashboard (its
// leases page's form), with a reason: its holder's run must stop, and the event must name
// the operator.
func (s *suite) forceRelease(ctx context.Context, draw int) {
	var held []string
	rows, err := s.db.Query(ctx, `SELECT substr(key, 6) FROM hermes_host.leases WHERE key LIKE 'home:%' AND holder IS NOT NULL ORDER BY key`)
	if err == nil {
		for rows.Next() {
			var org string
			if rows.Scan(&org) == nil {
				held = append(held, org)
			}
		}
		rows.Close()
	}
	if len(held) == 0 {
		s.apply(ForceRelease, "no home lease", "(none was held)")
		return
	}
	org := held[draw%len(held)]
	b, err := s.login()
	if err == nil {
		err = b.open(org, 30*time.Second)
	}
	if err != nil {
		s.apply(ForceRelease, "home:"+org, "(its dashboard did not open: "+err.Error()+")")
		return
	}
	form := url.Values{"key": {"home:" + org}, "reason": {"the fault suite frees it"}}
	req, _ := http.NewRequest(http.MethodPost, s.launcher+"/orgs/"+org+"/leases/force-release", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", s.launcher)
	resp, err := b.hc.Do(req)
	if err != nil {
		s.apply(ForceRelease, "home:"+org, errNote(err))
		return
	}
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusSeeOther, http.StatusFound:
		s.apply(ForceRelease, "home:"+org, "by operator "+operator)
		s.act(OperatorAction{Kind: "force_release", Operator: operator, Org: org, Target: "home:" + org})
	default:
		s.apply(ForceRelease, "home:"+org, "(refused: "+resp.Status+"; it was no longer held)")
	}
}

// waitJob waits until a job has ended and returns its status and error.
func (s *suite) waitJob(id string, within time.Duration) (status, reason string) {
	deadline := time.Now().Add(within)
	for {
		err := s.db.QueryRow(context.Background(), `SELECT status, coalesce(error, '') FROM sartiq_backend.agent_jobs WHERE id = $1`, id).Scan(&status, &reason)
		if err == nil && (status == sartiq.StatusCompleted || status == sartiq.StatusFailed) {
			return status, reason
		}
		if time.Now().After(deadline) {
			return status, fmt.Sprintf("still %s after %s (%v)", status, within, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// drain waits until every job has ended, as long as jobs keep ending: it gives up when
// none has ended for stall (the invariants then report the jobs left) or after within in
// all. On a loaded machine jobs take longer; a system that stopped working stops ending them.
func (s *suite) drain(within, stall time.Duration) {
	deadline := time.Now().Add(within)
	lastLive, progressed := -1, time.Now()
	for {
		var live int
		err := s.db.QueryRow(context.Background(), `SELECT count(*) FROM sartiq_backend.agent_jobs WHERE status NOT IN ('COMPLETED', 'FAILED')`).Scan(&live)
		if err == nil && live == 0 {
			s.logf("every job has ended")
			return
		}
		if err == nil && live != lastLive {
			lastLive, progressed = live, time.Now()
		}
		if time.Since(progressed) > stall || time.Now().After(deadline) {
			s.logf("%d jobs still live: none ended for %s (the invariants report them)", live, time.Since(progressed).Round(time.Second))
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// reopenDashboards: a dashboard killed mid-chat is started again when the operator opens it.
func (s *suite) reopenDashboards() {
	s.mu.Lock()
	killed := len(s.killedDash) > 0
	s.mu.Unlock()
	if !killed {
		return
	}
	b, err := s.login()
	if err == nil {
		err = b.open(chatOrg, 60*time.Second)
	}
	if err != nil {
		s.t.Errorf("after it was killed mid-chat, %s's dashboard: %v", chatOrg, err)
	}
}

// stopAll stops every process cleanly: the dispatchers first (no claims, their jobs ended),
// then the launcher, the gateway and the backend.
func (s *suite) stopAll() {
	var wg sync.WaitGroup
	for _, name := range s.dispatchN {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.procs[name].stop(60 * time.Second); err != nil {
				s.t.Errorf("%v\n%s", err, s.procs[name].tail(20))
			}
		}()
	}
	wg.Wait()
	for _, name := range []string{"launcher", "gateway", "backend"} {
		if err := s.procs[name].stop(30 * time.Second); err != nil {
			s.t.Errorf("%v\n%s", err, s.procs[name].tail(20))
		}
	}
	s.logf("every process stopped")
}

// collect reads the durable state the invariants check.
func (s *suite) collect() State {
	t := s.t
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := State{MaxAttempts: maxAttempts, Sent: s.sent, Actions: s.actions}
	query := func(sql string, scan func(r interface{ Scan(...any) error }) error) {
		rows, err := s.db.Query(ctx, sql)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				t.Fatal(err)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	query(`SELECT id::text, organization_id, status, coalesce(error, ''), attempt FROM sartiq_backend.agent_jobs`, func(r interface{ Scan(...any) error }) error {
		var j Job
		err := r.Scan(&j.ID, &j.Org, &j.Status, &j.Error, &j.Attempt)
		st.Jobs = append(st.Jobs, j)
		return err
	})
	query(`SELECT e.id, e.job_id::text, j.organization_id, e.kind, e.message, e.attempt, e.at FROM sartiq_backend.agent_job_events e
		JOIN sartiq_backend.agent_jobs j ON j.id = e.job_id WHERE e.kind <> 'heartbeat' ORDER BY e.id`, func(r interface{ Scan(...any) error }) error {
		var e JobEvent
		err := r.Scan(&e.ID, &e.JobID, &e.Org, &e.Kind, &e.Message, &e.Attempt, &e.At)
		st.JobEvents = append(st.JobEvents, e)
		return err
	})
	query(`SELECT id, job_id, org, instance, kind, coalesce(outcome, ''), coalesce(reason, ''), attempt, claimed_at, coalesce(finished_at, 'epoch')
		FROM hermes_host.claim_attempts ORDER BY id`, func(r interface{ Scan(...any) error }) error {
		var a Attempt
		err := r.Scan(&a.ID, &a.JobID, &a.Org, &a.Instance, &a.Kind, &a.Outcome, &a.Reason, &a.Attempt, &a.ClaimedAt, &a.FinishedAt)
		if a.FinishedAt.Unix() == 0 {
			a.FinishedAt = time.Time{}
		}
		st.Attempts = append(st.Attempts, a)
		return err
	})
	query(`SELECT id, key, kind, holder, coalesce(previous_holder, ''), coalesce(actor, ''), epoch, at FROM hermes_host.lease_events ORDER BY id`,
		func(r interface{ Scan(...any) error }) error {
			var e LeaseEvent
			err := r.Scan(&e.ID, &e.Key, &e.Kind, &e.Holder, &e.Previous, &e.Actor, &e.Epoch, &e.At)
			st.LeaseEvents = append(st.LeaseEvents, e)
			return err
		})
	query(`SELECT org, id, coalesce(job_id, ''), status, summary, coalesce(cancelled_by, ''), coalesce(ended_at, 'epoch') FROM hermes_host.subagents`,
		func(r interface{ Scan(...any) error }) error {
			var sa Subagent
			err := r.Scan(&sa.Org, &sa.ID, &sa.JobID, &sa.Status, &sa.Summary, &sa.CancelledBy, &sa.EndedAt)
			st.Subagents = append(st.Subagents, sa)
			return err
		})
	query(`SELECT id, org, subagent_id, sender, body, deliveries, sent_at, coalesce(acked_at, 'epoch') FROM hermes_host.subagent_messages`,
		func(r interface{ Scan(...any) error }) error {
			var m Message
			err := r.Scan(&m.ID, &m.Org, &m.Subagent, &m.Sender, &m.Body, &m.Deliveries, &m.SentAt, &m.AckedAt)
			if m.AckedAt.Unix() == 0 {
				m.AckedAt = time.Time{}
			}
			st.Messages = append(st.Messages, m)
			return err
		})
	query(`SELECT operator, kind, coalesce(org, ''), actor, at FROM hermes_host.operator_events`, func(r interface{ Scan(...any) error }) error {
		var e OperatorEvent
		err := r.Scan(&e.Operator, &e.Kind, &e.Org, &e.Actor, &e.At)
		st.OpEvents = append(st.OpEvents, e)
		return err
	})
	for _, f := range s.files {
		f.Got, f.Err = os.ReadFile(f.Path)
		st.Files = append(st.Files, f)
	}
	// Containers left on the engine, and whether an exec still runs in one.
	list, err := s.dk.engine.ContainerList(ctx, container.ListOptions{All: true})
	st.ContainersErr = err
	for _, c := range list {
		info, err := s.dk.engine.ContainerInspect(ctx, c.ID)
		execs := 0
		if err == nil {
			execs = len(info.ExecIDs)
		}
		name := strings.TrimPrefix(strings.Join(c.Names, ","), "/")
		st.Containers = append(st.Containers, Container{Name: name, State: c.State, Instance: c.Labels[runtime.LabelInstance], Role: c.Labels[runtime.LabelRole], Execs: execs})
	}
	st.Processes = s.ownProcesses()
	for _, org := range orgs {
		sessions, err := agentSessions(ctx, org, filepath.Join(s.orgsRoot, org, "state.db"))
		if err != nil {
			t.Errorf("read the sessions of %s: %v", org, err)
		}
		st.Sessions = append(st.Sessions, sessions...)
	}
	return st
}

// agentSessions are the top-level sessions of a home's state.db, each from its start to its
// last message (times are Hermes' seconds since the epoch).
func agentSessions(ctx context.Context, org, path string) ([]AgentSession, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT s.id, s.source, s.started_at, coalesce(max(m.timestamp), s.started_at)
		FROM sessions s LEFT JOIN messages m ON m.session_id = s.id WHERE s.parent_session_id IS NULL GROUP BY s.id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []AgentSession
	for rows.Next() {
		var a AgentSession
		var start, end float64
		if err := rows.Scan(&a.ID, &a.Source, &start, &end); err != nil {
			return nil, err
		}
		a.Org, a.Start, a.End = org, time.Unix(0, int64(start*1e9)), time.Unix(0, int64(end*1e9))
		out = append(out, a)
	}
	return out, rows.Err()
}

// ownProcesses are the processes on this machine run from the suite's binaries, or whose
// command line names its folder (containers' processes run the images' copies, and are
// the engine's).
func (s *suite) ownProcesses() []Process {
	var out []Process
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cmd := string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		if strings.HasPrefix(exe, s.bins+"/") || (strings.Contains(cmd, s.root) && !strings.Contains(cmd, "dockerd") &&
			!strings.Contains(cmd, "containerd") && !strings.Contains(cmd, "postgres")) {
			out = append(out, Process{PID: pid, Cmdline: strings.TrimSpace(cmd)})
		}
	}
	return out
}

// provider is the OAuth provider's stand-in: every refresh grant gets a new access token
// living 31 s and a new refresh token; any refresh token it issued is accepted (a login
// whose rotated token could not be written keeps the older one on disk).
type provider struct {
	mu     sync.Mutex
	n      int
	issued map[string]bool
}

func newProvider() *provider { return &provider{issued: map[string]bool{}} }

func (p *provider) issue() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	tok := fmt.Sprintf("rt-%d", p.n)
	p.issued[tok] = true
	return tok
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/token" || r.ParseForm() != nil || r.Form.Get("grant_type") != "refresh_token" {
		http.Error(w, `{"error":"invalid_request"}`, http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	known := p.issued[r.Form.Get("refresh_token")]
	p.mu.Unlock()
	if !known {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":"invalid_grant"}`))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "at-" + p.issue(), "refresh_token": p.issue(), "expires_in": 31, "token_type": "Bearer"})
}

// checkCredentials: auth.json still loads strictly, is a login of the same identity, and
// holds a refresh token the provider issued.
func (p *provider) checkCredentials(got []byte) error {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("fault-auth-%d.json", time.Now().UnixNano()))
	if err := os.WriteFile(path, got, 0o600); err != nil {
		return err
	}
	defer os.Remove(path)
	var c gateway.Credentials
	if err := atomicfile.LoadJSON(path, &c); err != nil {
		return fmt.Errorf("auth.json does not load: %w", err)
	}
	if err := c.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	known := p.issued[c.RefreshToken]
	p.mu.Unlock()
	switch {
	case c.Identity != identity:
		return fmt.Errorf("auth.json is a login of %q, want %q", c.Identity, identity)
	case !known:
		return fmt.Errorf("auth.json holds a refresh token the provider never issued")
	}
	return nil
}

// saveArtifacts keeps what a failed run leaves for its reader in test-artifacts/faults/
// (git-ignored) at the repository's root: every process's log, the faults applied, the
// violations and the durable state they were checked on.
func (s *suite) saveArtifacts(st State, vs []Violation) {
	dir, err := filepath.Abs(filepath.Join("..", "test-artifacts", "faults", fmt.Sprintf("seed-%d", s.seed)))
	if err == nil {
		_ = os.RemoveAll(dir)
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		s.t.Logf("keep the run's artifacts: %v", err)
		return
	}
	for _, p := range s.procs {
		if raw, err := os.ReadFile(p.logPath); err == nil {
			_ = os.WriteFile(filepath.Join(dir, p.name+".log"), raw, 0o644)
		}
	}
	if raw, err := os.ReadFile(filepath.Join(s.dk.dir, "dockerd.log")); err == nil {
		_ = os.WriteFile(filepath.Join(dir, "dockerd.log"), raw, 0o644)
	}
	files := st.Files
	st.Files = nil // their checks are funcs
	dump, _ := json.MarshalIndent(map[string]any{"seed": s.seed, "applied": s.applied, "violations": Report(vs), "state": st, "files": len(files)}, "", " ")
	_ = os.WriteFile(filepath.Join(dir, "state.json"), dump, 0o644)
	s.t.Logf("the run's logs and state are in %s", dir)
}

// A dispatcher restarted (as a deploy restarts it, SIGTERM then a new start under the same
// HERMES_INSTANCE) adopts the worker containers it left, and their jobs run: the worker
// reaches the backend, gateway and control API through the org's sockets, which the new
// process must serve again. The whole system as in TestFaults, one dispatcher, no faults.
func TestARestartedDispatcherRunsTheJobsOfTheWorkersItAdopts(t *testing.T) {
	if os.Getenv("HERMES_FAULTS") != "1" {
		t.Skip("runs with the fault suite only (HERMES_FAULTS=1, make test-faults): it owns a Postgres cluster and a dockerd")
	}
	if os.Geteuid() != 0 {
		t.Fatal("the fault suite needs root: it mounts tmpfs, runs initdb as the postgres user and runs a dockerd")
	}
	if end, ok := t.Deadline(); ok && time.Until(end) < 5*time.Minute {
		t.Fatalf("%s is left before the test's deadline (go test -timeout): too little to run and clean up", time.Until(end).Round(time.Second))
	}
	s := &suite{t: &recT{T: t}, procs: map[string]*proc{}, killedDash: map[string]bool{}, workRand: rand.New(rand.NewPCG(1, 1))}
	t.Cleanup(func() { s.t.sayFailures("no faults drawn: it runs alike each time") })
	s.setUp(1)
	s.started = time.Now()
	ctx := context.Background()
	// A job of umbrella done: its worker is running, idle.
	first, err := s.queueJob("umbrella")
	if err != nil {
		t.Fatal(err)
	}
	s.waitJob(first, 2*time.Minute)
	worker := runtime.UnitName("umbrella", runtime.RoleWorker)
	before, err := s.dk.engine.ContainerInspect(ctx, worker)
	if err != nil || !before.State.Running {
		t.Fatalf("umbrella's worker after its job: %v", err)
	}
	d := s.procs["dispatcher-a"]
	if err := d.signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The suite starts it again, as a service manager would.
	time.Sleep(time.Second)
	if err := d.ready(time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, d.tail(30))
	}
	var jobs []string
	for range 2 {
		id, err := s.queueJob("umbrella")
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, id)
	}
	for _, id := range jobs {
		if status, reason := s.waitJob(id, 3*time.Minute); status != sartiq.StatusCompleted {
			t.Errorf("job %s of umbrella after the restart: %s %s", id, status, reason)
		}
	}
	after, err := s.dk.engine.ContainerInspect(ctx, worker)
	if err != nil || after.ID != before.ID {
		t.Logf("umbrella's worker was not adopted (%v): the test did not test adoption", err)
	} else {
		t.Logf("umbrella's worker %.12s was adopted by the restarted dispatcher", after.ID)
	}
	s.stopAll()
}
