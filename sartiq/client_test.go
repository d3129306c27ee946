package sartiq_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"hermeshost/pg/pgtest"
	"hermeshost/sartiq"
	"hermeshost/sartiq/backend"
	"hermeshost/sartiq/backend/backendtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var fast = sartiq.WithRetry(sartiq.Retry{Attempts: 3, Base: time.Millisecond, Max: 2 * time.Millisecond})

func newClient(t *testing.T, base, token string, opts ...sartiq.Option) *sartiq.Client {
	t.Helper()
	c, err := sartiq.New(base, token, append([]sartiq.Option{fast}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestGuidelinesJobThroughTheClient(t *testing.T) {
	b := backendtest.Start(t, backend.Config{})
	ctx := t.Context()
	bot := newClient(t, b.URL, backendtest.BotToken)

	page, err := bot.ListJobs(ctx, sartiq.ListJobsParams{Type: sartiq.TypeGuidelinesExtraction, Status: sartiq.StatusQueued, OrganizationID: "acme"})
	if err != nil || len(page.Jobs) != 1 {
		t.Fatalf("list: %v %+v", err, page)
	}
	id := page.Jobs[0].ID
	claim, err := bot.Claim(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bot.Claim(ctx, id); !sartiq.IsConflict(err) || !strings.HasPrefix(err.Error(), "claimAgentJob: 409 not_queued") {
		t.Fatalf("second claim: %v", err)
	}
	job := newClient(t, b.URL, claim.JobToken)
	m, err := job.Manifest(ctx, claim.ManifestURL)
	if err != nil || len(m.Categories) != 5 || m.OrganizationID != "acme" {
		t.Fatalf("manifest: %v %+v", err, m)
	}
	if _, err := job.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	hb, err := job.Heartbeat(ctx, id, map[string]any{"categories_done": 0})
	if err != nil || !hb.TokenExpiresAt.After(claim.TokenExpiresAt.Add(-time.Second)) {
		t.Fatalf("heartbeat: %v %+v", err, hb)
	}
	for _, c := range m.Categories {
		p, err := job.ProposeGuidelines(ctx, claim.OrganizationID, c, sartiq.GuidelinesRequest{Content: "rules for " + c})
		if err != nil || p.Status != "pending_review" {
			t.Fatalf("propose %s: %v %+v", c, err, p)
		}
	}
	if _, err := job.ProposeProducts(ctx, "acme", []sartiq.ProductInput{{SKU: "a", Name: "b"}}); !sartiq.IsForbidden(err) {
		t.Fatalf("guidelines token on proposeProducts: %v", err)
	}
	if _, err := job.ListProducts(ctx, "globex"); !sartiq.IsForbidden(err) {
		t.Fatalf("other org's products: %v", err)
	}
	products, err := job.ListProducts(ctx, "acme")
	if err != nil || len(products) != 3 {
		t.Fatalf("products: %v %d", err, len(products))
	}
	pre, err := job.Presign(ctx, sartiq.PresignRequest{Filename: "notes.md", ContentType: "text/markdown", Size: 5})
	if err != nil {
		t.Fatal(err)
	}
	if up, err := job.Upload(ctx, pre, []byte("notes")); err != nil || up.Size != 5 {
		t.Fatalf("upload: %v %+v", err, up)
	}
	if _, err := job.AddEvent(ctx, id, sartiq.EventRequest{Kind: "checkpoint", Message: "all categories"}); err != nil {
		t.Fatal(err)
	}
	done, err := job.Complete(ctx, id, map[string]any{"categories": m.Categories})
	if err != nil || done.Status != sartiq.StatusCompleted {
		t.Fatalf("complete: %v %+v", err, done)
	}
	if _, err := job.Heartbeat(ctx, id, nil); !sartiq.IsTokenRevoked(err) || !sartiq.IsConflict(err) {
		t.Fatalf("heartbeat after completion: %v", err)
	}
	events, err := bot.ListEvents(ctx, id)
	if err != nil || events[0].Kind != sartiq.EventClaim || events[len(events)-1].Kind != sartiq.EventComplete {
		t.Fatalf("events: %v %+v", err, events)
	}
	for _, e := range events {
		if e.Attempt != 1 {
			t.Fatalf("event %+v is not attempt 1", e)
		}
	}
}

func TestStaleJobIsReclaimedAndTheOldTokenStops(t *testing.T) {
	b := backendtest.Start(t, backend.Config{StaleAfter: 30 * time.Second})
	ctx := t.Context()
	bot := newClient(t, b.URL, backendtest.BotToken)
	id := b.DemoJob(t, "globex", sartiq.TypeProductIngest)
	first, err := bot.Claim(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bot.Reclaim(ctx, id); !sartiq.IsConflict(err) {
		t.Fatalf("reclaim of a fresh claim: %v", err)
	}
	b.Clock.Advance(31 * time.Second)
	second, err := bot.Reclaim(ctx, id)
	if err != nil || second.Job.Attempt != 2 {
		t.Fatalf("reclaim: %v %+v", err, second)
	}
	old := newClient(t, b.URL, first.JobToken)
	if _, err := old.Start(ctx, id); !sartiq.IsTokenRevoked(err) {
		t.Fatalf("old token: %v", err)
	}
	fresh := newClient(t, b.URL, second.JobToken)
	if _, err := fresh.Fail(ctx, id, "past the attempt cap"); err != nil {
		t.Fatal(err)
	}
}

func TestErrorsNameTheOperationAndNeverTheToken(t *testing.T) {
	b := backendtest.Start(t, backend.Config{})
	const token = "a-job-token-that-must-never-be-printed"
	c := newClient(t, b.URL, token)
	_, err := c.Start(t.Context(), b.DemoJob(t, "acme", sartiq.TypeProductIngest))
	var ae *sartiq.APIError
	if !errors.As(err, &ae) || ae.Op != "startAgentJob" || ae.Status != 401 || !sartiq.IsUnauthorized(err) {
		t.Fatalf("got %v", err)
	}
	if strings.Contains(err.Error(), token) {
		t.Fatal("the token is in the error")
	}
	dead := newClient(t, "http://127.0.0.1:1", token)
	if _, err := dead.ListJobs(t.Context(), sartiq.ListJobsParams{}); err == nil || strings.Contains(err.Error(), token) || !strings.HasPrefix(err.Error(), "listAgentJobs: ") {
		t.Fatalf("unreachable: %v", err)
	}
}

// flaky answers 503 to the first n requests, then hands over to next; it counts requests.
type flaky struct {
	n     int32
	seen  atomic.Int32
	next  http.Handler
	codes int
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.seen.Add(1) <= f.n {
		w.WriteHeader(f.codes)
		return
	}
	f.next.ServeHTTP(w, r)
}

func okJSON(body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(body)) }) //nolint:errcheck
}

func TestRetriesOnlyWhereSafe(t *testing.T) {
	ctx := t.Context()
	cases := []struct {
		name  string
		code  int
		fails int32
		call  func(c *sartiq.Client) error
		want  int32
		ok    bool
	}{
		{"a read is retried on 5xx", 503, 2, func(c *sartiq.Client) error { _, err := c.ListJobs(ctx, sartiq.ListJobsParams{}); return err }, 3, true},
		{"a read gives up after the attempts", 503, 5, func(c *sartiq.Client) error { _, err := c.ListJobs(ctx, sartiq.ListJobsParams{}); return err }, 3, false},
		{"a 4xx is never retried", 400, 5, func(c *sartiq.Client) error { _, err := c.ListJobs(ctx, sartiq.ListJobsParams{}); return err }, 1, false},
		{"a claim is not retried on 5xx", 502, 1, func(c *sartiq.Client) error { _, err := c.Claim(ctx, "x"); return err }, 1, false},
		{"complete is not retried on 5xx", 500, 1, func(c *sartiq.Client) error { _, err := c.Complete(ctx, "x", map[string]any{}); return err }, 1, false},
		{"a heartbeat is retried", 503, 1, func(c *sartiq.Client) error { _, err := c.Heartbeat(ctx, "x", nil); return err }, 2, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &flaky{n: tc.fails, codes: tc.code, next: okJSON(`{"jobs": []}`)}
			srv := httptest.NewServer(f)
			defer srv.Close()
			err := tc.call(newClient(t, srv.URL, "tok"))
			if (err == nil) != tc.ok || f.seen.Load() != tc.want {
				t.Fatalf("err %v after %d requests; want ok=%v after %d", err, f.seen.Load(), tc.ok, tc.want)
			}
			// What a caller may make again itself: a 5xx, never a 4xx.
			if err != nil && sartiq.IsTransient(err) != (tc.code >= 500) {
				t.Errorf("IsTransient(%v) = %v", err, sartiq.IsTransient(err))
			}
		})
	}
}

// refusedOnce fails the first dial, as a server that is not listening yet would.
type refusedOnce struct {
	dials atomic.Int32
	next  http.RoundTripper
}

func (r *refusedOnce) RoundTrip(req *http.Request) (*http.Response, error) {
	if r.dials.Add(1) == 1 {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	}
	return r.next.RoundTrip(req)
}

func TestAClaimIsRetriedWhenTheConnectionWasNeverMade(t *testing.T) {
	srv := httptest.NewServer(okJSON(`{"job": {"id": "x"}, "job_token": "t"}`))
	defer srv.Close()
	rt := &refusedOnce{next: http.DefaultTransport}
	c := newClient(t, srv.URL, "tok", sartiq.WithHTTPClient(&http.Client{Transport: rt}))
	if _, err := c.Claim(t.Context(), "x"); err != nil || rt.dials.Load() != 2 {
		t.Fatalf("err %v after %d dials", err, rt.dials.Load())
	}
}

func TestContextDeadlineEndsTheCall(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := newClient(t, srv.URL, "tok").ListJobs(ctx, sartiq.ListJobsParams{})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "listAgentJobs: ") {
		t.Fatalf("got %v", err)
	}
	if sartiq.IsTransient(err) {
		t.Errorf("IsTransient(%v): the caller's own deadline ended it", err)
	}
}

