package web

import (
	"fmt"
	"net/http"
	"time"

	"hermeshost/service"
)

// sseStream is an open response of server-sent events: each write has its own deadline
// (a client that stops reading is let go) and is flushed at once.
type sseStream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

// openSSE answers 200 with the event stream's headers and its retry line (how long a
// browser waits before it reconnects); false when the client is already gone.
func openSSE(w http.ResponseWriter, retry, timeout time.Duration) (*sseStream, bool) {
	service.LongAnswer(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &sseStream{w: w, rc: http.NewResponseController(w), timeout: timeout}
	return s, s.write(fmt.Sprintf("retry: %d\n\n", retry.Milliseconds()))
}

// write sends s; false once the client is gone or too slow.
func (s *sseStream) write(text string) bool {
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if _, err := s.w.Write([]byte(text)); err != nil {
		return false
	}
	return s.rc.Flush() == nil
}
