package web_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/gavv/httpexpect/v2"

	"hermeshost/assertion"
	"hermeshost/chat"
	"hermeshost/control"
	"hermeshost/gateway"
	"hermeshost/internal/hosttest"
	"hermeshost/internal/statetest"
	"hermeshost/internal/testio"
	"hermeshost/lease"
	"hermeshost/orghome"
	"hermeshost/orghome/hermesstate"
	"hermeshost/pg/pgtest"
	"hermeshost/service"
	"hermeshost/subagent"
	"hermeshost/web"
)

var agentBin struct {
	once sync.Once
	path string
	err  error
}

// scriptedAgent is the scripted agent, built once for the package's tests.
func scriptedAgent(t testing.TB) string {
	t.Helper()
	agentBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "web-chat-agent-")
		if err != nil {
			agentBin.err = err
			return
		}
		_, here, _, _ := runtime.Caller(0)
		agentBin.path = filepath.Join(dir, "scripted-agent")
		cmd := exec.Command("go", "build", "-o", agentBin.path, "./cmd/scripted-agent")
		cmd.Dir = filepath.Join(filepath.Dir(here), "..")
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Run(); err != nil {
			agentBin.err = errors.New("build the scripted agent: " + errb.String())
		}
	})
	if agentBin.err != nil {
		t.Fatal(agentBin.err)
	}
	return agentBin.path
}

// chatDash is a dashboard with its chat's Runner on the scripted agent, the real control
// API over a fresh schema and the real gateway.
type chatDash struct {
	*dash
	runner *chat.Runner
	home   *orgHome
}

