// Package testio is what tests of several packages share for watching a process or a
// server: a buffer safe to write and read at once, and an HTTP transport that reads each
// response whole.
package testio

import (
	"bytes"
	"io"
	"net/http"
	"sync"
)

// Buffer is a bytes.Buffer that a process, a logger or a server may write while the test
// reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// ReadWhole is a transport that reads every response body at once and closes it.
// httpexpect reads a body only when a test looks at it; one left unread keeps its
// connection's goroutines alive past the test, which goleak reports.
type ReadWhole struct{ Next http.RoundTripper }

// RoundTrip implements http.RoundTripper.
func (rw ReadWhole) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := rw.Next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}
