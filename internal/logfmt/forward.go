package logfmt

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"time"
)

// MaxLine is the longest line Forward reads as one: a longer one is logged in pieces of
// this size, each a line of text.
const MaxLine = 64 << 10

// Forward reads the lines a child process prints from r until it ends, and logs each as one
// record of h, the parent's handler (without a process attribute of its own):
//
//   - a JSON object with a "msg" string, as slog's JSON handler writes one, is that record
//     again: its "time", "level" and "msg", then its other members as attributes in their
//     order, an object as a group;
//   - any other line is an info record whose message is the line.
//
// Every record carries the ProcessKey attribute: the line's own "process" member when it
// has a string one, else name. Records below h's level are dropped, as the parent's own are.
// Forward returns nil when r ends, or the error that stopped reading it.
func Forward(r io.Reader, h slog.Handler, name string) error {
	br := bufio.NewReaderSize(r, MaxLine)
	ctx := context.Background()
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			rec := lineRecord(line, name)
			if h.Enabled(ctx, rec.Level) {
				if herr := h.Handle(ctx, rec); herr != nil {
					return herr
				}
			}
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
		case errors.Is(err, io.EOF):
			return nil
		default:
			return err
		}
	}
}

// lineRecord is the record for one line a child printed.
func lineRecord(line []byte, name string) slog.Record {
	line = bytes.TrimRight(line, "\r\n")
	if rec, ok := jsonRecord(line, name); ok {
		return rec
	}
	rec := slog.NewRecord(time.Now(), slog.LevelInfo, string(line), 0)
	rec.AddAttrs(slog.String(ProcessKey, name))
	return rec
}

// jsonRecord reads line as a record slog's JSON handler wrote.
func jsonRecord(line []byte, name string) (slog.Record, bool) {
	trimmed := bytes.TrimSpace(line)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return slog.Record{}, false
	}
	members, ok := objectMembers(trimmed)
	if !ok {
		return slog.Record{}, false
	}
	var (
		when    time.Time
		level   = slog.LevelInfo
		msg     string
		haveMsg bool
		process = name
		attrs   []slog.Attr
	)
	for _, m := range members {
		var s string
		isString := len(m.raw) > 0 && m.raw[0] == '"' && json.Unmarshal(m.raw, &s) == nil
		switch {
		case m.key == slog.MessageKey && isString && !haveMsg:
			msg, haveMsg = s, true
			continue
		case m.key == slog.TimeKey && isString && when.IsZero():
			if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
				when = t
				continue
			}
		case m.key == slog.LevelKey && isString:
			var l slog.Level
			if l.UnmarshalText([]byte(s)) == nil {
				level = l
				continue
			}
		case m.key == ProcessKey && isString:
			process = s
			continue
		}
		attrs = append(attrs, slog.Attr{Key: m.key, Value: jsonValue(m.raw)})
	}
	if !haveMsg {
		return slog.Record{}, false
	}
	if when.IsZero() {
		when = time.Now()
	}
	rec := slog.NewRecord(when, level, msg, 0)
	rec.AddAttrs(slog.String(ProcessKey, process))
	rec.AddAttrs(attrs...)
	return rec, true
}

type member struct {
	key string
	raw json.RawMessage
}

// objectMembers are the members of the JSON object b in their order; false when b is not
// exactly one object.
func objectMembers(b []byte) ([]member, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var out []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		key, ok := tok.(string)
		if !ok {
			return nil, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		out = append(out, member{key, raw})
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, false
	}
	return out, true
}

// jsonValue is the slog value of one JSON value: an object is a group of its members.
func jsonValue(raw json.RawMessage) slog.Value {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return slog.StringValue("")
	}
	switch raw[0] {
	case '{':
		if members, ok := objectMembers(raw); ok {
			attrs := make([]slog.Attr, 0, len(members))
			for _, m := range members {
				attrs = append(attrs, slog.Attr{Key: m.key, Value: jsonValue(m.raw)})
			}
			return slog.GroupValue(attrs...)
		}
	case '"':
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return slog.StringValue(s)
		}
	case 't', 'f':
		var b bool
		if json.Unmarshal(raw, &b) == nil {
			return slog.BoolValue(b)
		}
	case 'n':
		return slog.AnyValue(nil)
	case '[':
		return slog.AnyValue(raw)
	default:
		s := string(raw)
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return slog.Int64Value(i)
		}
		if u, err := strconv.ParseUint(s, 10, 64); err == nil {
			return slog.Uint64Value(u)
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			return slog.Float64Value(f)
		}
	}
	return slog.AnyValue(raw)
}
