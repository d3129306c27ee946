package service

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// ParseLevel reads LOG_LEVEL's words.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info", "":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown log level %q (want debug, info, warn or error)", s)
}

// NewLogger writes one JSON object per event. The process name is on every line, so the
// interleaved logs of `hermes-host dev` stay readable.
func NewLogger(w io.Writer, level slog.Level, process string) *slog.Logger {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})
	return slog.New(h).With("process", process)
}

// Secret is a string that never reaches a log line, an error or a page: every way of
// printing it prints a fixed mask.
type Secret string

// Reveal is the value itself, for the one place that must send it.
func (s Secret) Reveal() string { return string(s) }

func (s Secret) String() string { return s.mask() }

// GoString masks %#v too.
func (s Secret) GoString() string { return s.mask() }

// LogValue masks the value in slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.mask()) }

// MarshalText masks the value in JSON and text encodings.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.mask()), nil }

func (s Secret) mask() string {
	if s == "" {
		return ""
	}
	return "[redacted]"
}
