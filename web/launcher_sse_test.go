package web_test

import (
	"bufio"
	"context"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"
	"time"

	"github.com/gavv/httpexpect/v2"

	"hermeshost/web"
)

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

	// Written as the dispatcher's mirror writes it, notifying the control API's waiters on
	// its schema's channel (its poll, within a second, would find it too).
	p.dash.exec(`INSERT INTO mirror_jobs (job_id, org, type, status, attempt) VALUES ('job-1', 'acme', 'sync', 'CLAIMED', 1)`)
	p.dash.exec(`
WITH ins AS (INSERT INTO mirror_job_events (job_id, attempt, kind, data) VALUES ('job-1', 1, 'claim', '{}') RETURNING id)
SELECT pg_notify('hermes_mirror_' || left(current_setting('search_path'), 40), 'acme') FROM ins`)
	await("job row", func(l string) bool { return strings.HasPrefix(l, "event: jobrow-") }, 3*time.Second)
	await("its id", func(l string) bool { return strings.HasPrefix(l, "id: ") }, time.Second)
}
