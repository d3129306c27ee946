package service

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv("SERVICE_TEST_CHILD") == "1" {
		os.Exit(runChild())
	}
	goleak.VerifyTestMain(m)
}

func discard() *slog.Logger { return slog.New(slog.NewJSONHandler(io.Discard, nil)) }

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// serve starts a server for the test and stops it at cleanup.
func serve(t *testing.T, ops *Ops, h http.Handler) *Server {
	t.Helper()
	srv, err := Listen("test", "127.0.0.1:0", h, ops.Log, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return srv
}

func TestHealthzGivesReasons(t *testing.T) {
	ops := NewOps(discard())
	dbDown := errors.New("connect: connection refused")
	var failing atomic.Bool
	ops.Health.Probe("database", func(context.Context) error {
		if failing.Load() {
			return dbDown
		}
		return nil
	})
	srv := serve(t, ops, ops.Router())

	code, body := get(t, srv.URL()+"/healthz")
	if code != 200 || !strings.Contains(body, `"status":"ok"`) {
		t.Fatalf("healthy: got %d %s", code, body)
	}

	ops.Health.Alarm("auth_persist", "cannot write auth.json: no space left on device")
	code, body = get(t, srv.URL()+"/healthz")
	var rep Report
	if err := json.Unmarshal([]byte(body), &rep); err != nil {
		t.Fatal(err)
	}
	if code != 503 || rep.Status != "unhealthy" || rep.Reasons["auth_persist"] != "cannot write auth.json: no space left on device" {
		t.Fatalf("alarm: got %d %+v", code, rep)
	}
	ops.Health.Alarm("auth_persist", "")

	failing.Store(true)
	code, body = get(t, srv.URL()+"/healthz")
	if code != 503 || !strings.Contains(body, `"database":"connect: connection refused"`) {
		t.Fatalf("failing probe: got %d %s", code, body)
	}
}

func TestMetricsCountRequestsByRoute(t *testing.T) {
	ops := NewOps(discard())
	r := ops.Router()
	r.Get("/jobs/{id}", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	srv := serve(t, ops, r)
	for _, id := range []string{"a", "b", "c"} {
		get(t, srv.URL()+"/jobs/"+id)
	}
	_, body := get(t, srv.URL()+"/metrics")
	want := `http_requests_total{code="418",method="GET",route="/jobs/{id}"} 3`
	if !strings.Contains(body, want) {
		t.Fatalf("metrics lack %s:\n%s", want, body)
	}
	if !strings.Contains(body, "go_goroutines") || !strings.Contains(body, "process_cpu_seconds_total") {
		t.Fatal("metrics lack the Go and process collectors")
	}
}

func TestPanicIsA500WithoutStack(t *testing.T) {
	var logs bytes.Buffer
	ops := NewOps(slog.New(slog.NewJSONHandler(&logs, nil)))
	r := ops.Router()
	r.Get("/boom", func(http.ResponseWriter, *http.Request) { panic("secret internals") })
	srv := serve(t, ops, r)
	code, body := get(t, srv.URL()+"/boom")
	if code != 500 || strings.Contains(body, "secret internals") || strings.Contains(body, "goroutine") {
		t.Fatalf("got %d %q", code, body)
	}
	if !strings.Contains(logs.String(), "handler panic") {
		t.Fatalf("panic not logged: %s", logs.String())
	}
}

func TestShutdownDrainsInFlightRequest(t *testing.T) {
	ops := NewOps(discard())
	r := ops.Router()
	entered, release := make(chan struct{}), make(chan struct{})
	r.Get("/slow", func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		fmt.Fprint(w, "finished")
	})
	srv, err := Listen("test", "127.0.0.1:0", r, ops.Log, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()

	got := make(chan string, 1)
	go func() {
		_, body := get(t, srv.URL()+"/slow")
		got <- body
	}()
	<-entered
	cancel()
	select {
	case err := <-served:
		t.Fatalf("Serve returned while a request was in flight: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if body := <-got; body != "finished" {
		t.Fatalf("in-flight request got %q", body)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

func TestShutdownCutsRequestsPastGrace(t *testing.T) {
	ops := NewOps(discard())
	r := ops.Router()
	entered, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	r.Get("/stuck", func(w http.ResponseWriter, r *http.Request) { close(entered); <-release })
	srv, err := Listen("test", "127.0.0.1:0", r, ops.Log, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	go http.Get(srv.URL() + "/stuck") //nolint:errcheck // the request is cut on purpose
	<-entered
	cancel()
	if err := <-served; err == nil || !strings.Contains(err.Error(), "grace period") {
		t.Fatalf("want a grace-period error, got %v", err)
	}
}

// runChild is a real server process: it serves /slow, which answers once the parent has
// sent SIGTERM, so the parent sees the in-flight request drained and the process exit 0.
func runChild() int {
	ctx, stop := SignalContext(context.Background())
	defer stop()
	log := NewLogger(os.Stderr, slog.LevelInfo, "child")
	ops := NewOps(log)
	r := ops.Router()
	r.Get("/slow", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(os.Stdout, "in-flight")
		<-ctx.Done()
		time.Sleep(200 * time.Millisecond) // still working after the signal
		fmt.Fprint(w, "drained")
	})
	srv, err := Listen("child", "127.0.0.1:0", r, log, 5*time.Second)
	if err != nil {
		return 1
	}
	fmt.Fprintln(os.Stdout, srv.URL())
	if err := srv.Serve(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func TestSIGTERMDrainsThenExits(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SERVICE_TEST_CHILD=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("child printed no URL: %s", stderr.String())
	}
	url := lines.Text()

	got := make(chan string, 1)
	go func() {
		resp, err := http.Get(url + "/slow")
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got <- string(b)
	}()
	if !lines.Scan() || lines.Text() != "in-flight" {
		t.Fatalf("request did not reach the child: %s", stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if body := <-got; body != "drained" {
		t.Fatalf("in-flight request got %q", body)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child did not exit cleanly: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{`"msg":"shutting down"`, `"msg":"stopped"`} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("child log lacks %s:\n%s", want, stderr.String())
		}
	}
}

func TestSecretNeverPrints(t *testing.T) {
	s := Secret("sk-live-123")
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("x", "token", s)
	js, _ := json.Marshal(map[string]any{"t": s})
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%v %s %#v", s, s, s), logs.String(), string(js)} {
		if strings.Contains(out, "sk-live") {
			t.Fatalf("secret leaked: %s", out)
		}
	}
	if s.Reveal() != "sk-live-123" {
		t.Fatal("Reveal must give the value")
	}
}

// A long-lived answer (an event stream) ends when its server starts shutting down, so the
// shutdown drains without waiting out the grace period for it.
func TestStreamsEndWhenTheServerShutsDown(t *testing.T) {
	started := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		close(started)
		select {
		case <-ShuttingDown(r.Context()):
		case <-r.Context().Done():
		}
	})
	srv, err := Listen("stream", "127.0.0.1:0", h, slog.New(slog.DiscardHandler), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	resp, err := http.Get(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-started
	stop()
	// Without the stream ending, Serve would wait the minute out and report it cut.
	if err := <-served; err != nil {
		t.Fatalf("shutdown with a stream open: %v", err)
	}
	if ShuttingDown(context.Background()) != nil {
		t.Fatal("a context of no server says it is shutting down")
	}
}

// withTimeouts shortens the servers' timeouts for one test.
func withTimeouts(t *testing.T, read, write time.Duration) {
	saved := timeouts
	timeouts.read, timeouts.write = read, write
	t.Cleanup(func() { timeouts = saved })
}

// A request whose body trickles in is cut off by the read timeout: its handler's read
// fails and the connection is closed, so a slow client holds no connection for long.
func TestASlowBodyIsCutOffByTheReadTimeout(t *testing.T) {
	withTimeouts(t, 300*time.Millisecond, time.Minute)
	readErr := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		readErr <- err
	})
	srv, err := Listen("slow", "127.0.0.1:0", h, slog.New(slog.DiscardHandler), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() { _ = srv.Serve(ctx) }()
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nfirst bytes"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case err := <-readErr:
		if err == nil {
			t.Fatal("the handler read a body that never finished arriving")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the slow body was not cut off")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("cut off after %s, the read timeout is 300 ms", took)
	}
	// And the server closed the connection.
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(conn); err != nil {
		t.Fatalf("the connection was not closed: %v", err)
	}
}

// A handler that answers for long lifts the timeouts with LongAnswer: its stream outlives
// both, its request's context stays alive; one that does not is ended by them.
func TestALongAnswerOutlivesTheTimeouts(t *testing.T) {
	withTimeouts(t, 200*time.Millisecond, 300*time.Millisecond)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/long" {
			LongAnswer(w)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i := range 8 {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	})
	srv, err := Listen("long", "127.0.0.1:0", h, slog.New(slog.DiscardHandler), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() { _ = srv.Serve(ctx) }()
	lines := func(path string) int {
		resp, err := http.Get(srv.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Count(string(b), "data: ")
	}
	if n := lines("/long"); n != 8 {
		t.Fatalf("the long answer sent %d of its 8 lines", n)
	}
	if n := lines("/short"); n >= 8 {
		t.Fatalf("without LongAnswer the answer sent all %d lines past the timeouts", n)
	}
}
