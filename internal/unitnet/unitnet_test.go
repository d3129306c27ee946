package unitnet

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"hermeshost/internal/testio"
)

// A unit's request goes through its org's socket to the service on the host and back,
// streamed, with nothing it says of its origin passed on; the host's answer reaches a
// client on the unit's loopback through the forwarder.
func TestAUnitReachesAHostServiceThroughItsSocketAndLoopback(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "path=%s auth=%s fwd=%q\n", r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("X-Forwarded-For"))
		w.(http.Flusher).Flush()
		fmt.Fprint(w, "second part\n")
	}))
	defer upstream.Close()
	proxy, err := Proxy(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSockets(t.TempDir(), map[string]http.Handler{"api": proxy}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dir, err := s.Ensure("acme")
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "api.sock"))
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("no socket: %v %v", fi, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base, err := Resolve(ctx, URL(filepath.Join(dir, "api.sock")), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(base, "http://127.0.0.1:") {
		t.Fatalf("resolved to %s", base)
	}
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/jobs", nil)
	req.Header.Set("Authorization", "Bearer tok")
	req.Header.Set("X-Forwarded-For", "10.0.0.9")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := "path=/v1/jobs auth=Bearer tok fwd=\"\"\nsecond part\n"; string(body) != want {
		// The unit's claim of where it comes from is gone.
		t.Fatalf("body %q, want %q", body, want)
	}

	// An http URL is used as it is: units on the host's network.
	if got, err := Resolve(ctx, upstream.URL, "", nil); err != nil || got != upstream.URL {
		t.Fatalf("resolve http: %q %v", got, err)
	}
	// The forwarder ends with its context.
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the forwarder still listens after its context ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A socket a dead process left is replaced; one another process serves, or a file that is
// not a socket, is refused; a path longer than a socket address allows still works.
func TestListenReplacesOnlyDeadSockets(t *testing.T) {
	dir := t.TempDir()
	long := filepath.Join(dir, strings.Repeat("d", 60), strings.Repeat("e", 40))
	if err := os.MkdirAll(long, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(long, "svc.sock")
	if len(path) <= maxSocketPath {
		t.Fatalf("path %d bytes is not long enough to test", len(path))
	}
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	}()
	resp, err := HTTPClient(path, 2*time.Second).Get("http://unit/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "ok" {
		t.Fatalf("body %q", body)
	}
	if _, err := Listen(path); err == nil || !strings.Contains(err.Error(), "another process serves it") {
		t.Fatalf("listen on a served socket: %v", err)
	}
	if ln.Addr().String() != path {
		t.Fatalf("addr %s", ln.Addr())
	}
	ln.Close()
	// A dead socket file (left as a crash would) is replaced.
	dead, err := net.Listen("unix", filepath.Join(dir, "dead.sock"))
	if err != nil {
		t.Fatal(err)
	}
	dead.(*net.UnixListener).SetUnlinkOnClose(false)
	dead.Close()
	again, err := Listen(filepath.Join(dir, "dead.sock"))
	if err != nil {
		t.Fatalf("listen over a dead socket: %v", err)
	}
	again.Close()
	if err := os.WriteFile(filepath.Join(dir, "file.sock"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(filepath.Join(dir, "file.sock")); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("listen over a file: %v", err)
	}
	if raw, _ := os.ReadFile(filepath.Join(dir, "file.sock")); string(raw) != "x" {
		t.Fatal("the file was touched")
	}
}

// Ensure serves anew a socket that was removed; Close stops serving.
func TestSocketsAreServedAgainWhenRemoved(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	s, err := NewSockets(t.TempDir(), map[string]http.Handler{"control": h}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	get := func(dir string) error {
		resp, err := HTTPClient(filepath.Join(dir, "control.sock"), 2*time.Second).Get("http://unit/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	dir, err := s.Ensure("acme")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "control.sock")); err != nil {
		t.Fatal(err)
	}
	if get(dir) == nil {
		t.Fatal("a removed socket answered")
	}
	if _, err := s.Ensure("acme"); err != nil {
		t.Fatal(err)
	}
	if err := get(dir); err != nil {
		t.Fatalf("after ensure: %v", err)
	}
	s.Close()
	if get(dir) == nil {
		t.Fatal("a socket answered after Close")
	}
	if _, err := s.Ensure("acme"); err == nil {
		t.Fatal("Ensure after Close served")
	}
	if _, err := NewSockets(t.TempDir(), map[string]http.Handler{"../x": h}, nil); err == nil {
		t.Fatal("a service name with a path was taken")
	}
}

// A service that answers before it has read the request's body (a 404 to a POST, as the
// gateway gives the agent's start-up probe POST /api/show) is passed on while the body is
// still coming: the proxy's server neither waits for the rest of the body before sending the
// answer nor closes the body under the transport that is still sending it on. The client
// here sends half its body, waits for the answer, then sends the rest: without full duplex
// the answer never comes (the server reads the rest of the body first), and a client that
// sent it all could have its answer cut when the transport's last read of the closed body
// fails.
func TestAProxyPassesAnAnswerOnWhileTheBodyIsStillComing(t *testing.T) {
	// The service answers at once, without waiting for the body either.
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answerEarly(w, r)
	}))
	t.Cleanup(upstream.Close)
	p, err := Proxy(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)

	c, err := net.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 64 << 10
	half := strings.Repeat("x", size/2)
	if _, err := fmt.Fprintf(c, "POST /api/show HTTP/1.1\r\nHost: unit\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", size, half); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer while the body was still coming: %v", err)
	}
	if _, err := io.WriteString(c, half); err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || strings.TrimSpace(string(body)) != "not here" || err != nil {
		t.Fatalf("answer %d %q (%v), want the service's 404 whole", resp.StatusCode, body, err)
	}
}

// A proxy whose answer is written while its transport still reads (or closes) the request's
// body must not let that read race the server's own read of the connection once the
// handler has returned (net/http panics on it: "invalid concurrent Body.Read call"): with
// the service down, with it answering before the body is in, and with the next request
// coming on the same connection.
func TestAProxyNeverReadsTheBodyAfterItsHandlerReturned(t *testing.T) {
	answersEarly := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answerEarly(w, r)
	}))
	t.Cleanup(answersEarly.Close)
	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL
	down.Close()
	for _, upstream := range []struct{ name, url string }{{"down", downURL}, {"answers early", answersEarly.URL}} {
		t.Run(upstream.name, func(t *testing.T) {
			p, err := Proxy(upstream.url)
			if err != nil {
				t.Fatal(err)
			}
			var logged testio.Buffer
			front := httptest.NewUnstartedServer(p)
			front.Config.ErrorLog = log.New(&logged, "", 0)
			front.Start()
			t.Cleanup(front.Close)
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					c, err := net.Dial("tcp", front.Listener.Addr().String())
					if err != nil {
						t.Error(err)
						return
					}
					defer c.Close()
					br := bufio.NewReader(c)
					for range 25 {
						const size = 256 << 10
						body := strings.Repeat("x", size)
						if _, err := fmt.Fprintf(c, "POST /api/show HTTP/1.1\r\nHost: unit\r\nContent-Length: %d\r\n\r\n%s", size/2, body[:size/4]); err != nil {
							return // the server closed the connection: fine, not a panic
						}
						_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
						resp, err := http.ReadResponse(br, nil)
						if err != nil {
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if _, err := io.WriteString(c, body[:size/4]); err != nil || resp.Close {
							return
						}
					}
				})
			}
			wg.Wait()
			if strings.Contains(logged.String(), "panic") {
				t.Fatalf("the proxy's server panicked:\n%s", logged.String())
			}
		})
	}
}

// answerEarly answers 404 at once, in full duplex, before reading the request's body, then
// drains the body itself: left to the server after the handler, the drain makes the test
// server panic (go.dev/issue/68560).
func answerEarly(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex()
	http.Error(w, "not here", http.StatusNotFound)
	_ = rc.Flush()
	_ = r.Body.Close()
}
