package logfmt

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// TextOptions says how a TextHandler writes.
type TextOptions struct {
	// Level is the lowest level written; nil means slog.LevelInfo.
	Level slog.Leveler
	// Color marks the time, level, process and keys with ANSI escapes.
	Color bool
}

// TextHandler writes each record as one line for a person to read:
//
//	15:04:05.000 INFO  dispatcher  jobs started count=2 org=acme
//
// the local time to the millisecond, the level, the process (the ProcessKey attribute),
// the message and then the attributes as key=value, a group's keys prefixed with its name
// and a dot. A value is quoted, Go-style, when it is empty or holds a space, '=', '"' or a
// character that does not print; the message is quoted when it holds one that does not
// print. Newlines and other control characters are thus always escaped: one record is one
// line, and what a record holds cannot move the terminal's cursor or change its colours.
// A value shows what the JSON handler would write for it (a LogValuer resolved, an error's
// text, an Any value as encoding/json marshals it), so nothing the JSON output keeps out of
// the log reaches this one.
type TextHandler struct {
	out   *lockedWriter
	opts  TextOptions
	level slog.Leveler
	// process is the ProcessKey attribute added by WithAttrs outside any group.
	process string
	// attrs are the other attributes added by WithAttrs, already written.
	attrs []byte
	// prefix is the open groups' names, each followed by a dot.
	prefix string
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// NewText is a TextHandler writing to w; opts may be nil.
func NewText(w io.Writer, opts *TextOptions) *TextHandler {
	h := &TextHandler{out: &lockedWriter{w: w}}
	if opts != nil {
		h.opts = *opts
	}
	h.level = h.opts.Level
	if h.level == nil {
		h.level = slog.LevelInfo
	}
	return h
}

// Enabled says whether records of level are written.
func (h *TextHandler) Enabled(_ context.Context, level slog.Level) bool {
	return level >= h.level.Level()
}

// WithAttrs is h with attrs on every record.
func (h *TextHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	c := *h
	c.attrs = bytes.Clone(h.attrs)
	for _, a := range attrs {
		if p, ok := h.processOf(a); ok {
			c.process = p
			continue
		}
		c.attrs = c.appendAttr(c.attrs, c.prefix, a)
	}
	return &c
}

// WithGroup is h with the attributes that follow under name.
func (h *TextHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.prefix += name + "."
	return &c
}

// Handle writes r as one line.
func (h *TextHandler) Handle(_ context.Context, r slog.Record) error {
	process := h.process
	var attrs []byte
	r.Attrs(func(a slog.Attr) bool {
		if p, ok := h.processOf(a); ok {
			process = p
			return true
		}
		attrs = h.appendAttr(attrs, h.prefix, a)
		return true
	})

	buf := make([]byte, 0, 128+len(h.attrs)+len(attrs))
	if !r.Time.IsZero() {
		buf = h.paint(buf, faint, r.Time.Format("15:04:05.000"))
		buf = append(buf, ' ')
	}
	buf = h.paint(buf, levelColor(r.Level), pad(r.Level.String(), 5))
	buf = append(buf, ' ')
	if process != "" {
		buf = h.paint(buf, bold+cyan, pad(escaped(process), processWidth))
		buf = append(buf, ' ')
	}
	buf = appendMessage(buf, r.Message)
	buf = append(buf, h.attrs...)
	buf = append(buf, attrs...)
	buf = append(buf, '\n')

	h.out.mu.Lock()
	defer h.out.mu.Unlock()
	_, err := h.out.w.Write(buf)
	return err
}

// processWidth is the process column's width, that of the longest in-house name.
const processWidth = len("dispatcher")

// processOf is the process a, outside any group, names.
func (h *TextHandler) processOf(a slog.Attr) (string, bool) {
	if h.prefix != "" || a.Key != ProcessKey {
		return "", false
	}
	v := a.Value.Resolve()
	if v.Kind() != slog.KindString {
		return "", false
	}
	return v.String(), true
}

// appendAttr writes " key=value" for a, or for each attribute of a group.
func (h *TextHandler) appendAttr(buf []byte, prefix string, a slog.Attr) []byte {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return buf
	}
	if a.Value.Kind() == slog.KindGroup {
		if a.Key != "" {
			prefix += a.Key + "."
		}
		for _, g := range a.Value.Group() {
			buf = h.appendAttr(buf, prefix, g)
		}
		return buf
	}
	buf = append(buf, ' ')
	buf = h.paint(buf, faint, quoted(prefix+a.Key)+"=")
	text, isJSON := valueText(a.Value)
	if isJSON {
		// An object or array reads best as the JSON it is; encoding/json escaped the line
		// breaks in its strings.
		return append(buf, escaped(text)...)
	}
	return append(buf, quoted(text)...)
}

