package web

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"

	"hermeshost/assertion"
	"hermeshost/control"
	"hermeshost/internal/testio"
	"hermeshost/lease"
	"hermeshost/mirror"
	"hermeshost/orghome"
	"hermeshost/pg/pgtest"
	"hermeshost/service"
	"hermeshost/subagent"
	"hermeshost/templates"
)

const liveDashSecret = "live-dashboard-assertion-secret-0123456789"

// countingTransport is a test instrument: it counts the dashboard's requests for the
// control API's job events, so a test sees how many long-polls the tabs cost, and fails
// the requests for a path it is told to refuse, as a control API that does not answer.
type countingTransport struct {
	next   http.RoundTripper
	events atomic.Int64
	refuse atomic.Pointer[string]
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/v1/jobs/events" {
		c.events.Add(1)
	}
	if p := c.refuse.Load(); p != nil && r.URL.Path == *p {
		return nil, errors.New("refused by the test: the control API does not answer for " + *p)
	}
	return c.next.RoundTrip(r)
}

// liveDash is acme's dashboard served directly, with the real control API over a fresh
// schema and the mirror store that writes its events.
type liveDash struct {
	t       *testing.T
	srv     *httptest.Server
	mirror  *mirror.Store
	leases  *lease.Store
	counter *countingTransport
	signer  *assertion.Signer
}