// A server that is not there is a transient failure: the call may go through later.
func TestNoServerIsTransient(t *testing.T) {
	srv := httptest.NewServer(okJSON(`{}`))
	srv.Close()
	_, err := newClient(t, srv.URL, "tok").Complete(t.Context(), "x", map[string]any{})
	if err == nil || !sartiq.IsTransient(err) {
		t.Fatalf("IsTransient(%v) = false", err)
	}
}

// The worker's local proxy adds the job token; a client on its socket sends none.
func TestUnixSocketClientThroughATokenAddingProxy(t *testing.T) {
	b := backendtest.Start(t, backend.Config{})
	ctx := t.Context()
	bot := newClient(t, b.URL, backendtest.BotToken)
	id := b.DemoJob(t, "acme", sartiq.TypeProductIngest)
	claim, err := bot.Claim(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse(b.URL)
	var sawAuth atomic.Bool
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		if r.In.Header.Get("Authorization") != "" {
			sawAuth.Store(true)
		}
		r.SetURL(target)
		r.Out.Header.Set("Authorization", "Bearer "+claim.JobToken)
	}}
	sock := filepath.Join(t.TempDir(), "sartiq.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: proxy}
	go srv.Serve(ln) //nolint:errcheck // ends with Close below
	defer srv.Close()

	c, err := sartiq.NewUnix(sock, fast)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	m, err := c.Manifest(ctx, claim.ManifestURL)
	if err != nil || m.JobID != id {
		t.Fatalf("manifest over the socket: %v %+v", err, m)
	}
	if sawAuth.Load() {
		t.Fatal("the socket client sent a token of its own")
	}
}
