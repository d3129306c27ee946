package web_test

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"hermeshost/assertion"
	"hermeshost/internal/hosttest"
	"hermeshost/subagent"
	"hermeshost/templates"
)

// holds fails the test unless cond, an SQL boolean over the database, is true (a false
// or null one divides by zero).
func (d *dash) holds(cond string, args ...any) {
	d.t.Helper()
	d.exec(`SELECT 1/(CASE WHEN (`+cond+`) THEN 1 ELSE 0 END)`, args...)
}

// htmxPost is a form POST as htmx sends it from a row's button.
func htmxPost(d *dash, operator, path string, form map[string]string) (int, *strings.Builder) {
	r := d.as(operator).POST(path).WithHeader("HX-Request", "true").WithHeader("HX-Target", "row")
	for k, v := range form {
		r = r.WithFormField(k, v)
	}
	resp := r.Expect()
	var b strings.Builder
	b.WriteString(resp.Body().Raw())
	return resp.Raw().StatusCode, &b
}

func TestSubagentsAreListedAndCancelledOrMessagedInPlaceAsTheOperator(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	d := newDash(t, dashOptions{home: acme})
	ctx := context.Background()
	for _, st := range []subagent.Start{
		{ID: "sub-run", JobID: "job-1", Goal: hostile, Role: "researcher"},
		{ID: "sub-done", ParentSession: "sess-1", Goal: "summarise the catalogue"},
		{ID: "sub-msg", ParentSubagent: "sub-run", Goal: "write the claims"},
	} {
		if _, err := d.control.StartSubagent(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.control.StopSubagent(ctx, "sub-done", subagent.Done, hostile); err != nil {
		t.Fatal(err)
	}
	d.exec(`INSERT INTO subagents (org, id, goal, status) VALUES ('globex', 'sub-globex', 'globex secret goal', 'running')`)

	e := d.as("ada")
	body := get(e, "/orgs/acme/subagents").Expect().Status(http.StatusOK).Body().Raw()
	p := doc(t, body, "/orgs/acme")
	if got := texts(testid(p, "subagent-id")); len(got) != 3 {
		t.Errorf("subagents listed %v", got)
	}
	if strings.Contains(body, "globex") {
		t.Error("another org's subagent is listed")
	}
	if got := texts(testid(p, "subagent-goal")); !strings.Contains(strings.Join(got, "\n"), hostile) {
		t.Errorf("goals %q", got)
	}
	if got := texts(testid(p, "subagent-summary")); !strings.Contains(strings.Join(got, "\n"), hostile) {
		t.Errorf("summaries %q", got)
	}
	if got := testid(p, "subagent-job"); got.Length() != 1 || got.AttrOr("href", "") != "/orgs/acme/jobs/job-1" {
		t.Errorf("the job links %d, %q", got.Length(), got.AttrOr("href", ""))
	}
	if n := testid(p, "subagent-cancel").Length(); n != 2 {
		t.Errorf("%d Cancel buttons for two running subagents", n)
	}
	cancelForm := testid(p, "subagent-cancel").First()
	if post, _ := cancelForm.Attr("hx-post"); !strings.HasPrefix(post, "/orgs/acme/subagents/sub-") || !strings.HasSuffix(post, "/cancel") {
		t.Errorf("Cancel posts to %q", post)
	}
	if tgt, _ := cancelForm.Attr("hx-target"); tgt != "closest tr" {
		t.Errorf("Cancel targets %q", tgt)
	}
	if sw, _ := cancelForm.Attr("hx-swap"); sw != "innerHTML" {
		t.Errorf("Cancel swaps %q", sw)
	}

	// Send: the row's cells come back with the message waiting (swapped inside the row,
	// which stays the live stream's listener); the child drains it once.
	status, frag := htmxPost(d, "ada", "/orgs/acme/subagents/sub-msg/messages", map[string]string{"body": hostile})
	if status != http.StatusOK {
		t.Fatalf("send: %d %s", status, frag)
	}
	f := doc(t, "<table><tr>"+frag.String()+"</tr></table>", "/orgs/acme")
	if strings.Contains(frag.String(), "<html") || strings.Contains(frag.String(), "<tr") || testid(f, "subagent-id").Length() != 1 {
		t.Errorf("send did not answer with the row's cells alone: %s", frag)
	}
	if v := testid(f, "subagent-status").AttrOr("data-version", ""); v == "" || strings.Trim(v, "0123456789") != "" {
		t.Errorf("the cells carry no version of the handle: %q", v)
	}
	if got := testid(f, "subagent-pending").Text(); !strings.Contains(got, "1 waiting") {
		t.Errorf("pending after send %q", got)
	}
	if got := testid(f, "subagent-notice").Text(); !strings.Contains(got, "queued") {
		t.Errorf("notice %q", got)
	}
	box, err := d.control.Mailbox(ctx, "sub-msg", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(box.Messages) != 1 || box.Messages[0].Body != hostile || box.Messages[0].Sender != "operator:ada" {
		t.Fatalf("mailbox %+v", box.Messages)
	}
	if n, err := d.control.Ack(ctx, "sub-msg", []int64{box.Messages[0].ID}); err != nil || n != 1 {
		t.Fatalf("ack %d %v", n, err)
	}
	if box, err = d.control.Mailbox(ctx, "sub-msg", 0); err != nil || len(box.Messages) != 0 {
		t.Fatalf("after ack the mailbox holds %+v (%v)", box.Messages, err)
	}

	// An empty message is refused in the row, nothing queued.
	status, frag = htmxPost(d, "ada", "/orgs/acme/subagents/sub-msg/messages", map[string]string{"body": "  "})
	if f = doc(t, "<table><tr>"+frag.String()+"</tr></table>", "/orgs/acme"); status != http.StatusOK || !strings.Contains(testid(f, "subagent-notice").Text(), "Write a message") {
		t.Errorf("empty message: %d %s", status, frag)
	}
	d.holds(`(SELECT count(*) FROM subagent_messages WHERE org = 'acme' AND subagent_id = 'sub-msg') = 1`)

	// Cancel: the row says cancelling, without its buttons; Postgres records who asked.
	status, frag = htmxPost(d, "ada", "/orgs/acme/subagents/sub-run/cancel", nil)
	f = doc(t, "<table><tr>"+frag.String()+"</tr></table>", "/orgs/acme")
	if status != http.StatusOK || testid(f, "subagent-status").Text() != subagent.Cancelling || testid(f, "subagent-cancel").Length() != 0 {
		t.Errorf("cancel: %d %s", status, frag)
	}
	if got := testid(f, "subagent-cancelled").Text(); !strings.Contains(got, "operator:ada") {
		t.Errorf("cancelled by %q", got)
	}
	d.holds(`(SELECT count(*) FROM subagents WHERE org = 'acme' AND id = 'sub-run' AND status IN ('cancelling', 'cancelled') AND cancelled_by = 'operator:ada') = 1`)

	// Refusals show their reason in the row, 200 so htmx swaps it.
	status, frag = htmxPost(d, "ada", "/orgs/acme/subagents/sub-run/messages", map[string]string{"body": "still there?"})
	if f = doc(t, "<table><tr>"+frag.String()+"</tr></table>", "/orgs/acme"); status != http.StatusOK || !strings.Contains(testid(f, "subagent-notice").Text(), "being cancelled") {
		t.Errorf("message to a cancelling subagent: %d %s", status, frag)
	}
	status, frag = htmxPost(d, "ada", "/orgs/acme/subagents/sub-done/cancel", nil)
	f = doc(t, "<table><tr>"+frag.String()+"</tr></table>", "/orgs/acme")
	if status != http.StatusOK || !strings.Contains(testid(f, "subagent-notice").Text(), "has ended") || testid(f, "subagent-status").Text() != subagent.Done {
		t.Errorf("cancel of an ended subagent: %d %s", status, frag)
	}
	if class, _ := testid(f, "subagent-notice").Attr("class"); !strings.Contains(class, "error") {
		t.Errorf("a refusal's notice is %q", class)
	}

	// A full mailbox: the reason, and nothing more queued.
	if _, err := d.control.StartSubagent(ctx, subagent.Start{ID: "sub-full", Goal: "busy"}); err != nil {
		t.Fatal(err)
	}
	d.exec(`INSERT INTO subagent_messages (org, subagent_id, sender, body) SELECT 'acme', 'sub-full', 'x', 'y' FROM generate_series(1, $1::int)`, subagent.MaxPending)
	status, frag = htmxPost(d, "ada", "/orgs/acme/subagents/sub-full/messages", map[string]string{"body": "one more"})
	if f = doc(t, "<table><tr>"+frag.String()+"</tr></table>", "/orgs/acme"); status != http.StatusOK || !strings.Contains(testid(f, "subagent-notice").Text(), "mailbox is full") {
		t.Errorf("message to a full mailbox: %d %s", status, frag)
	}
	d.holds(`(SELECT count(*) FROM subagent_messages WHERE org = 'acme' AND subagent_id = 'sub-full') = $1`, subagent.MaxPending)

	// Without htmx, the POST comes back to the page.
	d.as("ada").POST("/orgs/acme/subagents/sub-msg/messages").WithFormField("body", "plain form").
		Expect().Status(http.StatusSeeOther).Header("Location").IsEqual("/orgs/acme/subagents")
	d.holds(`(SELECT count(*) FROM subagent_messages WHERE org = 'acme' AND subagent_id = 'sub-msg' AND body = 'plain form' AND sender = 'operator:ada') = 1`)
}

func TestAnotherOrgsSubagentCannotBeCancelledOrMessagedThroughThisDashboard(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	d := newDash(t, dashOptions{home: acme})
	d.exec(`INSERT INTO subagents (org, id, goal, status) VALUES ('globex', 'sub-globex', 'globex secret goal', 'running')`)
	for _, path := range []string{"/orgs/acme/subagents/sub-globex/cancel", "/orgs/acme/subagents/sub-globex/messages"} {
		status, frag := htmxPost(d, "ada", path, map[string]string{"body": "hello"})
		if status != http.StatusNotFound || strings.Contains(frag.String(), "globex secret") {
			t.Errorf("%s: %d %s", path, status, frag)
		}
		// No assertion: refused before anything is asked of the control API.
		d.anonymous().POST(path).WithFormField("body", "hello").Expect().Status(http.StatusUnauthorized)
	}
	d.holds(`(SELECT count(*) FROM subagents WHERE org = 'globex' AND id = 'sub-globex' AND status = 'running' AND cancelled_by IS NULL) = 1`)
	d.holds(`NOT EXISTS (SELECT 1 FROM subagent_messages)`)
}

func TestTheSubagentsPageSaysWhatToDoWithNone(t *testing.T) {
	other := newOrgHome(t, filepath.Join(t.TempDir(), "orgs"), "initech", 0)
	p := page(t, newDash(t, dashOptions{home: other}).as("ada"), "/orgs/initech/subagents", "/orgs/initech")
	if got := testid(p, "subagents-none").Text(); !strings.Contains(got, "run a job") {
		t.Errorf("empty state %q", got)
	}
}

// The subagents page follows its subagents over the dashboard's live stream: a change to a
// job's subagent made elsewhere (another tab's Cancel, the CLI, the child's own stop)
// arrives as the row, a new subagent as a reload; in a browser the row changes without a
// reload and a message being typed in another row is kept.
// subagentsBrowser is a headless Chromium on a dashboard's subagents page as operator ada,
// its live stream subscribed.
type subagentsBrowser struct {
	ctx    context.Context
	eval   func(js string) string
	poll   func(js string, within time.Duration) error
	errors func() []string
}

func openSubagents(t *testing.T, d *dash) subagentsBrowser {
	t.Helper()
	ctxBrowser, pageErrors := hosttest.Headless(t, 90*time.Second)
	ahead, _ := assertion.NewSigner(dashSecret, func() time.Time { return time.Now().Add(3 * time.Minute) })
	tok, err := ahead.Sign("ada", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctxBrowser, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctxBrowser, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{assertion.Header: tok}}); err != nil {
		t.Fatal(err)
	}
	b := subagentsBrowser{ctx: ctxBrowser, errors: pageErrors}
	b.eval = func(js string) string {
		t.Helper()
		v, err := chromedp.Run(ctxBrowser, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return v
	}
	b.poll = func(js string, within time.Duration) error {
		return chromedp.Do(ctxBrowser, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(within)))
	}
	if err := chromedp.Do(ctxBrowser, chromedp.Navigate(d.srv.URL+"/orgs/acme/subagents"), chromedp.WaitVisible(chromedp.CSS(`[data-testid="subagent"]`))); err != nil {
		t.Fatal(err)
	}
	for d.liveSubscribers() < 1 {
		if err := b.poll(`true`, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// twoRunningSubagents is acme's dashboard with job-1 running and its subagents sub-a and
// sub-b started, each start mirrored as the worker does.
func twoRunningSubagents(t *testing.T) *dash {
	t.Helper()
	acme, _ := twoHomes(t, 0)
	d := newDash(t, dashOptions{home: acme})
	d.exec(`INSERT INTO mirror_jobs (job_id, org, type, status, attempt) VALUES ('job-1', 'acme', 'guidelines', 'RUNNING', 1)`)
	for _, id := range []string{"sub-a", "sub-b"} {
		if _, err := d.control.StartSubagent(context.Background(), subagent.Start{ID: id, JobID: "job-1", Goal: "goal of " + id}); err != nil {
			t.Fatal(err)
		}
		d.mirrorEventData("job-1", "subagent_start", `{"id": "`+id+`"}`)
	}
	return d
}

// rowOf is the JavaScript expression of subagent id's row on the page.
func rowOf(id string) string {
	return `[...document.querySelectorAll('[data-testid="subagent"]')].find(r => r.querySelector('[data-testid="subagent-id"]').textContent === "` + id + `")`
}

func TestTheSubagentsPageFollowsItsSubagentsLive(t *testing.T) {
	d := twoRunningSubagents(t)
	ctx := context.Background()
	p := page(t, d.as("ada"), "/orgs/acme/subagents", "/orgs/acme")
	live := testid(p, "live")
	if live.AttrOr("hx-ext", "") != "sse" || !strings.HasPrefix(live.AttrOr("sse-connect", ""), "/orgs/acme/events") {
		t.Fatalf("the subagents page is not live: %q", live.AttrOr("sse-connect", ""))
	}
	if got := testid(p, "subagent").First().AttrOr("sse-swap", ""); got != templates.LiveSubagentRow("sub-b") && got != templates.LiveSubagentRow("sub-a") {
		t.Fatalf("a row swaps on %q", got)
	}
	if strings.Contains(live.AttrOr("sse-connect", "")+testid(p, "subagent").First().AttrOr("sse-swap", ""), "sub-") {
		t.Fatal("a subagent's id is in an sse attribute")
	}

	b := openSubagents(t, d)
	eval, poll, pageErrors := b.eval, b.poll, b.errors
	eval(`window.stillThisPage = "yes"`)
	// A message half typed into sub-b's row.
	eval(rowOf("sub-b") + `.querySelector('input[name="body"]').value = "half typed"`)

	// Another tab cancels sub-a, and sub-b hears a message: both rows change here.
	if _, err := d.control.CancelSubagent(ctx, "sub-a", "operator:bob", "enough"); err != nil {
		t.Fatal(err)
	}
	if err := poll(rowOf("sub-a")+`.querySelector('[data-testid="subagent-status"]').textContent === "cancelling"`, 5*time.Second); err != nil {
		t.Fatalf("sub-a's row did not change: %v (page errors %v)", err, pageErrors())
	}
	if got := eval(rowOf("sub-a") + `.querySelector('[data-testid="subagent-cancelled"]').textContent`); !strings.Contains(got, "operator:bob") {
		t.Errorf("sub-a's row says cancelled by %q", got)
	}
	if _, err := d.control.SendSubagent(ctx, "sub-b", "operator:bob", "use the 2026 list"); err != nil {
		t.Fatal(err)
	}
	if err := poll(rowOf("sub-b")+`.querySelector('[data-testid="subagent-pending"]').textContent.includes("1 waiting")`, 5*time.Second); err != nil {
		t.Fatalf("sub-b's row did not change: %v", err)
	}
	if got := eval(rowOf("sub-b") + `.querySelector('input[name="body"]').value`); got != "half typed" {
		t.Errorf("the message being typed became %q", got)
	}
	// The child's own stop, as the worker mirrors it.
	if _, err := d.control.StopSubagent(ctx, "sub-b", subagent.Done, "heard: use the 2026 list"); err != nil {
		t.Fatal(err)
	}
	d.mirrorEventData("job-1", "subagent_stop", `{"id": "sub-b", "status": "done"}`)
	if err := poll(rowOf("sub-b")+`.querySelector('[data-testid="subagent-status"]').textContent === "done"`, 5*time.Second); err != nil {
		t.Fatalf("sub-b's row did not end: %v", err)
	}
	if still := eval(`window.stillThisPage || "reloaded"`); still != "yes" {
		t.Fatal("the page reloaded instead of swapping the rows")
	}
	// A new subagent reloads the page, which then lists it.
	if _, err := d.control.StartSubagent(ctx, subagent.Start{ID: "sub-c", JobID: "job-1", Goal: "a third"}); err != nil {
		t.Fatal(err)
	}
	d.mirrorEventData("job-1", "subagent_start", `{"id": "sub-c"}`)
	// The reload navigates: a look during it fails and is made again on the new page.
	for deadline := time.Now().Add(10 * time.Second); ; {
		err := poll(rowOf("sub-c")+` !== undefined`, time.Second)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new subagent was not shown: %v", err)
		}
	}
	if got := eval(`window.stillThisPage || "reloaded"`); got != "reloaded" {
		t.Error("the new subagent appeared without the reload that lists it")
	}
	if errs := pageErrors(); len(errs) > 0 {
		t.Fatalf("the page logged errors: %v", errs)
	}
	// The job's history holds the operator's actions.
	d.holds(`(SELECT count(*) FROM mirror_job_events WHERE job_id = 'job-1' AND kind = 'subagent_cancel' AND data->>'id' = 'sub-a' AND data->>'actor' = 'operator:bob') = 1`)
	d.holds(`(SELECT count(*) FROM mirror_job_events WHERE job_id = 'job-1' AND kind = 'subagent_message' AND data->>'id' = 'sub-b') = 1`)
}

// The answer to Cancel races the live stream: the child may stop, and the stream say so,
// before the answer (the row as the cancel left it, "cancelling") reaches the browser. The
// older answer must not overwrite the newer row, and a row an answer was swapped into
// still follows the stream.
func TestAnAnswerOlderThanItsRowsLiveUpdateDoesNotOverwriteIt(t *testing.T) {
	d := twoRunningSubagents(t)
	ctx := context.Background()
	b := openSubagents(t, d)
	status := func(id string) string {
		return b.eval(rowOf(id) + `.querySelector('[data-testid="subagent-status"]').textContent`)
	}
	// The browser holds the answers to cancels until the test lets them go.
	paused := make(chan fetch.RequestID, 4)
	if err := chromedp.Listen(b.ctx, func(ev any) {
		if e, ok := ev.(*fetch.EventRequestPaused); ok {
			select {
			case paused <- e.RequestID:
			default:
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(b.ctx, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*/cancel", RequestStage: fetch.RequestStageResponse}}}); err != nil {
		t.Fatal(err)
	}
	// An answer reaches the row as htmx:beforeSwap, whose handlers decide whether it is
	// swapped; the swap (if any) is done before the next task. (htmx:afterRequest fires on
	// the form that posted, which the newer row no longer holds.)
	b.eval(`document.addEventListener("htmx:beforeSwap", () => setTimeout(() => { window.answered = (window.answered || 0) + 1 })); "listening"`)

	b.eval(rowOf("sub-a") + `.querySelector('[data-testid="subagent-cancel"] button').click(); "clicked"`)
	var held fetch.RequestID
	select {
	case held = <-paused:
	case <-time.After(20 * time.Second):
		t.Fatal("the Cancel was not posted")
	}
	// The cancel is made: its answer, held, says "cancelling". The child stops, and the
	// worker's event of it reaches the page first.
	d.holds(`(SELECT status FROM subagents WHERE id = 'sub-a') = 'cancelling'`)
	if _, err := d.control.StopSubagent(ctx, "sub-a", subagent.Done, "stopped at its mailbox read"); err != nil {
		t.Fatal(err)
	}
	d.mirrorEventData("job-1", "subagent_stop", `{"id": "sub-a", "status": "cancelled"}`)
	if err := b.poll(rowOf("sub-a")+`.querySelector('[data-testid="subagent-status"]').textContent === "cancelled"`, 10*time.Second); err != nil {
		t.Fatalf("sub-a's row did not follow its stop: %v (it says %q)", err, status("sub-a"))
	}
	if _, err := chromedp.Call(b.ctx, fetch.ContinueResponse, fetch.ContinueResponseParams{RequestID: held}); err != nil {
		t.Fatal(err)
	}
	if err := b.poll(`window.answered >= 1`, 10*time.Second); err != nil {
		t.Fatalf("the answer to Cancel was not handled: %v", err)
	}
	if got := status("sub-a"); got != "cancelled" {
		t.Fatalf("the late answer to Cancel overwrote the row's newer state: it says %q, not cancelled", got)
	}
	if got := b.eval(rowOf("sub-a") + `.querySelector('[data-testid="subagent-cancelled"]').textContent`); !strings.Contains(got, "operator:ada") {
		t.Errorf("sub-a's row says cancelled %q", got)
	}

	// An answer that is not older is swapped in: a message to sub-b from its row, whose
	// answer says it is waiting; the row, the same element, then follows sub-b's stop. The
	// stream's update for the message (the same version, no notice) may come before or
	// after the answer, so the notice is read as the answer is swapped in.
	b.eval(`document.addEventListener("htmx:afterSwap", e => { const n = e.target.querySelector && e.target.querySelector('[data-testid="subagent-notice"]'); if (n) window.notice = n.textContent }); "listening"`)
	b.eval(rowOf("sub-b") + `.querySelector('input[name="body"]').value = "use the 2026 list"`)
	b.eval(rowOf("sub-b") + `.querySelector('[data-testid="subagent-send"] button').click(); "sent"`)
	if err := b.poll(`(window.notice || "").startsWith("Message queued")`, 10*time.Second); err != nil {
		t.Fatalf("the answer to Send message was not swapped in: %v (notice %q)", err, b.eval(`String(window.notice)`))
	}
	if got := b.eval(rowOf("sub-b") + `.querySelector('[data-testid="subagent-pending"]').textContent`); !strings.Contains(got, "1 waiting") {
		t.Errorf("sub-b's row says %q waiting", got)
	}
	if _, err := d.control.StopSubagent(ctx, "sub-b", subagent.Done, "heard: use the 2026 list"); err != nil {
		t.Fatal(err)
	}
	d.mirrorEventData("job-1", "subagent_stop", `{"id": "sub-b", "status": "done"}`)
	if err := b.poll(rowOf("sub-b")+`.querySelector('[data-testid="subagent-status"]').textContent === "done"`, 10*time.Second); err != nil {
		t.Fatalf("sub-b's row did not follow its stop after an answer was swapped into it: %v (it says %q)", err, status("sub-b"))
	}
	if errs := b.errors(); len(errs) > 0 {
		t.Fatalf("the page logged errors: %v", errs)
	}
}