// valueText is v as the JSON handler writes it, without the quotes of a JSON string; isJSON
// says it is a JSON object, array or null.
func valueText(v slog.Value) (text string, isJSON bool) {
	switch v.Kind() {
	case slog.KindString:
		return v.String(), false
	case slog.KindTime:
		return v.Time().Format(time.RFC3339Nano), false
	case slog.KindAny:
		x := v.Any()
		if err, ok := x.(error); ok {
			if _, marshals := x.(json.Marshaler); !marshals {
				return err.Error(), false
			}
		}
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(x); err != nil {
			return "!ERROR:" + err.Error(), false
		}
		out := bytes.TrimRight(b.Bytes(), "\n")
		var s string
		if len(out) > 0 && out[0] == '"' && json.Unmarshal(out, &s) == nil {
			return s, false
		}
		return string(out), len(out) > 0 && (out[0] == '{' || out[0] == '[' || out[0] == 'n')
	default:
		// Numbers, booleans and durations read the same in both.
		return v.String(), false
	}
}

// quoted is s, quoted Go-style when it is empty or holds a space, '=', '"' or a character
// that does not print.
func quoted(s string) string {
	if s == "" {
		return `""`
	}
	for i, r := range s {
		if r == ' ' || r == '=' || r == '"' || !unicode.IsPrint(r) ||
			(r == utf8.RuneError && isInvalid(s[i:])) {
			return strconv.Quote(s)
		}
	}
	return s
}

// escaped is s, quoted when it holds a character that does not print.
func escaped(s string) string {
	for i, r := range s {
		if !unicode.IsPrint(r) && r != ' ' || (r == utf8.RuneError && isInvalid(s[i:])) {
			return strconv.Quote(s)
		}
	}
	return s
}

func appendMessage(buf []byte, msg string) []byte {
	return append(buf, escaped(msg)...)
}

// isInvalid says whether s starts with a byte that is not UTF-8 (rather than with an
// encoded U+FFFD).
func isInvalid(s string) bool {
	_, size := utf8.DecodeRuneInString(s)
	return size == 1
}

func pad(s string, width int) string {
	for n := utf8.RuneCountInString(s); n < width; n++ {
		s += " "
	}
	return s
}

// ANSI escapes.
const (
	reset  = "\x1b[0m"
	faint  = "\x1b[2m"
	bold   = "\x1b[1m"
	red    = "\x1b[31m"
	green  = "\x1b[32m"
	yellow = "\x1b[33m"
	blue   = "\x1b[34m"
	cyan   = "\x1b[36m"
)

func levelColor(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return bold + red
	case l >= slog.LevelWarn:
		return yellow
	case l >= slog.LevelInfo:
		return green
	default:
		return blue
	}
}

// paint writes s, in color when the handler colours.
func (h *TextHandler) paint(buf []byte, color, s string) []byte {
	if !h.opts.Color {
		return append(buf, s...)
	}
	buf = append(buf, color...)
	buf = append(buf, s...)
	return append(buf, reset...)
}
