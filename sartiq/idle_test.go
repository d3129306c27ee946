package sartiq_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"hermeshost/sartiq"
)

// stuck bounds every wait on net/http's goroutines: past it the test fails, not hangs.
const stuck = 10 * time.Second

// rawServer is HTTP/1.1 on a bare listener, so a test decides when a connection closes.
// It counts the requests it read, by path.
type rawServer struct {
	url   string
	mu    sync.Mutex
	read  map[string]int
	conns []net.Conn
}

// rule says what the server does with a request it read on its conn-th connection (from
// 1): answer it or hang up without a word, and after an answer keep the connection or
// close it.
type rule func(conn int, path string) (answer, keep bool)

func startRawServer(t *testing.T, r rule) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{url: "http://" + ln.Addr().String(), read: map[string]int{}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 1; ; n++ {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, conn)
			s.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				s.serve(conn, n, r)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		wg.Wait()
	})
	return s
}

func (s *rawServer) serve(conn net.Conn, n int, r rule) {
	br := bufio.NewReader(conn)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body) //nolint:errcheck // a claim has no body
		s.mu.Lock()
		s.read[req.URL.Path]++
		s.mu.Unlock()
		answer, keep := r(n, req.URL.Path)
		if !answer {
			return
		}
		id := strings.Split(req.URL.Path, "/")[2]
		body := fmt.Sprintf(`{"job": {"id": %q}, "job_token": "t"}`, id)
		fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		if !keep {
			return
		}
	}
}

func (s *rawServer) reads(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.read[path]
}

// gatedConn holds back the server's EOF from the transport's read loop until released,
// so the test decides when the transport learns that an idle connection was closed.
type gatedConn struct {
	net.Conn
	eof       chan struct{}   // closed to let a read at EOF return
	done      <-chan struct{} // closed at the end of the test, likewise
	closed    chan struct{}   // closed by Close
	closeOnce sync.Once
}

func (c *gatedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err == io.EOF {
		select {
		case <-c.eof:
		case <-c.done:
		}
	}
	return n, err
}

// Write after Close reports success and sends nothing. The transport's write loop now and
// then still tries the request on the closed connection (about 1 run in 100 here); should
// that failure, nothing written, reach the round trip before the close does, net/http
// retries by itself, a path that would hide the one under test. Nothing reaches the server
// either way: the socket is closed.
func (c *gatedConn) Write(p []byte) (int, error) {
	select {
	case <-c.closed:
		return len(p), nil
	default:
		return c.Conn.Write(p)
	}
}

func (c *gatedConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// A keep-alive connection the server closed while idle, handed to a claim at that moment:
// the transport's read loop sees the EOF with no request on the connection and closes it,
// and the claim's round trip, which already holds it, fails with "http: server closed
// idle connection" (net/http does not retry a POST itself). The server never read that
// claim, so the client sends it again, on a new connection.
func TestAClaimIsRetriedWhenTheServerClosedTheIdleConnectionFirst(t *testing.T) {
	// The first connection answers one request and closes, as at the server's idle timeout.
	srv := startRawServer(t, func(conn int, _ string) (bool, bool) { return true, conn > 1 })
	done := make(chan struct{})
	var dials atomic.Int32
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		dials.Add(1)
		return &gatedConn{Conn: conn, eof: make(chan struct{}), done: done, closed: make(chan struct{})}, nil
	}}
	t.Cleanup(func() { close(done); tr.CloseIdleConnections() })
	c := newClient(t, srv.url, "tok", sartiq.WithHTTPClient(&http.Client{Transport: tr}))

	if cl, err := c.Claim(t.Context(), "a"); err != nil || cl.Job.ID != "a" {
		t.Fatalf("first claim: %v, job %q", err, cl.Job.ID)
	}
	var raced atomic.Int32
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if !info.Reused {
			return
		}
		gc, ok := info.Conn.(*gatedConn)
		if !ok {
			t.Errorf("the transport handed out a %T, not the dialled connection", info.Conn)
			return
		}
		// Only now may the read loop see the EOF; this request is not on the connection
		// until GotConn returns, so the loop finds none and closes it.
		close(gc.eof)
		select {
		case <-gc.closed:
			raced.Add(1)
		case <-time.After(stuck):
			t.Errorf("the transport did not close the connection within %v of the server's EOF", stuck)
		}
	}}
	ctx := httptrace.WithClientTrace(t.Context(), trace)
	cl, err := c.Claim(ctx, "b")
	if err != nil || cl.Job.ID != "b" {
		t.Fatalf("second claim: %v, job %q", err, cl.Job.ID)
	}
	if raced.Load() != 1 || dials.Load() != 2 {
		t.Fatalf("the second claim met the closing connection %d times over %d dials; want 1 and 2", raced.Load(), dials.Load())
	}
	if a, b := srv.reads("/agent-jobs/a/claim"), srv.reads("/agent-jobs/b/claim"); a != 1 || b != 1 {
		t.Fatalf("the server read claim a %d times and claim b %d times; want once each", a, b)
	}
}

// The contrast: a server that read the claim and hung up without an answer may have acted
// on it, so the claim is not sent again, reused connection or not. net/http reports the
// bare EOF it read where the answer should have been.
func TestAClaimIsNotRetriedWhenTheServerHungUpAfterReadingIt(t *testing.T) {
	srv := startRawServer(t, func(_ int, path string) (bool, bool) { return path != "/agent-jobs/b/claim", true })
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := newClient(t, srv.url, "tok", sartiq.WithHTTPClient(&http.Client{Transport: tr}))

	if cl, err := c.Claim(t.Context(), "a"); err != nil || cl.Job.ID != "a" {
		t.Fatalf("first claim: %v, job %q", err, cl.Job.ID)
	}
	var reused atomic.Bool
	ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		reused.Store(reused.Load() || info.Reused)
	}})
	_, err := c.Claim(ctx, "b")
	if !errors.Is(err, io.EOF) || !strings.HasPrefix(err.Error(), `claimAgentJob: Post "`) || !strings.HasSuffix(err.Error(), `/agent-jobs/b/claim": EOF`) {
		t.Fatalf("second claim: got %v; want the EOF that came instead of the answer", err)
	}
	if !reused.Load() {
		t.Fatal("the second claim did not go over the first claim's connection")
	}
	if a, b := srv.reads("/agent-jobs/a/claim"), srv.reads("/agent-jobs/b/claim"); a != 1 || b != 1 {
		t.Fatalf("the server read claim a %d times and claim b %d times; want once each", a, b)
	}
}
