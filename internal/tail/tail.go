// Package tail keeps the end of an output stream whatever its length: what a host reads
// from a process it does not trust (an agent, a worker an agent runs beside) is bounded,
// and what was cut is counted, never buffered.
package tail

import (
	"strings"
	"sync"
)

// Buffer is an io.Writer that keeps the last Max bytes written to it and counts the rest.
// It is safe for one writer and concurrent readers.
type Buffer struct {
	max     int
	mu      sync.Mutex
	buf     []byte
	dropped int64
}

// New is a Buffer keeping the last n bytes (at least 1).
func New(n int) *Buffer { return &Buffer{max: max(n, 1)} }

// Write keeps the end of p; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(p)
	if n >= b.max {
		b.dropped += int64(len(b.buf) + n - b.max)
		b.buf = append(b.buf[:0], p[n-b.max:]...)
		return n, nil
	}
	if over := len(b.buf) + n - b.max; over > 0 {
		b.dropped += int64(over)
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	b.buf = append(b.buf, p...)
	return n, nil
}

// String is what is kept, as valid UTF-8 (a cut may split a character).
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.ToValidUTF8(string(b.buf), "")
}

// Dropped is how many bytes were cut from the front.
func (b *Buffer) Dropped() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dropped
}

// Redact replaces every occurrence of each non-empty secret in s with [redacted].
func Redact(s string, secrets ...string) string {
	for _, secret := range secrets {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "[redacted]")
		}
	}
	return s
}
