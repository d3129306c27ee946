package web_test

import (
	"bufio"
	"context"
	"net/http"
	"net/http/cookiejar"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/gavv/httpexpect/v2"

	"hermeshost/assertion"
	"hermeshost/internal/hosttest"
	"hermeshost/web"
)

// liveSubscribers is how many streams the dashboard's live feed holds, from its metrics.
func (d *dash) liveSubscribers() int { return d.metric("hermes_dashboard_live_subscribers") }

// metric is the value of the dashboard's unlabelled metric name, 0 when it has none.
func (d *dash) metric(name string) int {
	d.t.Helper()
	body := d.anonymous().GET("/metrics").Expect().Status(http.StatusOK).Body().Raw()
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// mirrorEvent writes an event of job as the dispatcher's mirror does, notifying the control
// API's waiters on its schema's channel (their poll, within a second, would find it too).
func (d *dash) mirrorEvent(job, kind string) {
	d.t.Helper()
	d.mirrorEventData(job, kind, "{}")
}

// mirrorEventData is mirrorEvent with data, JSON.
func (d *dash) mirrorEventData(job, kind, data string) {
	d.t.Helper()
	d.exec(`
WITH ins AS (INSERT INTO mirror_job_events (job_id, attempt, kind, data) VALUES ($1, 1, $2, $3::jsonb) RETURNING id)
SELECT pg_notify('hermes_mirror_' || left(current_setting('search_path'), 40), 'acme') FROM ins`, job, kind, data)
}

// Through the launcher's proxy the dashboard's event stream arrives as it is written: its
// first comment while the stream is still open, then a mirror event, each line as it comes.
func TestTheProxyPassesTheEventStreamUnbuffered(t *testing.T) {
	p := newProxied(t, dashSecret)
	p.running("acme", p.dash.srv.URL)
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Transport: p.srv.Client().Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	e := httpexpect.WithConfig(httpexpect.Config{BaseURL: p.srv.URL, Reporter: httpexpect.NewAssertReporter(t), Client: client})
	login(e, "ada", password).Status(http.StatusSeeOther)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.srv.URL+"/orgs/acme/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" ||
		resp.Header.Get("Content-Security-Policy") != web.ContentSecurityPolicy {
		t.Fatalf("through the proxy: %d %v", resp.StatusCode, resp.Header)
	}
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		r := bufio.NewReader(resp.Body)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			lines <- strings.TrimSuffix(line, "\n")
		}
	}()
	await := func(what string, ok func(string) bool, within time.Duration) {
		t.Helper()
		deadline := time.After(within)
		for {
			select {
			case line, open := <-lines:
				if !open {
					t.Fatalf("the stream ended before %s", what)
				}
				if ok(line) {
					return
				}
			case <-deadline:
				t.Fatalf("no %s through the proxy within %s", what, within)
			}
		}
	}
	await("live comment", func(l string) bool { return l == ": live" }, 5*time.Second)

	p.dash.exec(`INSERT INTO mirror_jobs (job_id, org, type, status, attempt) VALUES ('job-1', 'acme', 'sync', 'CLAIMED', 1)`)
	p.dash.mirrorEvent("job-1", "claim")
	await("job row", func(l string) bool { return strings.HasPrefix(l, "event: jobrow-") }, 3*time.Second)
	await("its id", func(l string) bool { return strings.HasPrefix(l, "id: ") }, time.Second)
}

// In a browser, the jobs page's row and a job's page follow the job without a reload: htmx's
// SSE extension loads from the static files under the CSP, connects to <prefix>/events and
// swaps what the stream sends.
func TestTheJobsPagesFollowAJobLiveInABrowser(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	d := newDash(t, dashOptions{home: acme})
	d.exec(`INSERT INTO mirror_jobs (job_id, org, type, status, attempt) VALUES ('job-1', 'acme', 'guidelines', 'CLAIMED', 1)`)
	d.mirrorEvent("job-1", "claim")
	ctx, pageErrors := hosttest.Headless(t, 90*time.Second)
	ahead, _ := assertion.NewSigner(dashSecret, func() time.Time { return time.Now().Add(3 * time.Minute) })
	tok, err := ahead.Sign("ada", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{assertion.Header: tok}}); err != nil {
		t.Fatal(err)
	}
	eval := func(js string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return v
	}
	poll := func(js string, within time.Duration) error {
		return chromedp.Do(ctx, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(within)))
	}
	status := `document.querySelector('[data-testid="job-status"]').textContent`
	for _, page := range []string{"/orgs/acme/jobs", "/orgs/acme/jobs/job-1"} {
		err = chromedp.Do(ctx,
			chromedp.Navigate(d.srv.URL+page),
			chromedp.WaitVisible(chromedp.CSS(`[data-testid="job-status"]`)),
		)
		if err != nil {
			t.Fatal(err)
		}
		eval(`window.stillThisPage = "yes"`)
		// The stream is open once the dashboard counts a subscriber; an event written
		// before would be replayed anyway from the page's ?after=.
		for d.liveSubscribers() < 1 {
			// A round trip to the page between looks (failing once the test's time is up).
			if err := poll(`true`, time.Second); err != nil {
				t.Fatal(err)
			}
		}
		s := eval(status)
		next := map[string]string{"CLAIMED": "RUNNING", "RUNNING": "COMPLETED"}[s]
		if next == "" {
			t.Fatalf("%s: status %q", page, s)
		}
		d.exec(`UPDATE mirror_jobs SET status = $1, updated_at = now() WHERE job_id = 'job-1'`, next)
		d.mirrorEvent("job-1", "progress")
		if err := poll(status+` === "`+next+`"`, 5*time.Second); err != nil {
			t.Fatalf("%s: the status is %q, not %s: %v (page errors %v)", page, eval(status), next, err, pageErrors())
		}
		if still := eval(`window.stillThisPage || "reloaded"`); still != "yes" {
			t.Fatalf("%s: the page reloaded instead of swapping", page)
		}
		if page == "/orgs/acme/jobs/job-1" {
			if err := poll(`document.querySelectorAll('[data-testid="job-event-kind"]').length === 3`, 5*time.Second); err != nil {
				t.Fatalf("the job's new event was not appended: %v", err)
			}
		}
	}
	if errs := pageErrors(); len(errs) > 0 {
		t.Fatalf("the page logged errors: %v", errs)
	}
}
