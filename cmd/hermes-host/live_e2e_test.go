package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/gavv/httpexpect/v2"

	"hermeshost/atomicfile"
	"hermeshost/control"
	"hermeshost/scriptedagent"
	"hermeshost/service"
	"hermeshost/subagent"
)

// The dashboards' live controls end to end (issue #18, "Tests that must pass"), through
// the launcher's proxy against `hermes-host dev` on the process runtime with claims on:
// an htmx Cancel and Send message that reach a running subagent, a force release that
// fences the old holder out, a chat turn that waits for a job holding the home, a Stop
// that ends a running turn and frees its leases, and another org's ids refused through
// acme's dashboard.

const liveControlSecret = "live-e2e-control-secret-0123456789"

// The goals of acme's first job's children, one after another (the scripted agent runs its
// subagents in order): each works until acted on.
const (
	goalCancel  = "live-e2e: work until cancelled"
	goalMessage = "live-e2e: work until a message comes"
	goalHold    = "live-e2e: hold the home while a chat waits"
	goalGlobex  = "live-e2e: globex's own child"
)

// childWait is how long a child works unless acted on: far longer than the test needs.
const childWait = 10 * time.Minute

// Timeouts of the waits (not assertions about speed; cancelBound is the one that is).
const (
	cancelBound  = 3 * time.Second
	childStartBy = 60 * time.Second
	turnBy       = 90 * time.Second
)

type liveStack struct {
	dev        *devRun
	acmeHome   string
	acme       *control.Client // acme's control key, as a separate holder would have it
	globex     *control.Client
	dispatcher string // the dispatcher's lease holder name
}

func TestLiveControlsThroughTheLauncher(t *testing.T) {
	orgs := t.TempDir()
	acmeHome := filepath.Join(orgs, "acme")
	// acme's first job delegates three children that each work until acted on; its
	// steps are short so a cancel lands at once. globex's child works on through the test.
	writeKnobs(t, acmeHome, scriptedagent.Knobs{StepMS: 300, ChatStepMS: 2000, Subagents: []scriptedagent.SubagentKnob{
		{Goal: goalCancel, Role: "researcher", WaitMS: int(childWait.Milliseconds())},
		{Goal: goalMessage, Role: "reviewer", WaitMS: int(childWait.Milliseconds())},
		{Goal: goalHold, Role: "holder", WaitMS: int(childWait.Milliseconds())},
	}})
	writeKnobs(t, filepath.Join(orgs, "globex"), scriptedagent.Knobs{StepMS: 300, Subagents: []scriptedagent.SubagentKnob{
		{Goal: goalGlobex, Role: "researcher", WaitMS: int(childWait.Milliseconds())},
	}})
	started := time.Now()
	dev := startDev(t, orgs, "HERMES_RUNTIME=process", "DOCKER_HOST=unix:///nonexistent/docker.sock",
		"CLAIM_ENABLED=true", "CONTROL_SECRET="+liveControlSecret, "JOB_GRACE=1s")
	s := &liveStack{dev: dev, acmeHome: acmeHome}
	ctlURL := ""
	waitUntil(t, 30*time.Second, func() bool {
		ctlURL, s.dispatcher = dispatcherLine(dev.logs.String())
		return ctlURL != ""
	})
	s.acme, s.globex = controlClient(t, ctlURL, "acme"), controlClient(t, ctlURL, "globex")
	e := dev.operatorBrowser(t)
	openDashboard(t, e, "acme", 90*time.Second)
	openDashboard(t, e, "globex", 90*time.Second)
	t.Logf("dev and both dashboards up after %s", time.Since(started).Round(time.Millisecond))

	steps := []struct {
		name string
		run  func(*testing.T, *httpexpect.Expect)
	}{
		{"cancel", s.cancel},
		{"message", s.message},
		{"chat waits for a job", s.chatWaits},
		{"stop", s.stop},
		{"force release", s.forceRelease},
		{"other org's ids", s.otherOrg},
	}
	for _, st := range steps {
		begun := time.Now()
		ok := t.Run(st.name, func(t *testing.T) { st.run(t, dev.operatorBrowser(t)) })
		t.Logf("%s: %s", st.name, time.Since(begun).Round(time.Millisecond))
		if !ok {
			t.Fatalf("%q failed; the later steps build on it", st.name)
		}
	}
}