func newChatDash(t testing.TB, h *orgHome, opts ...func(*chat.Config)) *chatDash {
	t.Helper()
	bin := scriptedAgent(t)
	_, pool := pgtest.Schema(t)
	leases := lease.New(pool, lease.Options{})
	t.Cleanup(leases.Close)
	subs := subagent.New(pool, subagent.Options{})
	t.Cleanup(subs.Close)
	cs, err := control.NewServer(control.Config{DB: pool, Leases: leases, Subagents: subs, Secret: controlSecret})
	if err != nil {
		t.Fatal(err)
	}
	csrv := httptest.NewServer(cs.Handler())
	t.Cleanup(csrv.Close)
	key, err := control.Key(controlSecret, h.org)
	if err != nil {
		t.Fatal(err)
	}
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	client, err := control.NewClient(csrv.URL, key, &http.Client{Transport: transport})
	if err != nil {
		t.Fatal(err)
	}
	gwKey, err := gateway.OrgKey(gatewaySecret, h.org)
	if err != nil {
		t.Fatal(err)
	}
	home, err := orghome.OpenHome(h.org, h.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { home.Close() })
	gw := hosttest.DemoGateway(t, gatewaySecret, "host-key-for-dashboard-tests")
	logs := &testio.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	cfg := chat.Config{
		Org: h.org, Home: home, Control: client, HermesBin: bin, MaxTurns: 5,
		GatewayURL: gw, GatewayKey: service.Secret(gwKey), Model: "demo-worker",
		LeaseTTL: 3 * time.Second, Log: log,
	}
	for _, o := range opts {
		o(&cfg)
	}
	runner, err := chat.NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(runner.Close) // before the control API's server closes: it releases the leases
	assertionKey, err := assertion.OrgKey(dashSecret, h.org)
	if err != nil {
		t.Fatal(err)
	}
	hd, err := web.NewDashboard(service.NewOps(log), web.DashboardConfig{
		Org: h.org, Home: home, AssertionKey: service.Secret(assertionKey), Control: client,
		GatewayURL: gw, GatewayKey: service.Secret(gwKey), HTTPClient: &http.Client{Transport: transport},
		SourceTimeout: 2 * time.Second, Chat: runner,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(hd)
	t.Cleanup(srv.Close)
	signer, err := assertion.NewSigner(dashSecret, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &chatDash{
		dash: &dash{t: t, org: h.org, srv: srv, leases: leases, control: client, logs: logs, signer: signer,
			exec: func(sql string, args ...any) {
				t.Helper()
				if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
					t.Fatal(err)
				}
			}},
		runner: runner, home: h,
	}
}

// send posts a message and returns the turn id its redirect names.
func (d *chatDash) send(e *httpexpect.Expect, session, message string) string {
	d.t.Helper()
	loc := e.POST("/orgs/"+d.org+"/chat").WithFormField("session", session).WithFormField("message", message).
		Expect().Status(http.StatusSeeOther).Header("Location").Raw()
	id, ok := strings.CutPrefix(loc, "/orgs/"+d.org+"/chat/turns/")
	if !ok || id == "" {
		d.t.Fatalf("the send went to %q", loc)
	}
	return id
}

// await waits, bounded, until the turn satisfies cond.
func (d *chatDash) await(id string, what string, cond func(chat.Turn) bool) chat.Turn {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t, ok, err := d.runner.Wait(ctx, id, cond)
	if !ok || err != nil {
		d.t.Fatalf("turn %s: waiting for %s: %v (last %+v)", id, what, err, t)
	}
	return t
}

func ended(t chat.Turn) bool { return !t.Active() }

func (d *chatDash) held(key string) bool {
	d.t.Helper()
	info, err := d.leases.Holder(context.Background(), key)
	if errors.Is(err, lease.ErrUnknownKey) {
		return false
	}
	if err != nil {
		d.t.Fatal(err)
	}
	return info.Held(time.Now())
}

func TestAChatTurnRunsShowsItsRowsAndAnswerAndIsResumed(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	d := newChatDash(t, acme)
	e := d.as("ada")
	p := page(t, e, "/orgs/acme/chat", "/orgs/acme")
	if testid(p, "chat-form").Length() != 1 || testid(p, "nav-chat").AttrOr("aria-current", "") != "page" {
		t.Fatal("no chat form, or the nav does not show Chat as the open page")
	}

	first := d.send(e, "", "What is our return policy?")
	turn := d.await(first, "the end", ended)
	if turn.State != chat.StateDone || turn.SessionID == "" || turn.Answer == "" {
		t.Fatalf("first turn %+v", turn)
	}
	p = page(t, e, "/orgs/acme/chat/turns/"+first, "/orgs/acme")
	if got := testid(p, "chat-state").Text(); got != "done" {
		t.Errorf("state %q", got)
	}
	if got := strings.TrimSpace(testid(p, "chat-answer").Text()); got != turn.Answer {
		t.Errorf("answer %q, want %q", got, turn.Answer)
	}
	if got := testid(p, "chat-session-id").Text(); got != turn.SessionID {
		t.Errorf("session %q", got)
	}
	if got := texts(testid(p, "tool-call-name")); len(got) != 1 || got[0] != "session_search" {
		t.Errorf("tool calls %v", got)
	}
	if testid(p, "tool-result").Length() != 1 || testid(p, "chat-stop").Length() != 0 || testid(p, "chat-live").Length() != 0 {
		t.Error("a done turn shows no tool result, or still a Stop button or its stream")
	}

	// The session is offered for the next message, which resumes it.
	p = page(t, e, "/orgs/acme/chat", "/orgs/acme")
	if testid(p, "chat-session").Find(`option[value="`+turn.SessionID+`"]`).Length() != 1 {
		t.Fatalf("session %s is not offered", turn.SessionID)
	}
	second := d.send(e, turn.SessionID, "And for sale items?")
	again := d.await(second, "the end", ended)
	if again.State != chat.StateDone || again.SessionID != turn.SessionID || !again.Resume {
		t.Fatalf("second turn %+v", again)
	}
	p = page(t, e, "/orgs/acme/chat/turns/"+second, "/orgs/acme")
	var users []string
	p.Find(`[data-testid="message"][data-role="user"] [data-testid="message-content"]`).Each(func(_ int, s *goquery.Selection) {
		users = append(users, strings.TrimSpace(s.Text()))
	})
	if len(users) != 2 || users[0] != "What is our return policy?" || users[1] != "And for sale items?" {
		t.Errorf("user messages of the resumed session %q", users)
	}
	// A session the home does not have: the agent's own reason is the turn's.
	lost := d.await(d.send(e, "20990101_000000_abcdef", "Hello?"), "the end", ended)
	if lost.State != chat.StateFailed || !strings.Contains(lost.Reason, "no such session") {
		t.Errorf("a turn to an unknown session %+v", lost)
	}
	for _, key := range []string{"home:acme", "session:acme." + turn.SessionID, "session:acme.new-" + first} {
		if d.held(key) {
			t.Errorf("%s is still held after the turns", key)
		}
	}
}

// A chat on a state.db a killed Hermes left mid-write: the page says why no recent
// session is offered, a new session's turn runs, and its agent's read-write open rolls the
// cut-off write back, so the sessions read again, the one before it among them.
func TestAChatStartsOnAStateDBHermesLeftMidWriteAndRecoversIt(t *testing.T) {
	acme, _ := twoHomes(t, hermesstate.V22)
	acme.session(hermesstate.Session{ID: "20261203_090000_acme01", StartedAt: 1_764_752_400})
	if err := acme.db.Close(); err != nil {
		t.Fatal(err)
	}
	statetest.InterruptWrite(t, filepath.Join(acme.dir, "state.db"))
	d := newChatDash(t, acme)
	e := d.as("ada")
	p := page(t, e, "/orgs/acme/chat", "/orgs/acme")
	if got := testid(p, "chat-sessions-error").Text(); !strings.Contains(got, "did not finish") || !strings.Contains(got, "start a new session") {
		t.Errorf("the chat page's sessions note over a hot journal: %q", got)
	}
	turn := d.await(d.send(e, "", "What is our return policy?"), "the end", ended)
	if turn.State != chat.StateDone || turn.SessionID == "" {
		t.Fatalf("the turn on an interrupted state.db: %+v", turn)
	}
	p = page(t, e, "/orgs/acme/chat", "/orgs/acme")
	if got := testid(p, "chat-sessions-error").Text(); got != "" {
		t.Errorf("the chat page after the turn still says %q", got)
	}
	for _, id := range []string{"20261203_090000_acme01", turn.SessionID} {
		if testid(p, "chat-session").Find(`option[value="`+id+`"]`).Length() != 1 {
			t.Errorf("session %s is not offered after the agent recovered state.db", id)
		}
	}
}

// agentsOn are the pids of processes running with HERMES_HOME=dir: the agents of that home.
func agentsOn(t *testing.T, dir string) []string {
	t.Helper()
	return agentsOnDir(dir)
}

// agentsOnDir lists the processes whose HERMES_HOME is dir.
func agentsOnDir(dir string) []string {
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	var pids []string
	for _, p := range procs {
		env, err := os.ReadFile(p)
		if err != nil {
			continue // gone, or not ours
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if string(kv) == "HERMES_HOME="+dir {
				pids = append(pids, filepath.Base(filepath.Dir(p)))
			}
		}
	}
	return pids
}

// While a job holds home:acme a turn waits, saying who holds it and its place; a second
// message to the same session is refused with the reason; once the job lets go both run,
// in order, the first resuming its session.
func TestATurnWaitsForAJobsHomeAndASecondQueuedOneIsRefused(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	d := newChatDash(t, acme)
	e := d.as("ada")
	first := d.await(d.send(e, "", "Start a session"), "the end", ended)
	if first.State != chat.StateDone {
		t.Fatalf("first turn %+v", first)
	}
	ctx := context.Background()
	job, err := d.leases.TryAcquire(ctx, "home:acme", "worker-acme-job-7", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	d.exec(`INSERT INTO mirror_jobs (job_id, org, type, status, attempt) VALUES ('job-7', 'acme', 'guidelines_extraction', 'RUNNING', 1)`)
	d.exec(`INSERT INTO mirror_job_events (job_id, attempt, kind, data) VALUES ('job-7', 1, 'progress', '{"persisted": ["tone", "claims"]}'::jsonb)`)

	waiting := d.send(e, first.SessionID, "Continue while the job runs")
	turn := d.await(waiting, "the job's holder", func(t chat.Turn) bool { return t.HeldBy != "" })
	if turn.State != chat.StateQueued || turn.Waiting != "home:acme" || turn.HeldBy != "worker-acme-job-7" || turn.Position != 1 {
		t.Fatalf("waiting turn %+v", turn)
	}
	p := page(t, e, "/orgs/acme/chat/turns/"+waiting, "/orgs/acme")
	if got := testid(p, "chat-state").Text(); got != "queued" {
		t.Errorf("state %q", got)
	}
	if got := testid(p, "chat-held-by").Text(); got != "worker-acme-job-7" {
		t.Errorf("held by %q", got)
	}
	if got := testid(p, "chat-position").Text(); got != "1" {
		t.Errorf("position %q", got)
	}
	if got := testid(p, "chat-job-progress").Text(); got != "2 persisted: tone, claims" || testid(p, "chat-job-status").Text() != "RUNNING" {
		t.Errorf("the job in the way: %q %q", testid(p, "chat-job-status").Text(), got)
	}
	// The waiting turn's page follows it on its stream.
	if got := testid(p, "chat-live").AttrOr("sse-connect", ""); !strings.HasPrefix(got, "/orgs/acme/chat/turns/"+waiting+"/events?rev=") {
		t.Errorf("the waiting turn's page connects to %q", got)
	}

	r := e.POST("/orgs/acme/chat").WithFormField("session", first.SessionID).WithFormField("message", "And another").
		Expect().Status(http.StatusConflict)
	p = doc(t, r.Body().Raw(), "/orgs/acme")
	if got := testid(p, "chat-error").Text(); !strings.Contains(got, "already queued") || !strings.Contains(got, waiting) {
		t.Errorf("refusal %q", got)
	}
	if got := testid(p, "chat-message").Text(); got != "And another" {
		t.Errorf("the refused message is not kept: %q", got)
	}
	other := d.send(e, "", "A new session meanwhile")
	if got, _ := d.runner.Get(other); got.State != chat.StateQueued || got.Position != 2 {
		t.Fatalf("second waiting turn %+v", got)
	}

	// The job runs on past the turn's lease TTL (3s), and the sweeper a dispatcher runs ends
	// leases past their expiry: the waiting turn keeps its session's lease meanwhile,
	// rather than losing it.
	for range 3 {
		time.Sleep(3 * time.Second)
		if _, err := d.leases.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := d.runner.Get(waiting); got.State != chat.StateQueued {
		t.Fatalf("a turn waiting past its lease TTL: %+v", got)
	}
	// Its run lasts past its first refresh (a third of the TTL), when a lost lease shows.
	acme.write("scripted-agent.json", `{"chat_step_ms": 700}`)
	if err := d.leases.Release(ctx, job); err != nil {
		t.Fatal(err)
	}
	resumed := d.await(waiting, "the end", ended)
	if resumed.State != chat.StateDone || resumed.SessionID != first.SessionID {
		t.Fatalf("resumed turn %+v", resumed)
	}
	fresh := d.await(other, "the end", ended)
	if fresh.State != chat.StateDone || fresh.SessionID == first.SessionID || fresh.SessionID == "" {
		t.Fatalf("new-session turn %+v", fresh)
	}
	if fresh.RunningAt.Before(resumed.EndedAt.Truncate(time.Second)) {
		t.Errorf("the turns overlapped: %v before %v", fresh.RunningAt, resumed.EndedAt)
	}
}

// Stop ends a running turn on the server: the agent is killed, nothing of it is left, and
// both its leases are free in Postgres. Closing the connection that sent a turn does not
// stop it.
func TestStopEndsARunningTurnAndAClosedTabDoesNot(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	acme.write("scripted-agent.json", `{"chat_step_ms": 60000}`)
	d := newChatDash(t, acme)
	e := d.as("ada")
	id := d.send(e, "", "Take your time")
	turn := d.await(id, "the agent", func(t chat.Turn) bool { return t.State == chat.StateRunning })
	if pids := agentsOn(t, acme.dir); len(pids) != 1 {
		t.Fatalf("agents on the home while running: %v", pids)
	}
	for _, key := range []string{"home:acme", "session:acme.new-" + id} {
		if !d.held(key) {
			t.Fatalf("%s is not held while the turn runs", key)
		}
	}
	// The agent stores the user message soon after it starts, then sits in its first step;
	// the page is asked again until it shows, as its own refresh would.
	var p *goquery.Document
	for deadline := time.Now().Add(10 * time.Second); ; {
		p = page(t, e, "/orgs/acme/chat/turns/"+id, "/orgs/acme")
		if testid(p, "chat-stop").Length() != 1 || testid(p, "chat-state").Text() != "running" {
			t.Fatalf("running turn's page: state %q", testid(p, "chat-state").Text())
		}
		if p.Find(`[data-testid="message"][data-role="user"]`).Length() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the running turn's page never showed its user message")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := testid(p, "chat-session-id").Text(); got == "" {
		t.Error("the new session's id is not shown while it runs")
	}

	e.POST("/orgs/acme/chat/turns/" + id + "/stop").Expect().Status(http.StatusSeeOther).
		Header("Location").IsEqual("/orgs/acme/chat/turns/" + id)
	turn, _ = d.runner.Get(id)
	if turn.State != chat.StateStopped || !strings.Contains(turn.Reason, "stopped by ada") {
		t.Fatalf("stopped turn %+v", turn)
	}
	if pids := agentsOn(t, acme.dir); len(pids) != 0 {
		t.Errorf("agents left after Stop: %v", pids)
	}
	for _, key := range []string{"home:acme", "session:acme.new-" + id} {
		if d.held(key) {
			t.Errorf("%s is still held after Stop", key)
		}
	}
	p = page(t, e, "/orgs/acme/chat/turns/"+id, "/orgs/acme")
	if got := testid(p, "chat-reason").Text(); !strings.Contains(got, "stopped by ada") || testid(p, "chat-stop").Length() != 0 {
		t.Errorf("stopped page: %q", got)
	}

	// A tab that sends and goes away: the request's connection closed, the turn goes on.
	acme.write("scripted-agent.json", `{"chat_step_ms": 100}`)
	tok, err := d.signer.Sign("ada", "acme")
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	req, _ := http.NewRequest(http.MethodPost, d.srv.URL+"/orgs/acme/chat", strings.NewReader("message=Still+there%3F"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set(assertion.Header, tok)
	resp, err := (&http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	tr.CloseIdleConnections()
	closed, _ := strings.CutPrefix(resp.Header.Get("Location"), "/orgs/acme/chat/turns/")
	if done := d.await(closed, "the end", ended); done.State != chat.StateDone || done.Answer == "" {
		t.Fatalf("the turn of a closed tab %+v", done)
	}
}

// A turn is its org's: another org's dashboard does not know its id.
func TestAnotherOrgsTurnIsNotFound(t *testing.T) {
	acme, globex := twoHomes(t, 0)
	a, g := newChatDash(t, acme), newChatDash(t, globex)
	id := a.send(a.as("ada"), "", "acme's question "+hostile)
	a.await(id, "the end", ended)
	get(g.as("ada"), "/orgs/globex/chat/turns/"+id).Expect().Status(http.StatusNotFound)
	g.as("ada").POST("/orgs/globex/chat/turns/" + id + "/stop").Expect().Status(http.StatusNotFound)
	page(t, a.as("ada"), "/orgs/acme/chat/turns/"+id, "/orgs/acme")
}

// A turn whose lease is taken away (an operator's force release) stops its agent at the
// next refresh and fails with the reason; its other lease is released.
func TestATurnThatLosesItsLeaseKillsItsAgent(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	acme.write("scripted-agent.json", `{"chat_step_ms": 60000}`)
	d := newChatDash(t, acme)
	id := d.send(d.as("ada"), "", "Take your time")
	d.await(id, "the agent", func(t chat.Turn) bool { return t.State == chat.StateRunning })
	if _, err := d.control.ForceRelease(context.Background(), "home:acme", "operator:bob", "stuck turn"); err != nil {
		t.Fatal(err)
	}
	turn := d.await(id, "the end", ended)
	if turn.State != chat.StateFailed || !strings.Contains(turn.Reason, "lost its lease home:acme") {
		t.Fatalf("turn after losing its lease %+v", turn)
	}
	if pids := agentsOn(t, acme.dir); len(pids) != 0 {
		t.Errorf("agents left: %v", pids)
	}
	if d.held("session:acme.new-" + id) {
		t.Error("the session lease is still held")
	}
}

// sweepProbe records, each time the Runner sweeps, whether an agent still ran on the home
// and whether the turn still held home:acme; failWith makes the sweep fail.
type sweepProbe struct {
	mu       sync.Mutex
	leases   *lease.Store
	dir      string
	failWith error
	calls    []string // "agents=<n> home=<held>"
	broken   []error
}

func (p *sweepProbe) options(c *chat.Config) {
	c.Sweep = func() error {
		info, err := p.leases.Holder(context.Background(), "home:acme")
		held := err == nil && info.Held(time.Now())
		p.mu.Lock()
		defer p.mu.Unlock()
		p.calls = append(p.calls, fmt.Sprintf("agents=%d home=%v", len(agentsOnDir(p.dir)), held))
		return p.failWith
	}
	c.Broken = func(err error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.broken = append(p.broken, err)
	}
}

func (p *sweepProbe) seen() ([]string, []error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.calls...), append([]error(nil), p.broken...)
}

// Every turn, done or stopped, is swept once its agent has exited and before it gives up
// home:acme: nothing the agent detached may run beside the next agent on the home.
func TestEveryTurnIsSweptAfterItsAgentAndBeforeItsHomeIsFree(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	probe := &sweepProbe{dir: acme.dir}
	d := newChatDash(t, acme, probe.options)
	probe.leases = d.leases
	e := d.as("ada")
	first := d.await(d.send(e, "", "What ships on Tuesdays?"), "the end", ended)
	if first.State != chat.StateDone {
		t.Fatalf("first turn %+v", first)
	}
	acme.write("scripted-agent.json", `{"chat_step_ms": 60000}`)
	id := d.send(e, first.SessionID, "Take your time")
	d.await(id, "the agent", func(t chat.Turn) bool { return t.State == chat.StateRunning && !t.AgentAt.IsZero() })
	if _, ok := d.runner.Stop(id, "ada"); !ok {
		t.Fatal("stop refused")
	}
	if second := d.await(id, "the end", ended); second.State != chat.StateStopped {
		t.Fatalf("stopped turn %+v", second)
	}
	calls, broken := probe.seen()
	want := []string{"agents=0 home=true", "agents=0 home=true"}
	if strings.Join(calls, ", ") != strings.Join(want, ", ") || len(broken) != 0 {
		t.Fatalf("sweeps %q (broken %v), want one per turn, each with the agent gone and the home still the turn's: %q", calls, broken, want)
	}
	if d.held("home:acme") {
		t.Error("home:acme is still held after the turns")
	}
}

// A sweep that fails fails its turn with the reason, calls Broken (the dashboard exits)
// and leaves home:acme to expire instead of releasing it.
func TestATurnWhoseSweepFailsLeavesItsHomeLeaseToExpire(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	probe := &sweepProbe{dir: acme.dir, failWith: errors.New("after 5s, 1 processes are still there (pids [42])")}
	d := newChatDash(t, acme, probe.options)
	probe.leases = d.leases
	turn := d.await(d.send(d.as("ada"), "", "What ships on Tuesdays?"), "the end", ended)
	if turn.State != chat.StateFailed || !strings.Contains(turn.Reason, "could not be ended (after 5s, 1 processes are still there") {
		t.Fatalf("turn %+v, want failed with the sweep's reason", turn)
	}
	if _, broken := probe.seen(); len(broken) != 1 || broken[0] != probe.failWith {
		t.Fatalf("Broken called with %v, want once with the sweep's error", broken)
	}
	if !d.held("home:acme") {
		t.Fatal("home:acme was released while what the agent left may still run")
	}
	// No longer refreshed, it lapses within its TTL (3s here).
	deadline := time.Now().Add(10 * time.Second)
	for d.held("home:acme") {
		if time.Now().After(deadline) {
			t.Fatal("home:acme is still held 10s after its turn ended")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// With the unit's egress proxy (EGRESS_URL), a turn's agent has it as HTTPS_PROXY and
// HTTP_PROXY, its loopback (the gateway's forwarder) left direct; without, none of these.
func TestATurnsAgentGetsTheEgressProxy(t *testing.T) {
	for name, proxy := range map[string]string{"proxy": "http://127.0.0.1:7102", "none": ""} {
		t.Run(name, func(t *testing.T) { checkTurnProxyEnv(t, proxy) })
	}
}

func checkTurnProxyEnv(t *testing.T, proxy string) {
	acme, _ := twoHomes(t, 0)
	agent := filepath.Join(t.TempDir(), "env-agent")
	script := "#!/bin/sh\nenv | grep -i -E '^(https?|no)_proxy=' | sort >\"$HERMES_HOME/proxy.env\"\necho noted\n"
	if err := os.WriteFile(agent, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := newChatDash(t, acme, func(c *chat.Config) { c.HermesBin, c.EgressURL = agent, proxy })
	if turn := d.await(d.send(d.as("ada"), "", "Where is the internet?"), "the end", ended); turn.State != chat.StateDone {
		t.Fatalf("turn %+v", turn)
	}
	raw, err := os.ReadFile(filepath.Join(acme.dir, "proxy.env"))
	if err != nil {
		t.Fatal(err)
	}
	want := ""
	if proxy != "" {
		want = "HTTPS_PROXY=" + proxy + "\nHTTP_PROXY=" + proxy + "\nNO_PROXY=127.0.0.1,localhost,::1\n" +
			"http_proxy=" + proxy + "\nhttps_proxy=" + proxy + "\nno_proxy=127.0.0.1,localhost,::1\n"
	}
	if string(raw) != want {
		t.Errorf("with proxy %q the agent had:\n%s\nwant:\n%s", proxy, raw, want)
	}
}
