package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"hermeshost/internal/hosttest"
	"hermeshost/scriptedagent"
)

// An operator's round through the real product in a real browser (issue #18): `hermes-host
// dev` on the process runtime, claiming, and Chromium typing and clicking as a person does.
// The operator logs in at the launcher, opens acme's dashboard (the launcher's starting page
// until it answers), cancels a running subagent and sees its row change in place, watches
// the guidelines job's progress advance live, force-releases the home: lease that job
// holds, and chats with the org's agent until the answer shows; the page logs no error on
// the way. A full-page screenshot of each step lands in test-artifacts/browser/ at the
// repository's root.
//
// The order follows the demo jobs: acme's product ingest is claimed first (the dispatcher
// polls that type first) and its agent delegates a subagent that works until cancelled, so
// the guidelines job, one at a time per home, starts only after the cancel; the chat turn
// needs the home: lease the job holds, so it comes after the force release.
func TestAnOperatorWorksTheDashboardsInABrowser(t *testing.T) {
	const step = 3000 // ms per write of the scripted agent: the guidelines job's five categories take 15 s
	orgs := t.TempDir()
	knobs := func(org string, k scriptedagent.Knobs) {
		t.Helper()
		writeKnobs(t, filepath.Join(orgs, org), k) // the home's owner's, as its units run
	}
	// dev keeps a knobs file it finds: acme's first agent (the product ingest's) delegates a
	// researcher that works until it is cancelled; globex's jobs run at full speed, out of
	// the way.
	const goal = "Collect what the sources say about the brand's voice"
	knobs("acme", scriptedagent.Knobs{StepMS: step, Subagents: []scriptedagent.SubagentKnob{{Goal: goal, Role: "researcher", WaitMS: 600_000}}})
	knobs("globex", scriptedagent.Knobs{})
	dev := startDev(t, orgs, "HERMES_RUNTIME=process", "DOCKER_HOST=unix:///nonexistent/docker.sock",
		"CLAIM_ENABLED=true", "POLL_INTERVAL=1s")
	began := time.Now()

	ctx, pageErrors := hosttest.Headless(t, 2*time.Minute)
	shots := browserArtifacts(t)
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() && ctx.Err() == nil {
			if png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
				_ = os.WriteFile(filepath.Join(shots, "failed.png"), png, 0o644)
			}
		}
	})
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// eval runs js in the page; js reads what it needs in one go, since htmx may swap a
	// node out between two protocol calls.
	eval := func(js string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return s
	}
	// await polls js (a string expression, "" for not yet) until it is not empty, through
	// navigations (an evaluation in a page that is going away fails, and is tried again).
	// until evaluates js until ok holds of its value, and fails naming the last it gave.
	until := func(what string, within time.Duration, js string, ok func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			s, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
			if err == nil && ok(s) {
				return s
			}
			if ctx.Err() != nil || time.Now().After(deadline) {
				// How the page it is on was loaded: "reload" says the page reloaded itself
				// (a live stream's reload), which cancels a navigation it was making.
				t.Fatalf("%s: not within %s (last: %q, %v) at %s", what, within, s, err,
					eval(`location.href + " (loaded by " + ((performance.getEntriesByType("navigation")[0] || {}).type || "?") + ")"`))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	await := func(what string, within time.Duration, js string) string {
		t.Helper()
		return until(what, within, js, func(s string) bool { return s != "" })
	}
	text := func(sel string) string {
		q, _ := json.Marshal(sel)
		return `((document.querySelector(` + string(q) + `) || {}).textContent || "").trim()`
	}
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	// at waits until the browser is on a page whose path (and query) starts with path, loaded,
	// htmx started: a click that navigates returns before the next page is there, and a
	// form clicked before htmx has started posts the page instead.
	at := func(path string) {
		t.Helper()
		p, _ := json.Marshal(path)
		await("the page "+path, 30*time.Second, `(location.pathname + location.search).startsWith(`+string(p)+`) &&
			document.readyState === "complete" && typeof htmx !== "undefined" ? "yes" : ""`)
	}

	// 1. The launcher's login form, typed into and sent; the index lists acme.
	do("open the launcher",
		// Wide enough for the dashboards' tables, so the screenshots show them whole.
		chromedp.EmulateViewport(1280, 800),
		chromedp.Navigate(dev.launcher+"/"),
		chromedp.WaitVisible(css(`[data-testid="login-form"]`)),
		chromedp.SendKeys(chromedp.ID("name"), dev.login[0]),
		chromedp.SendKeys(chromedp.ID("password"), dev.login[1]),
	)
	shot("01-login")
	do("log in",
		chromedp.Click(css(`[data-testid="login-submit"]`)),
		chromedp.WaitVisible(css(`[data-testid="open-acme"]`)),
	)
	if got := eval(text(`[data-testid="operator"]`)); got != dev.login[0] {
		t.Fatalf("logged in as %q, want %q", got, dev.login[0])
	}
	shot("02-index")

	// 2. Open: the launcher's starting page reloads itself until the dashboard answers.
	do("open acme's dashboard", chromedp.Click(css(`[data-testid="open-acme"]`)))
	// The starting page loads no htmx; the dashboard's pages do.
	await("acme's dashboard", 90*time.Second, `document.querySelector('[data-testid="nav"]') && document.readyState === "complete" &&
		typeof htmx !== "undefined" ? `+text(`[data-testid="dashboard-org"]`)+` : ""`)
	if got := eval(text(`[data-testid="dashboard-org"]`)); got != "acme" {
		t.Fatalf("the dashboard is of %q", got)
	}
	if got := eval(`location.pathname`); got != "/orgs/acme/" {
		t.Fatalf("the dashboard is at %q", got)
	}
	shot("03-dashboard")

	// 3. Subagents: the product ingest's researcher, running, is cancelled in place; the
	// live feed then brings its end into the row.
	do("open the subagents page", chromedp.Click(css(`[data-testid="nav-subagents"]`)))
	at("/orgs/acme/subagents")
	// A subagent that starts after the page was served reloads it.
	sub := strings.Split(await("a running subagent with a Cancel button", 30*time.Second, `Array.from(document.querySelectorAll('[data-testid="subagent"]')).filter(r =>
		r.querySelector('[data-testid="subagent-status"]').textContent.trim() === "running" &&
		r.querySelector('[data-testid="subagent-cancel"]')).map(r => r.querySelector('[data-testid="subagent-id"]').textContent.trim() + "|" +
		r.querySelector('[data-testid="subagent-goal"]').textContent.trim()).join("\n")`), "\n")
	if len(sub) != 1 || !strings.HasSuffix(sub[0], "|"+goal) {
		t.Fatalf("the running subagents: %q, want the one researcher", sub)
	}
	id := strings.SplitN(sub[0], "|", 2)[0]
	at("/orgs/acme/subagents")
	// Its agent has read the knobs; the guidelines job's agent, which starts once this job
	// is done, delegates nothing, and a chat turn takes a few seconds (three steps), so its
	// page has something to follow.
	knobs("acme", scriptedagent.Knobs{StepMS: step, ChatStepMS: 2000})
	eval(`String(window.__noReload = 1)`)
	// The row's status, notice and who cancelled it.
	row := `(() => { const r = Array.from(document.querySelectorAll('[data-testid="subagent"]')).find(r =>
		r.querySelector('[data-testid="subagent-id"]').textContent.trim() === ` + strconv.Quote(id) + `);
		return r ? r.querySelector('[data-testid="subagent-status"]').textContent.trim() + "|" +
			((r.querySelector('[data-testid="subagent-notice"]') || {}).textContent || "").trim() + "|" +
			((r.querySelector('[data-testid="subagent-cancelled"]') || {}).textContent || "").trim() : "" })()`
	// It is the one running, so its Cancel is the page's only one.
	do("click Cancel", chromedp.Click(css(`[data-testid="subagent-cancel"] button`)))
	got := strings.Split(until("the row after Cancel", 15*time.Second, row, func(s string) bool { return s != "" && !strings.HasPrefix(s, "running|") }), "|")
	// The answer to Cancel is the row with a notice; a live update of the row (the cancel
	// noted, the child stopping) may have replaced it already, without one.
	stopping := got[0] == "cancelling" || got[0] == "cancelled"
	noticed := got[1] == "" || strings.HasPrefix(got[1], "Cancel")
	if !stopping || !noticed || got[2] != "by operator:"+dev.login[0]+": cancelled from the dashboard" {
		t.Fatalf("the row after Cancel says %q", got)
	}
	if n := eval(`String(document.querySelectorAll('[data-testid="subagent-cancel"]').length)`); n != "0" {
		t.Fatalf("%s Cancel buttons remain", n)
	}
	// The child stops at its next step (one write's time): the row follows.
	until("the subagent's end in its row", 20*time.Second, row, func(s string) bool { return strings.HasPrefix(s, "cancelled|") })
	if eval(`String(window.__noReload)`) != "1" {
		t.Fatal("the page was reloaded instead of its row swapped")
	}
	shot("04-subagent-cancelled")

	// 4. Jobs: the guidelines job, claimed once the ingest is done, and its page's progress
	// advancing as the agent persists categories, without a reload.
	do("open the jobs page", chromedp.Click(css(`[data-testid="nav-jobs"]`)))
	at("/orgs/acme/jobs")
	guidelines := `Array.from(document.querySelectorAll('[data-testid="job"]')).filter(r =>
		r.querySelector('[data-testid="job-type"]').textContent.trim() === "guidelines_extraction" &&
		r.querySelector('[data-testid="job-status"]').textContent.trim() === "RUNNING").map(r =>
		r.querySelector('[data-testid="job-link"]').getAttribute("href"))[0] || ""`
	link := await("a running guidelines job on the jobs page", 45*time.Second, guidelines)
	// Clicked from the page itself: the live feed swaps the job's row as its agent persists,
	// and a node found by one protocol call may be gone at the next.
	if got := eval(`(() => { const a = document.querySelector('[data-testid="job-link"][href=` + strconv.Quote(link) + `]');
		if (!a) return "gone"; a.click(); return "clicked" })()`); got != "clicked" {
		t.Fatalf("the guidelines job's link: %s", got)
	}
	at(link)
	eval(`String(window.__noReload = 2)`)
	// The bar, and the count its section states.
	progress := `(() => { const b = document.querySelector('[data-testid="job-progress-bar"]');
		if (!b) return "";
		return [b.getAttribute("value") || "", b.getAttribute("max") || "", ` + text(`[data-testid="job-progress-text"]`) + `].join("|") })()`
	persisted := func(p string) (int, []string) {
		t.Helper()
		f := strings.SplitN(p, "|", 3)
		m := regexp.MustCompile(`^(\d+) `).FindStringSubmatch(f[2])
		if m == nil {
			t.Fatalf("the progress reads %q", p)
		}
		n, _ := strconv.Atoi(m[1])
		if f[0] != m[1] {
			t.Fatalf("the bar's value %q is not the %d categories its text states", f[0], n)
		}
		return n, f
	}
	first, bar := persisted(await("the job's progress", 20*time.Second, progress))
	second, bar2 := persisted(await("the progress advancing", 20*time.Second,
		`(() => { const p = `+progress+`; const m = p.split("|")[2].match(/^(\d+) /); return m && +m[1] > `+strconv.Itoa(first)+` ? p : "" })()`))
	if second <= first {
		t.Fatalf("the progress went from %d to %d", first, second)
	}
	if eval(`String(window.__noReload)`) != "2" {
		t.Fatal("the job's page was reloaded rather than updated in place")
	}
	// The bar counts to the manifest's categories, which the worker's events state.
	if bar[1] == "" || bar[1] != bar2[1] || bar2[0] != strconv.Itoa(second) {
		t.Fatalf("the progress bar has no total, or did not advance with the count: %q then %q", bar, bar2)
	}
	t.Logf("the guidelines job's progress went from %d to %d categories in place", first, second)
	jobID := eval(text(`[data-testid="job-id"]`))
	shot("05-job-progress")

	// 5. Leases: the home: lease that job's worker holds, force-released with a reason.
	do("open the leases page", chromedp.Click(css(`[data-testid="nav-leases"]`)))
	at("/orgs/acme/leases")
	home := `(() => { const r = Array.from(document.querySelectorAll('[data-testid="lease"]')).find(r =>
		r.querySelector('[data-testid="lease-key"]').textContent.trim() === "home:acme");
		return r && r.querySelector('[data-testid="lease-force-release"]') ?
			r.querySelector('[data-testid="lease-holder"]').textContent.trim() + "|" + r.querySelector('[data-testid="lease-epoch"]').textContent.trim() : "" })()`
	held := strings.Split(await("home:acme held on the leases page", 10*time.Second, home), "|")
	const reason = "browser test: the operator takes the home back"
	// The table is live (a refresh of any lease swaps it): the link is found and clicked
	// from the page in one evaluation, as the guidelines job's is (a node found by one
	// protocol call may be gone at the next, and a click at its place then lands on nothing:
	// CI's run stayed on the leases page).
	if got := eval(`(() => { const r = Array.from(document.querySelectorAll('[data-testid="lease"]')).find(r =>
		r.querySelector('[data-testid="lease-key"]').textContent.trim() === "home:acme");
		const a = r && r.querySelector('[data-testid="lease-force-release"]');
		if (!a) return "gone"; a.click(); return "clicked" })()`); got != "clicked" {
		t.Fatalf("ask to force release home:acme: its link is %s", got)
	}
	at("/orgs/acme/leases?confirm=")
	if got := eval(text(`[data-testid="force-release-key"]`)); got != "home:acme" {
		t.Fatalf("the confirmation is for %q", got)
	}
	do("force release home:acme",
		chromedp.SendKeys(css(`[data-testid="force-release-reason"]`), reason),
		chromedp.Click(css(`[data-testid="force-release-form"] button[type="submit"]`)),
	)
	at("/orgs/acme/leases?released=")
	notice := eval(text(`[data-testid="leases-notice"]`))
	if !strings.HasPrefix(notice, "Released home:acme by force ("+held[0]+" lost it)") {
		t.Fatalf("after the force release the page says %q (the holder was %q)", notice, held[0])
	}
	// home:acme's epoch now, and its force release among its newest events.
	released := `(() => { const r = Array.from(document.querySelectorAll('[data-testid="lease"]')).find(r =>
		r.querySelector('[data-testid="lease-key"]').textContent.trim() === "home:acme");
		if (!r) return "";
		const e = Array.from(r.querySelectorAll('[data-testid="lease-event"]')).find(e =>
			e.querySelector('[data-testid="lease-event-kind"]').textContent.trim() === "force_release");
		return [r.querySelector('[data-testid="lease-epoch"]').textContent.trim(), e ? [
			(e.querySelector('[data-testid="lease-event-actor"]') || {}).textContent || "",
			(e.querySelector('[data-testid="lease-event-reason"]') || {}).textContent || ""].join("|") : "no force release"].join("|") })()`
	// The table is live: it may be swapped as it is read.
	after := strings.SplitN(await("home:acme on the leases page", 10*time.Second, released), "|", 2)
	if want := "operator:" + dev.login[0] + "|" + reason; len(after) != 2 || after[1] != want {
		t.Fatalf("home:acme's force release reads %q, want %q", after, want)
	}
	before, err1 := strconv.Atoi(held[1])
	now, err2 := strconv.Atoi(after[0])
	if err1 != nil || err2 != nil || now <= before {
		t.Fatalf("home:acme's epoch did not move on: %s, then %s", held[1], after[0])
	}
	t.Logf("force-released home:acme from %s (epoch %d, now %d), job %s", held[0], before, now, jobID)
	shot("06-lease-released")

	// 6. Chat: a message sent from the form; the turn page, served while the turn runs,
	// shows the session's rows and the agent's answer as they come, without a reload.
	const message = "What ships on Tuesdays?"
	do("open the chat page", chromedp.Click(css(`[data-testid="nav-chat"]`)))
	at("/orgs/acme/chat")
	do("send a chat message",
		chromedp.SendKeys(css(`[data-testid="chat-message"]`), message),
		chromedp.Click(css(`[data-testid="chat-send"]`)),
	)
	at("/orgs/acme/chat/turns/")
	if got := eval(text(`[data-testid="chat-sent"]`)); got != message {
		t.Fatalf("the turn page quotes %q", got)
	}
	if a := eval(text(`[data-testid="chat-answer"]`)); a != "" {
		t.Fatalf("the turn had ended before its page was served (%q): nothing left to follow in place", a)
	}
	eval(`String(window.__noReload = 3)`)
	end := await("the chat turn's end", 60*time.Second, `(() => {
		const a = `+text(`[data-testid="chat-answer"]`)+`, s = `+text(`[data-testid="chat-state"]`)+`;
		return a ? "answer|" + a : /failed|stopped/.test(s) ? s + "|" + `+text(`[data-testid="chat-reason"]`)+` : "" })()`)
	if !strings.HasPrefix(end, "answer|") || !strings.Contains(end, "demo reply") {
		t.Fatalf("the chat turn ended without the model's answer: %q", end)
	}
	if eval(`String(window.__noReload)`) != "3" {
		t.Fatal("the turn page was reloaded rather than updated in place")
	}
	// The session's rows as the agent wrote them: the message, its tool call and result, the answer.
	if got := eval(`Array.from(document.querySelectorAll('[data-testid="chat-messages"] [data-testid="message"]')).map(m => m.dataset.role).join(",")`); got != "user,assistant,tool,assistant" {
		t.Fatalf("the turn page shows the rows %q", got)
	}
	shot("07-chat-reply")

	// 7. Nothing went wrong in the page on the way. The starting page is served with 503
	// until the dashboard answers, which Chromium logs as a failed load of that address.
	starting := regexp.MustCompile(`^Failed to load resource: the server responded with a status of 503 \(Service Unavailable\) ` +
		regexp.QuoteMeta(dev.launcher) + `/orgs/acme/$`)
	startingPages := 0
	for _, e := range pageErrors() {
		if !starting.MatchString(e) {
			t.Errorf("the page logged an error: %s", e)
		} else {
			startingPages++
		}
	}
	t.Logf("the launcher's starting page was shown %d times before the dashboard answered", startingPages)
	t.Logf("the round took %s after dev came up; screenshots in %s", time.Since(began).Round(time.Second), shots)
}

// browserArtifacts is test-artifacts/browser/ at the module's root (the README names it),
// emptied of an earlier run's screenshots.
func browserArtifacts(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
	dir = filepath.Join(dir, "test-artifacts", "browser")
	old, _ := filepath.Glob(filepath.Join(dir, "*.png"))
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