// cancel: an htmx Cancel answers with the row's cells alone, and the child stops at its next step.
func (s *liveStack) cancel(t *testing.T, e *httpexpect.Expect) {
	child := s.awaitChild(t, e, goalCancel)
	// The first job's agent has read its knobs: later runs (the second job, the chat
	// turns) go quickly, so nothing but this job keeps the home for long.
	writeKnobs(t, s.acmeHome, scriptedagent.Knobs{StepMS: 50, ChatStepMS: 2000})

	begun := time.Now()
	body := e.POST("/orgs/acme/subagents/"+url.PathEscape(child.id)+"/cancel").
		WithHeader("HX-Request", "true").WithHeader("Origin", s.dev.launcher).
		Expect().Status(http.StatusOK).Body().Raw()
	row := fragmentRow(t, body)
	if row.id != child.id || (row.status != subagent.Cancelling && row.status != subagent.Cancelled) {
		t.Fatalf("the cancel's fragment is subagent %q %q, want %s cancelling or cancelled:\n%s", row.id, row.status, child.id, body)
	}
	if row.notice == "" {
		t.Fatalf("the cancel's fragment says nothing of what was done:\n%s", body)
	}
	var now subagentRow
	for {
		now = s.row(t, e, "acme", child.id)
		if now.status != subagent.Running && now.status != subagent.Cancelling {
			break
		}
		if time.Since(begun) > 30*time.Second {
			t.Fatalf("subagent %s is still %q 30 s after its cancel", child.id, now.status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(begun)
	t.Logf("the cancelled child's row said %q %s after the POST", now.status, took.Round(time.Millisecond))
	if now.status != subagent.Cancelled {
		t.Fatalf("subagent %s ended %q (%q), not cancelled", child.id, now.status, now.summary)
	}
	if took > cancelBound {
		t.Fatalf("the child took %s to stop after the cancel, more than %s", took, cancelBound)
	}
	// The child itself stopped at the block its next tool call met, not at its own end.
	if now.summary != "stopped as asked" {
		t.Fatalf("the cancelled child's summary is %q, want the child's own report of stopping", now.summary)
	}
	if want := "by operator:" + s.dev.login[0]; !strings.HasPrefix(now.cancelled, want) {
		t.Fatalf("the cancelled row says %q, want it to start %q", now.cancelled, want)
	}
}

// message: a message sent from the page reaches the child once, which quotes it, and
// nothing is left pending.
func (s *liveStack) message(t *testing.T, e *httpexpect.Expect) {
	child := s.awaitChild(t, e, goalMessage)
	msg := "live-e2e message " + randomHex(4)
	body := e.POST("/orgs/acme/subagents/"+url.PathEscape(child.id)+"/messages").
		WithHeader("HX-Request", "true").WithHeader("Origin", s.dev.launcher).
		WithFormField("body", msg).Expect().Status(http.StatusOK).Body().Raw()
	row := fragmentRow(t, body)
	if row.id != child.id || row.refused {
		t.Fatalf("the send's fragment is subagent %q (refused %v: %q), want %s:\n%s", row.id, row.refused, row.notice, child.id, body)
	}
	var now subagentRow
	awaitf(t, 30*time.Second, func() (bool, string) {
		now = s.row(t, e, "acme", child.id)
		return now.status != subagent.Running, fmt.Sprintf("subagent %s is %q (%q)", child.id, now.status, now.summary)
	})
	if now.status != subagent.Done || now.summary != "heard: "+msg {
		t.Fatalf("the messaged child ended %q with summary %q, want done with %q", now.status, now.summary, "heard: "+msg)
	}
	d, err := s.acme.Subagent(context.Background(), child.id)
	if err != nil {
		t.Fatal(err)
	}
	if d.Subagent.Pending != 0 {
		t.Fatalf("%d messages still pending for the child that heard them", d.Subagent.Pending)
	}
	var mine []subagent.Message
	for _, m := range d.Messages {
		if m.Body == msg {
			mine = append(mine, m)
		}
	}
	if len(mine) != 1 || len(d.Messages) != 1 {
		t.Fatalf("the child's mailbox holds %d messages, %d of them ours, want exactly ours once: %+v", len(d.Messages), len(mine), d.Messages)
	}
	if m := mine[0]; m.AckedAt == nil || m.Sender != "operator:"+s.dev.login[0] {
		t.Fatalf("the message is not acknowledged, or not from the operator: %+v", m)
	}
	// In the child's own session the operator's message reached it in one tool result.
	if d.Subagent.Session == "" {
		t.Fatal("the child has no session")
	}
	seen := s.toolResultsWith(t, e, d.Subagent.Session, msg)
	if seen != 1 {
		t.Fatalf("the operator's message is in %d tool results of the child's session, want 1", seen)
	}
}

// chatWaits: a chat sent while a job holds the home waits, showing the job, then runs.
func (s *liveStack) chatWaits(t *testing.T, e *httpexpect.Expect) {
	hold := s.awaitChild(t, e, goalHold)
	d, err := s.acme.Subagent(context.Background(), hold.id)
	if err != nil {
		t.Fatal(err)
	}
	job := d.Subagent.JobID
	if job == "" {
		t.Fatalf("the holding child %s names no job", hold.id)
	}
	turn := s.sendChat(t, e, "What ships on Tuesdays? "+randomHex(3))
	var tv turnView
	awaitf(t, 15*time.Second, func() (bool, string) {
		tv = s.turn(t, e, turn)
		return tv.state != "queued" || (tv.heldBy != "" && len(tv.jobs) > 0), tv.String()
	})
	if tv.state != "queued" || !strings.Contains(tv.queued, "home:acme") {
		t.Fatalf("a turn sent while job %s holds the home: %s", job, tv)
	}
	if tv.heldBy != s.dispatcher {
		t.Fatalf("the waiting turn says the home is held by %q, want the dispatcher %q", tv.heldBy, s.dispatcher)
	}
	if len(tv.jobs) != 1 || !strings.Contains(tv.jobs[0], job) || !strings.Contains(tv.jobs[0], "RUNNING") {
		t.Fatalf("the waiting turn lists jobs %q, want job %s running", tv.jobs, job)
	}
	// While the child holds the job (and the job the home) the turn does not run.
	if now := s.row(t, e, "acme", hold.id); now.status != subagent.Running {
		t.Fatalf("the holding child is %q already", now.status)
	}
	if tv = s.turn(t, e, turn); tv.state != "queued" {
		t.Fatalf("the turn left the queue while job %s held the home: %s", job, tv)
	}
	// Let the job go on: the child hears a message and ends, the job finishes.
	e.POST("/orgs/acme/subagents/"+url.PathEscape(hold.id)+"/messages").
		WithHeader("HX-Request", "true").WithHeader("Origin", s.dev.launcher).
		WithFormField("body", "carry on").Expect().Status(http.StatusOK).Body().Raw()
	awaitf(t, turnBy, func() (bool, string) {
		tv = s.turn(t, e, turn)
		return tv.state != "queued" && tv.state != "running", tv.String()
	})
	if tv.state != "done" || !strings.Contains(tv.answer, "demo reply") {
		t.Fatalf("the turn that waited ended %s", tv)
	}
	j, err := s.acme.Job(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	if st := j.Job.Status; st == "RUNNING" || st == "CLAIMED" {
		t.Fatalf("the turn ran while job %s is %s", job, st)
	}
}

// stop: Stop ends a running turn on the server and its leases are freed.
func (s *liveStack) stop(t *testing.T, e *httpexpect.Expect) {
	turn := s.sendChat(t, e, "Tell me about the brand, slowly. "+randomHex(3))
	id := turn[strings.LastIndex(turn, "/")+1:]
	holder := "chat:acme:" + id
	var tv turnView
	awaitf(t, turnBy, func() (bool, string) {
		tv = s.turn(t, e, turn)
		return tv.state != "queued", tv.String()
	})
	if tv.state != "running" {
		t.Fatalf("the turn to stop is not running: %s", tv)
	}
	held := s.heldBy(t, holder)
	if !held["home:acme"] || len(held) != 2 {
		t.Fatalf("the running turn holds %v, want home:acme and its session lease", held)
	}
	if agents := agentPIDs(s.acmeHome); len(agents) != 1 {
		t.Fatalf("%d agents run on acme's home while the turn runs, want 1: %v", len(agents), agents)
	}
	if got := leasePage(t, e).holders(); !got[holder] {
		t.Fatalf("the leases page does not show the running turn's %s: %v", holder, got)
	}

	loc := e.POST(turn+"/stop").WithHeader("Origin", s.dev.launcher).
		Expect().Status(http.StatusSeeOther).Header("Location").Raw()
	if loc != turn {
		t.Fatalf("Stop led to %q, want the turn %q", loc, turn)
	}
	tv = s.turn(t, e, turn)
	if tv.state != "stopped" || tv.answer != "" || !strings.Contains(tv.reason, s.dev.login[0]) {
		t.Fatalf("the stopped turn: %s", tv)
	}
	if held := s.heldBy(t, holder); len(held) != 0 {
		t.Fatalf("after Stop, %s still holds %v", holder, held)
	}
	if got := leasePage(t, e).holders(); got[holder] {
		t.Fatalf("after Stop the leases page still shows %s holding: %v", holder, got)
	}
	awaitf(t, 5*time.Second, func() (bool, string) {
		agents := agentPIDs(s.acmeHome)
		return len(agents) == 0, fmt.Sprintf("agents still run on acme's home after Stop: %v", agents)
	})
}

// forceRelease: the page's audited force release moves the epoch on, records the operator
// and the reason, and the old holder's next refresh is refused as lost.
func (s *liveStack) forceRelease(t *testing.T, e *httpexpect.Expect) {
	ctx := context.Background()
	key := "session:live-e2e-" + randomHex(4)
	old, err := s.acme.Acquire(ctx, key, "live-e2e/old-holder", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	page := leasePage(t, e)
	row, ok := page.rows[key]
	if !ok || !row.held || row.holder != old.Holder || row.epoch != fmt.Sprint(old.Epoch) {
		t.Fatalf("the leases page shows %s as %+v (found %v), want held by %s at epoch %d", key, row, ok, old.Holder, old.Epoch)
	}
	if row.confirm == "" {
		t.Fatalf("no Force release link for the held %s", key)
	}
	confirm := parse(t, getHref(t, e, row.confirm).Expect().Status(http.StatusOK).Body().Raw())
	form := byTestID(confirm, "force-release-form")
	action, _ := form.Attr("action")
	hidden, _ := form.Find(`input[name="key"]`).Attr("value")
	if strings.TrimSpace(byTestID(confirm, "force-release-key").Text()) != key || hidden != key || action != "/orgs/acme/leases/force-release" {
		t.Fatalf("the confirmation for %s: key %q, form key %q, action %q", key, byTestID(confirm, "force-release-key").Text(), hidden, action)
	}

	// Without a reason nothing is released.
	e.POST(action).WithHeader("Origin", s.dev.launcher).WithFormField("key", key).WithFormField("reason", "").
		Expect().Status(http.StatusBadRequest).Body().Raw()
	if info, err := s.acme.Holder(ctx, key); err != nil || !info.Held || info.Epoch != old.Epoch {
		t.Fatalf("a force release without a reason changed %s: %+v, %v", key, info, err)
	}

	reason := "live-e2e: the holder is stuck " + randomHex(3)
	loc := e.POST(action).WithHeader("Origin", s.dev.launcher).WithFormField("key", key).WithFormField("reason", reason).
		Expect().Status(http.StatusSeeOther).Header("Location").Raw()
	after := parse(t, getHref(t, e, loc).Expect().Status(http.StatusOK).Body().Raw())
	if notice := byTestID(after, "leases-notice").Text(); !strings.Contains(notice, key) || !strings.Contains(notice, "force") {
		t.Fatalf("after the force release the page says %q", notice)
	}
	now := readLeases(after).rows[key]
	if now.held || now.epoch != fmt.Sprint(old.Epoch+1) {
		t.Fatalf("after the force release %s shows %+v, want free at epoch %d", key, now, old.Epoch+1)
	}
	if len(now.events) == 0 || now.events[0].kind != "force_release" || now.events[0].actor != "operator:"+s.dev.login[0] ||
		now.events[0].reason != reason || !strings.Contains(now.events[0].text, old.Holder) {
		t.Fatalf("the newest event of %s is %+v, want force_release of %s by operator:%s for %q", key, now.events, old.Holder, s.dev.login[0], reason)
	}

	// The old holder is fenced out: its refresh and release are refused, even once
	// someone else holds the key.
	if _, err := s.acme.Refresh(ctx, old, time.Minute); !control.IsLost(err) {
		t.Fatalf("the old holder's refresh after the force release: %v, want lost", err)
	}
	next, err := s.acme.Acquire(ctx, key, "live-e2e/next-holder", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if next.Epoch <= old.Epoch+1 {
		t.Fatalf("the next holding has epoch %d, not past the released %d", next.Epoch, old.Epoch+1)
	}
	if _, err := s.acme.Refresh(ctx, old, time.Minute); !control.IsLost(err) {
		t.Fatalf("the old holder's refresh once another holds %s: %v, want lost", key, err)
	}
	if err := s.acme.Release(ctx, old); !control.IsLost(err) {
		t.Fatalf("the old holder's release once another holds %s: %v, want lost", key, err)
	}
	if info, err := s.acme.Holder(ctx, key); err != nil || info.Holder != next.Holder || info.Epoch != next.Epoch {
		t.Fatalf("the old holder's refused calls changed %s: %+v, %v", key, info, err)
	}
	if err := s.acme.Release(ctx, next); err != nil {
		t.Fatal(err)
	}
}

// otherOrg: globex's subagent, job and leases, used through acme's dashboard, are refused
// and left as they were.
func (s *liveStack) otherOrg(t *testing.T, e *httpexpect.Expect) {
	ctx := context.Background()
	child := s.awaitChildIn(t, e, "globex", goalGlobex)
	gd, err := s.globex.Subagent(ctx, child.id)
	if err != nil {
		t.Fatal(err)
	}
	job := gd.Subagent.JobID
	if job == "" {
		t.Fatalf("globex's child %s names no job", child.id)
	}
	// The ids are good ones: globex's own dashboard shows them.
	e.GET("/orgs/globex/jobs/" + url.PathEscape(job)).Expect().Status(http.StatusOK).Body().Raw()
	sessKey := "session:live-e2e-globex-" + randomHex(4)
	sess, err := s.globex.Acquire(ctx, sessKey, "live-e2e/globex-holder", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	homeBefore, err := s.globex.Holder(ctx, "home:globex")
	if err != nil || !homeBefore.Held {
		t.Fatalf("globex's home while its job runs: %+v, %v", homeBefore, err)
	}

	refused := func(what string, resp *httpexpect.Response) {
		t.Helper()
		body := resp.Body().Raw() // read, so its connection is not left waiting (goleak)
		if st := resp.Raw().StatusCode; st != http.StatusNotFound && st != http.StatusForbidden {
			t.Fatalf("%s through acme's dashboard: %d, want 404 or 403:\n%s", what, st, body)
		}
	}
	post := func(path string) *httpexpect.Request {
		return e.POST(path).WithHeader("HX-Request", "true").WithHeader("Origin", s.dev.launcher)
	}
	refused("cancel globex's subagent", post("/orgs/acme/subagents/"+url.PathEscape(child.id)+"/cancel").Expect())
	refused("message globex's subagent", post("/orgs/acme/subagents/"+url.PathEscape(child.id)+"/messages").
		WithFormField("body", "from acme's page").Expect())
	refused("globex's job", e.GET("/orgs/acme/jobs/"+url.PathEscape(job)).Expect())
	for _, key := range []string{"home:globex", sessKey, "session:globex." + strings.TrimPrefix(sessKey, "session:")} {
		refused("force release of "+key, e.POST("/orgs/acme/leases/force-release").WithHeader("Origin", s.dev.launcher).
			WithFormField("key", key).WithFormField("reason", "live-e2e: not acme's").Expect())
	}

	// Nothing of globex's changed.
	gd, err = s.globex.Subagent(ctx, child.id)
	if err != nil {
		t.Fatal(err)
	}
	if gd.Subagent.Status != subagent.Running || gd.Subagent.CancelledBy != "" || gd.Subagent.Pending != 0 || len(gd.Messages) != 0 {
		t.Fatalf("globex's child after acme's attempts: %+v, messages %+v", gd.Subagent, gd.Messages)
	}
	if now := s.row(t, e, "globex", child.id); now.status != subagent.Running {
		t.Fatalf("globex's subagents page shows its child %q", now.status)
	}
	if info, err := s.globex.Holder(ctx, sessKey); err != nil || !info.Held || info.Holder != sess.Holder || info.Epoch != sess.Epoch {
		t.Fatalf("globex's %s after acme's force releases: %+v, %v (want held by %s at epoch %d)", sessKey, info, err, sess.Holder, sess.Epoch)
	}
	if info, err := s.globex.Holder(ctx, "home:globex"); err != nil || !info.Held || info.Holder != homeBefore.Holder || info.Epoch != homeBefore.Epoch {
		t.Fatalf("globex's home after acme's force release: %+v, %v (was %+v)", info, err, homeBefore)
	}
	for _, key := range []string{sessKey, "home:globex"} {
		evs, err := s.globex.LeaseEvents(ctx, key, 20)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Kind == "force_release" {
				t.Fatalf("globex's %s was released by force: %+v", key, ev)
			}
		}
	}
	if _, err := s.acme.Holder(ctx, sessKey); !control.IsNotFound(err) {
		t.Fatalf("acme's key reaches a lease named as globex's session: %v", err)
	}
	if err := s.globex.Release(ctx, sess); err != nil {
		t.Fatal(err)
	}
}

// getHref is a GET of a link as a page gives it (httpexpect would escape its query).
func getHref(t *testing.T, e *httpexpect.Expect, href string) *httpexpect.Request {
	t.Helper()
	u, err := url.Parse(href)
	if err != nil || u.Host != "" {
		t.Fatalf("link %q is not a path on the launcher (%v)", href, err)
	}
	return e.GET(u.Path).WithQueryString(u.RawQuery)
}

// writeKnobs puts the scripted agent's knobs in home, atomically (an agent may be reading).
func writeKnobs(t *testing.T, home string, k scriptedagent.Knobs) {
	t.Helper()
	b, err := json.Marshal(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(home, scriptedagent.KnobsFile)
	if err := atomicfile.Write(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// A sandboxed unit already running there (a dashboard) runs as the home's owner, which
	// the runtime made the sandbox's uid: the file must be that uid's too.
	if fi, err := os.Stat(home); err == nil && os.Geteuid() == 0 {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			if err := os.Chown(p, int(st.Uid), int(st.Gid)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// dispatcherLine reads the control API's URL and the dispatcher's holder name from dev's
// "dispatcher polling" log line; "" until it is logged.
func dispatcherLine(logs string) (controlURL, holder string) {
	for _, line := range strings.Split(logs, "\n") {
		var ev struct {
			Msg       string `json:"msg"`
			StatusURL string `json:"status_url"`
			Holder    string `json:"holder"`
		}
		if json.Unmarshal([]byte(line), &ev) == nil && ev.Msg == "dispatcher polling" {
			return ev.StatusURL, ev.Holder
		}
	}
	return "", ""
}

func controlClient(t *testing.T, base, org string) *control.Client {
	t.Helper()
	key, err := control.Key(service.Secret(liveControlSecret), org)
	if err != nil {
		t.Fatal(err)
	}
	c, err := control.NewClient(base, key, &http.Client{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// awaitf waits until ok, failing with what it last said.
func awaitf(t *testing.T, within time.Duration, ok func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		done, said := ok()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not so after %s: %s", within, said)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type subagentRow struct {
	id, goal, status, summary, cancelled, notice string
	refused                                      bool
}

func readSubagentRow(s *goquery.Selection) subagentRow {
	text := func(id string) string { return strings.TrimSpace(s.Find(`[data-testid="` + id + `"]`).Text()) }
	notice := s.Find(`[data-testid="subagent-notice"]`)
	return subagentRow{
		id: text("subagent-id"), goal: text("subagent-goal"), status: text("subagent-status"), summary: text("subagent-summary"),
		cancelled: text("subagent-cancelled"), notice: strings.TrimSpace(notice.Text()), refused: notice.HasClass("error"),
	}
}

// fragmentRow is the one subagent row's cells an htmx action answers with (swapped inside
// the row, which stays), failing when the answer is anything more (a page, a row, several
// rows' cells) or less.
func fragmentRow(t *testing.T, body string) subagentRow {
	t.Helper()
	trimmed := strings.TrimSpace(body)
	lower := strings.ToLower(trimmed)
	if !strings.HasPrefix(lower, "<td") || !strings.HasSuffix(lower, "</td>") || strings.Contains(lower, "<tr") || strings.Contains(lower, "<html") || strings.Contains(lower, "<body") {
		t.Fatalf("the htmx answer is not one row's cells:\n%s", body)
	}
	// Cells parse only inside a row of a table.
	rows := byTestID(parse(t, `<table><tbody><tr data-testid="subagent">`+trimmed+"</tr></tbody></table>"), "subagent")
	if n := rows.Find(`[data-testid="subagent-id"]`).Length(); rows.Length() != 1 || n != 1 {
		t.Fatalf("the htmx answer holds %d subagents' cells, want 1:\n%s", n, body)
	}
	return readSubagentRow(rows)
}

func (s *liveStack) rows(t *testing.T, e *httpexpect.Expect, org string) []subagentRow {
	t.Helper()
	doc := parse(t, e.GET("/orgs/"+org+"/subagents").Expect().Status(http.StatusOK).Body().Raw())
	if msg := byTestID(doc, "subagents-error").Text(); msg != "" {
		t.Fatalf("%s's subagents page: %s", org, msg)
	}
	var out []subagentRow
	byTestID(doc, "subagent").Each(func(_ int, sel *goquery.Selection) { out = append(out, readSubagentRow(sel)) })
	return out
}

// row is subagent id as org's subagents page shows it.
func (s *liveStack) row(t *testing.T, e *httpexpect.Expect, org, id string) subagentRow {
	t.Helper()
	for _, r := range s.rows(t, e, org) {
		if r.id == id {
			return r
		}
	}
	t.Fatalf("%s's subagents page has no subagent %s", org, id)
	return subagentRow{}
}

func (s *liveStack) awaitChild(t *testing.T, e *httpexpect.Expect, goal string) subagentRow {
	t.Helper()
	return s.awaitChildIn(t, e, "acme", goal)
}

// awaitChildIn waits for org's subagents page to show a running child with that goal.
func (s *liveStack) awaitChildIn(t *testing.T, e *httpexpect.Expect, org, goal string) subagentRow {
	t.Helper()
	var found subagentRow
	awaitf(t, childStartBy, func() (bool, string) {
		rows := s.rows(t, e, org)
		for _, r := range rows {
			if r.goal == goal && r.status == subagent.Running {
				found = r
				return true, ""
			}
		}
		return false, fmt.Sprintf("no running %q child of %s; the page shows %+v", goal, org, rows)
	})
	return found
}

// toolResultsWith counts the tool results of session (every page of its transcript) that
// hold text.
func (s *liveStack) toolResultsWith(t *testing.T, e *httpexpect.Expect, session, text string) int {
	t.Helper()
	n := 0
	next := "/orgs/acme/sessions/" + url.PathEscape(session)
	for pages := 0; next != ""; pages++ {
		if pages > 50 {
			t.Fatalf("the transcript of %s runs past 50 pages", session)
		}
		doc := parse(t, e.GET(next).Expect().Status(http.StatusOK).Body().Raw())
		if byTestID(doc, "transcript-busy").Length() > 0 {
			t.Fatalf("state.db is busy for %s's transcript", session)
		}
		byTestID(doc, "tool-result-content").Each(func(_ int, sel *goquery.Selection) {
			if strings.Contains(sel.Text(), text) {
				n++
			}
		})
		next, _ = byTestID(doc, "transcript-next").Attr("href")
	}
	return n
}

// sendChat posts message to acme's chat as the page's form does and returns the turn's path.
func (s *liveStack) sendChat(t *testing.T, e *httpexpect.Expect, message string) string {
	t.Helper()
	turn := e.POST("/orgs/acme/chat").WithHeader("Origin", s.dev.launcher).WithFormField("message", message).
		Expect().Status(http.StatusSeeOther).Header("Location").Raw()
	if !strings.HasPrefix(turn, "/orgs/acme/chat/turns/") {
		t.Fatalf("the chat led to %q", turn)
	}
	return turn
}

type turnView struct {
	state, queued, heldBy, answer, reason string
	jobs                                  []string
}

func (v turnView) String() string {
	return fmt.Sprintf("state %q, queued %q, held by %q, jobs %q, answer %q, reason %q", v.state, v.queued, v.heldBy, v.jobs, v.answer, v.reason)
}

func (s *liveStack) turn(t *testing.T, e *httpexpect.Expect, path string) turnView {
	t.Helper()
	doc := parse(t, e.GET(path).Expect().Status(http.StatusOK).Body().Raw())
	text := func(id string) string { return strings.Join(strings.Fields(byTestID(doc, id).Text()), " ") }
	v := turnView{state: text("chat-state"), queued: text("chat-queued"), heldBy: text("chat-held-by"), answer: text("chat-answer"), reason: text("chat-reason")}
	byTestID(doc, "chat-job").Each(func(_ int, sel *goquery.Selection) {
		v.jobs = append(v.jobs, strings.Join(strings.Fields(sel.Text()), " "))
	})
	return v
}

// heldBy is the keys of acme's leases holder holds now, as the control API lists them.
func (s *liveStack) heldBy(t *testing.T, holder string) map[string]bool {
	t.Helper()
	list, err := s.acme.Leases(context.Background(), control.LeaseQuery{Held: true, Limit: 200})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, l := range list.Leases {
		if l.Holder == holder {
			keys[l.Key] = true
		}
	}
	return keys
}

type leaseEventView struct{ kind, actor, reason, text string }

type leaseRowView struct {
	holder, epoch, confirm string
	held                   bool
	events                 []leaseEventView
}

type leasesView struct{ rows map[string]leaseRowView }

// holders is who the page shows holding a lease.
func (v leasesView) holders() map[string]bool {
	out := map[string]bool{}
	for _, r := range v.rows {
		if r.held {
			out[r.holder] = true
		}
	}
	return out
}

func leasePage(t *testing.T, e *httpexpect.Expect) leasesView {
	t.Helper()
	doc := parse(t, e.GET("/orgs/acme/leases").Expect().Status(http.StatusOK).Body().Raw())
	if msg := byTestID(doc, "leases-error").Text(); msg != "" {
		t.Fatalf("acme's leases page: %s", msg)
	}
	return readLeases(doc)
}

func readLeases(doc *goquery.Document) leasesView {
	v := leasesView{rows: map[string]leaseRowView{}}
	byTestID(doc, "lease").Each(func(_ int, sel *goquery.Selection) {
		text := func(s *goquery.Selection, id string) string {
			return strings.TrimSpace(s.Find(`[data-testid="` + id + `"]`).Text())
		}
		r := leaseRowView{holder: text(sel, "lease-holder"), epoch: text(sel, "lease-epoch")}
		r.confirm, r.held = sel.Find(`[data-testid="lease-force-release"]`).Attr("href")
		sel.Find(`[data-testid="lease-event"]`).Each(func(_ int, ev *goquery.Selection) {
			r.events = append(r.events, leaseEventView{kind: text(ev, "lease-event-kind"), actor: text(ev, "lease-event-actor"),
				reason: text(ev, "lease-event-reason"), text: strings.Join(strings.Fields(ev.Text()), " ")})
		})
		v.rows[text(sel, "lease-key")] = r
	})
	return v
}

// agentPIDs are the live scripted agents whose HERMES_HOME is home (a zombie, killed and
// not yet reaped, is not one).
func agentPIDs(home string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	mine := []byte(scriptedagent.EnvHome + "=" + home + "\x00")
	for _, en := range entries {
		var pid int
		if _, err := fmt.Sscan(en.Name(), &pid); err != nil {
			continue
		}
		dir := filepath.Join("/proc", en.Name())
		cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		if err != nil || filepath.Base(string(argv0)) != "scripted-agent" {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join(dir, "stat")); err == nil {
			// The state follows the command's closing parenthesis (the command may hold one).
			if i := bytes.LastIndex(stat, []byte(") ")); i >= 0 && bytes.HasPrefix(stat[i+2:], []byte("Z")) {
				continue
			}
		}
		if env, err := os.ReadFile(filepath.Join(dir, "environ")); err == nil && bytes.Contains(env, mine) {
			pids = append(pids, pid)
		}
	}
	return pids
}