func newLiveDash(t *testing.T) *liveDash {
	t.Helper()
	_, pool := pgtest.Schema(t)
	store := mirror.New(pool, mirror.Options{})
	t.Cleanup(store.Close)
	leases := lease.New(pool, lease.Options{})
	t.Cleanup(leases.Close)
	subs := subagent.New(pool, subagent.Options{})
	t.Cleanup(subs.Close)
	secret := service.Secret("control-secret-for-live-tests")
	cs, err := control.NewServer(control.Config{DB: pool, Mirror: store, Leases: leases, Subagents: subs, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	csrv := httptest.NewServer(cs.Handler())
	t.Cleanup(csrv.Close)
	key, err := control.Key(secret, "acme")
	if err != nil {
		t.Fatal(err)
	}
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	counter := &countingTransport{next: transport}
	client, err := control.NewClient(csrv.URL, key, &http.Client{Transport: counter})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "acme")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	home, err := orghome.OpenHome("acme", dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { home.Close() })
	akey, err := assertion.OrgKey(liveDashSecret, "acme")
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewDashboard(service.NewOps(slog.New(slog.DiscardHandler)), DashboardConfig{
		Org: "acme", Home: home, AssertionKey: service.Secret(akey), Control: client, GatewayURL: "http://127.0.0.1:1",
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	signer, err := assertion.NewSigner(liveDashSecret, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &liveDash{t: t, srv: srv, mirror: store, leases: leases, counter: counter, signer: signer}
}

// event mirrors a claim of job (its first event) or one of its progress events.
func (d *liveDash) event(job, kind string, data any) int64 {
	d.t.Helper()
	ctx := context.Background()
	if kind == "claim" {
		id, err := d.mirror.Claimed(ctx, nil, mirror.Claim{JobID: job, Org: "acme", Type: "guidelines", Attempt: 1, Kind: "claim", Data: data})
		if err != nil {
			d.t.Fatal(err)
		}
		return id
	}
	id, err := d.mirror.Event(ctx, nil, "acme", job, 1, kind, data)
	if err != nil {
		d.t.Fatal(err)
	}
	return id
}

// sseMessage is one message of the stream; a comment has only Comment.
type sseMessage = testio.SSEMessage

// stream is one open <prefix>/events, its messages read into a channel.
type stream struct {
	t    *testing.T
	body io.ReadCloser
	msgs chan sseMessage
}

// open connects to the stream (lastID "" sends no Last-Event-ID) and waits for the stream
// to say it is live; read says whether anything reads it after that.
func (d *liveDash) open(lastID string, read bool) *stream {
	d.t.Helper()
	return d.openAt("/orgs/acme/events", lastID, read)
}

// openAt is open of the stream at target (a page's sse-connect: path and query).
func (d *liveDash) openAt(target, lastID string, read bool) *stream {
	d.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.srv.URL+target, nil)
	if err != nil {
		d.t.Fatal(err)
	}
	tok, err := d.signer.Sign("ada", "acme")
	if err != nil {
		d.t.Fatal(err)
	}
	req.Header.Set(assertion.Header, tok)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := d.srv.Client().Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		d.t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	s := &stream{t: d.t, body: resp.Body, msgs: make(chan sseMessage, 1024)}
	d.t.Cleanup(func() { cancel(); resp.Body.Close() })
	live := make(chan struct{})
	go func() {
		defer close(s.msgs)
		testio.ReadSSE(resp.Body, func(m sseMessage) bool {
			if m.Comment == "live" {
				close(live)
				if !read {
					return false // and nothing reads the connection any more
				}
			}
			s.msgs <- m
			return true
		})
	}()
	select {
	case <-live:
	case <-time.After(5 * time.Second):
		d.t.Fatal("the stream did not go live")
	}
	return s
}

// until reads messages until one satisfies ok, within a second.
func (s *stream) until(what string, ok func(sseMessage) bool) []sseMessage {
	s.t.Helper()
	var got []sseMessage
	deadline := time.After(time.Second)
	for {
		select {
		case m, open := <-s.msgs:
			if !open {
				s.t.Fatalf("the stream ended before %s; got %+v", what, got)
			}
			got = append(got, m)
			if ok(m) {
				return got
			}
		case <-deadline:
			s.t.Fatalf("no %s within a second; got %+v", what, got)
		}
	}
}

func withID(id int64) func(sseMessage) bool {
	return func(m sseMessage) bool { return m.ID == strconv.FormatInt(id, 10) }
}

func TestLiveStreamCarriesAMirrorEventWithinASecond(t *testing.T) {
	d := newLiveDash(t)
	s := d.open("", true)
	claim := d.event("job-1", "claim", map[string]string{"instance": "i1"})
	got := s.until("the claim", withID(claim))
	events := map[string]sseMessage{}
	for _, m := range got {
		events[strings.SplitN(m.Event, "-", 2)[0]] = m
	}
	if !strings.Contains(events["jobevents"].Data, `data-testid="job-event"`) || !strings.Contains(events["jobevents"].Data, "claim") {
		t.Errorf("event row: %+v", events["jobevents"])
	}
	if !strings.Contains(events["jobrow"].Data, "job-1") || !strings.Contains(events["jobrow"].Data, "CLAIMED") {
		t.Errorf("job row: %+v", events["jobrow"])
	}
	if _, ok := events["jobs"]; !ok {
		t.Errorf("a claim sends jobs: %+v", got)
	}
	// Only the last fragment of an id carries it, so a cut connection replays them all.
	for _, m := range got[:len(got)-1] {
		if m.ID != "" {
			t.Errorf("an id before the last fragment: %+v", m)
		}
	}

	// Progress with a total: the job's head carries the bar.
	p := d.event("job-1", "progress", map[string]any{"persisted": []string{"a", "b"}, "total": 4})
	got = s.until("the progress", withID(p))
	head := got[len(got)-1]
	if !strings.HasPrefix(head.Event, "jobhead-") || !strings.Contains(head.Data, `value="2"`) || !strings.Contains(head.Data, `max="4"`) {
		t.Errorf("head: %+v", head)
	}
}

func TestLiveStreamResumesAfterLastEventID(t *testing.T) {
	d := newLiveDash(t)
	before := d.event("job-0", "claim", nil) // history, before the hub started
	keep := d.open("", true)                 // keeps the hub running across the reconnect
	first := d.event("job-1", "claim", nil)
	keep.until("the claim", withID(first))
	second := d.event("job-1", "progress", map[string]any{"persisted": []string{"a"}})
	keep.until("the progress", withID(second))

	s := d.open(strconv.FormatInt(first, 10), true)
	got := s.until("the replayed progress", withID(second))
	for _, m := range got {
		if strings.Contains(m.Data, ">"+strconv.FormatInt(first, 10)+"<") || m.ID == strconv.FormatInt(first, 10) {
			t.Errorf("replayed what came before Last-Event-ID: %+v", m)
		}
	}
	// An id the hub no longer reaches back to (here: before the history it skipped) asks
	// the page to reload.
	old := d.open(strconv.FormatInt(before-1, 10), true)
	got = old.until("reload", func(m sseMessage) bool { return m.Event != "" })
	if got[len(got)-1].Event != "reload" {
		t.Errorf("from 0: %+v", got)
	}
}

func TestLiveStreamIsOneUpstreamLongPollForManyTabs(t *testing.T) {
	d := newLiveDash(t)
	var tabs []*stream
	for range 8 {
		tabs = append(tabs, d.open("", true))
	}
	id := d.event("job-1", "claim", nil)
	for _, s := range tabs {
		s.until("the claim", withID(id))
	}
	// The head's lookup, one long-poll before the event and at most one after it started.
	if n := d.counter.events.Load(); n > 3 {
		t.Fatalf("%d requests for the job events for 8 tabs", n)
	}
}

func TestLiveStreamDropsASubscriberThatNeverReads(t *testing.T) {
	defer func(n int) { liveBuffer = n }(liveBuffer)
	liveBuffer = 8
	d := newLiveDash(t)
	d.open("", false)
	reader := d.open("", true)
	big := strings.Repeat("x", 128<<10)
	// Until the stalled tab is dropped (its socket full, then its buffer), the reading tab
	// gets every event promptly. A job each, so each job's lookup stays small.
	for i := range 1000 {
		id := d.event("job-"+strconv.Itoa(i), "claim", map[string]string{"pad": big})
		reader.until("event "+strconv.Itoa(i), withID(id))
		if dropped(t, d) > 0 {
			return
		}
	}
	t.Fatal("the tab that never reads was not dropped")
}

func dropped(t *testing.T, d *liveDash) int {
	t.Helper()
	resp, err := d.srv.Client().Get(d.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "hermes_dashboard_live_dropped_total "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

func TestAnIdleLiveStreamGetsAHeartbeat(t *testing.T) {
	defer func(d time.Duration) { liveHeartbeat = d }(liveHeartbeat)
	liveHeartbeat = 50 * time.Millisecond
	d := newLiveDash(t)
	s := d.open("", true)
	s.until("a heartbeat", func(m sseMessage) bool { return m.Comment == "heartbeat" && m.Event == "" })
}

// A row the control API does not answer for is not left showing its old state: after the
// event rows, the stream asks its pages to reload (once), which reads them anew.
func TestALiveUpdateTheControlAPIDoesNotAnswerForReloadsThePages(t *testing.T) {
	d := newLiveDash(t)
	s := d.open("", true)
	claim := d.event("job-1", "claim", nil)
	got := s.until("the claim", withID(claim))
	for _, m := range got {
		if m.Event == templates.LiveReload {
			t.Fatalf("a claim the control API answered for reloads the pages: %+v", got)
		}
	}
	for _, c := range []struct{ what, kind, path string }{
		{"the job", "progress", "/v1/jobs/job-1"},
		{"the subagent", "subagent_stop", "/v1/subagents/sub-1"},
	} {
		path := c.path
		d.counter.refuse.Store(&path)
		id := d.event("job-1", c.kind, map[string]any{"id": "sub-1", "persisted": []string{"a"}})
		got := s.until(c.what+"'s event", withID(id))
		reloads := 0
		for _, m := range got {
			if m.Event == templates.LiveReload {
				reloads++
			}
		}
		if last := got[len(got)-1]; last.Event != templates.LiveReload || reloads != 1 {
			t.Errorf("%s unread: %d reloads, the last message %+v", c.what, reloads, last)
		}
		if !strings.Contains(got[0].Data, c.kind) {
			t.Errorf("%s unread: its event row did not come first: %+v", c.what, got[0])
		}
	}
}

// A live page connects from where it was rendered, and its stream carries what comes next
// and no reload: the first page a dashboard serves, rendered before its feed has found the
// head of the org's events (it used to connect from 0, before the history, and reloaded
// itself at once: the browser e2e's click on Force release, on the first visit to the
// leases page, was lost to that reload), and a page rendered when the feed's loop has
// stopped and more than a page of events has come since (it used to connect from where
// the loop stopped, which the next loop skips).
func TestALivePageConnectsFromWhereItWasRenderedWithoutAReload(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		page      string
		change    func(d *liveDash, i int) // one change, which the page then shows with marker(i)
		marker    func(i int) string
		overAPage int // changes that make more than one page of the feed
	}{{
		page:      "/orgs/acme/jobs",
		change:    func(d *liveDash, i int) { d.event(fmt.Sprintf("job-%04d", i), "claim", nil) },
		marker:    func(i int) string { return fmt.Sprintf("job-%04d", i) },
		overAPage: control.MaxFeedEvents + 1,
	}, {
		page: "/orgs/acme/leases",
		change: func(d *liveDash, i int) {
			l, err := d.leases.TryAcquire(ctx, "home:acme", fmt.Sprintf("worker-acme-%04d", i), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.leases.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
		},
		marker:    func(i int) string { return fmt.Sprintf("worker-acme-%04d", i) },
		overAPage: control.MaxLeaseChanges/2 + 1, // two events each
	}} {
		t.Run(strings.TrimPrefix(c.page, "/orgs/acme/"), func(t *testing.T) {
			follows := func(d *liveDash, what string, next int) {
				t.Helper()
				connect := d.liveConnect(c.page)
				if !strings.Contains(connect, "?after=") {
					t.Fatalf("%s: the page connects to %s, from no event", what, connect)
				}
				s := d.openAt(connect, "", true)
				c.change(d, next)
				got := s.until(what, func(m sseMessage) bool { return strings.Contains(m.Data, c.marker(next)) })
				for _, m := range got {
					if m.Event == templates.LiveReload {
						t.Fatalf("%s: the page (connecting to %s) was asked to reload: %+v", what, connect, got)
					}
				}
			}
			d := newLiveDash(t)
			c.change(d, 0) // history, before the dashboard's feed started
			follows(d, "the first page", 1)

			d = newLiveDash(t)
			d.liveConnect(c.page) // the feed's loop runs for the page, then stops: no stream
			for i := range c.overAPage {
				c.change(d, i)
			}
			follows(d, "a page after a long gap", c.overAPage)
		})
	}
}

// A page whose feed cannot find the head in time (the control API does not answer for the
// events) is still served, and follows from whenever its stream connects.
func TestALivePageWhoseFeedFindsNoHeadFollowsFromWhenItConnects(t *testing.T) {
	defer func(d time.Duration) { liveHeadWait = d }(liveHeadWait)
	liveHeadWait = 200 * time.Millisecond
	for _, c := range []struct{ page, events, connect string }{
		{"/orgs/acme/jobs", "/v1/jobs/events", "/orgs/acme/events"},
		{"/orgs/acme/leases", "/v1/leases/changes", "/orgs/acme/leases/events"},
	} {
		d := newLiveDash(t)
		d.counter.refuse.Store(&c.events)
		if got := d.liveConnect(c.page); got != c.connect {
			t.Errorf("%s, its events refused, connects to %s, want %s", c.page, got, c.connect)
		}
	}
}

// liveConnect is the stream a live page of the dashboard connects to (its sse-connect).
func (d *liveDash) liveConnect(target string) string {
	d.t.Helper()
	tok, err := d.signer.Sign("ada", "acme")
	if err != nil {
		d.t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodGet, d.srv.URL+target, nil)
	if err != nil {
		d.t.Fatal(err)
	}
	req.Header.Set(assertion.Header, tok)
	resp, err := d.srv.Client().Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		d.t.Fatalf("%s: %s", target, resp.Status)
	}
	page, err := goquery.NewDocumentFromReader(resp.Body)
	if err != nil {
		d.t.Fatal(err)
	}
	connect := page.Find(`[data-testid="live"]`).AttrOr("sse-connect", "")
	if connect == "" {
		d.t.Fatalf("%s is not live", target)
	}
	return connect
}
