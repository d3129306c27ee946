package logfmt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/slogtest"
	"time"

	"hermeshost/service"
)

// at is a fixed local time, 12:34:56.789.
var at = time.Date(2026, 3, 4, 12, 34, 56, 789_000_000, time.Local)

// line is what h writes for one record at `at`.
func line(t *testing.T, h slog.Handler, level slog.Level, msg string, attrs ...slog.Attr) string {
	t.Helper()
	var buf bytes.Buffer
	th := h.(*TextHandler)
	c := *th
	c.out = &lockedWriter{w: &buf}
	r := slog.NewRecord(at, level, msg, 0)
	r.AddAttrs(attrs...)
	if err := c.Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

func TestTextLineLayout(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewText(&buf, nil)).With(ProcessKey, "dispatcher")
	h := log.Handler()
	got := line(t, h, slog.LevelInfo, "jobs started", slog.Int("count", 2), slog.String("org", "acme"))
	want := "12:34:56.789 INFO  dispatcher jobs started count=2 org=acme\n"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	// A shorter name is padded to the column; the record's own process wins over the
	// handler's (a child's record re-emitted by its parent).
	got = line(t, h, slog.LevelWarn, "listening", slog.String(ProcessKey, "dev"), slog.Duration("took", 1500*time.Millisecond))
	want = "12:34:56.789 WARN  dev        listening took=1.5s\n"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	// Without a process there is no column.
	got = line(t, NewText(&buf, nil), slog.LevelError, "boom", slog.Bool("fatal", true), slog.Float64("ratio", 0.5))
	want = "12:34:56.789 ERROR boom fatal=true ratio=0.5\n"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	// Through a logger, the time is the record's own, in the local zone.
	before := time.Now()
	log.Info("up")
	stamp := strings.Fields(buf.String())[0]
	parsed, err := time.ParseInLocation("15:04:05.000", stamp, time.Local)
	if err != nil {
		t.Fatalf("time %q: %v", stamp, err)
	}
	clock := time.Date(0, 1, 1, before.Hour(), before.Minute(), before.Second(), before.Nanosecond()/1e6*1e6, time.Local)
	if d := parsed.Sub(clock); d < 0 || d > 5*time.Second {
		t.Fatalf("logged at %s, began at %s", stamp, before.Format("15:04:05.000"))
	}
}

func TestTextLevels(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewText(&buf, &TextOptions{Level: slog.LevelWarn}))
	log.Debug("d")
	log.Info("i")
	log.Warn("w")
	log.Error("e")
	log.Log(context.Background(), slog.LevelError+2, "e2")
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	var levels []string
	for _, l := range lines {
		levels = append(levels, strings.Fields(l)[1]+" "+strings.Fields(l)[2])
	}
	if got, want := strings.Join(levels, ","), "WARN w,ERROR e,ERROR+2 e2"; got != want {
		t.Fatalf("levels: got %s, want %s\n%s", got, want, buf.String())
	}
	// A LevelVar moves with it; nil is info.
	var lv slog.LevelVar
	lv.Set(slog.LevelDebug)
	if !NewText(&buf, &TextOptions{Level: &lv}).Enabled(context.Background(), slog.LevelDebug) {
		t.Fatal("debug disabled under a debug LevelVar")
	}
	if NewText(&buf, nil).Enabled(context.Background(), slog.LevelDebug) || !NewText(&buf, nil).Enabled(context.Background(), slog.LevelInfo) {
		t.Fatal("the default level is not info")
	}
}

func TestTextAttrsAndGroups(t *testing.T) {
	var buf bytes.Buffer
	h := NewText(&buf, nil).WithAttrs([]slog.Attr{slog.String(ProcessKey, "gateway"), slog.String("org", "acme")}).
		WithGroup("req").WithAttrs([]slog.Attr{slog.String("method", "GET")})
	got := line(t, h, slog.LevelInfo, "served",
		slog.Int("status", 200),
		slog.Group("timing", slog.Int("ms", 3), slog.Group("db", slog.Int("ms", 1))),
		slog.Group("empty"),
		slog.Attr{},
		slog.Group("", slog.String("inlined", "yes")),
		// Under a group, "process" is an attribute like any other.
		slog.String(ProcessKey, "not-a-column"))
	want := "12:34:56.789 INFO  gateway    served org=acme req.method=GET req.status=200 req.timing.ms=3 req.timing.db.ms=1 req.inlined=yes req.process=not-a-column\n"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	// WithAttrs and WithGroup leave the handler they come from as it was.
	base := NewText(&buf, nil)
	_ = base.WithAttrs([]slog.Attr{slog.String("a", "b")}).WithGroup("g")
	if got := line(t, base, slog.LevelInfo, "m"); got != "12:34:56.789 INFO  m\n" {
		t.Fatalf("the base handler changed: %q", got)
	}
	// A LogValuer is resolved, an error is its text, a time is RFC 3339.
	got = line(t, base, slog.LevelInfo, "m", slog.Any("err", errors.New("no route")),
		slog.Any("v", lazy{"resolved"}), slog.Time("at", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
	if want := "12:34:56.789 INFO  m err=\"no route\" v=resolved at=2026-01-02T03:04:05Z\n"; got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

type lazy struct{ s string }

func (l lazy) LogValue() slog.Value { return slog.StringValue(l.s) }

// Neither the message nor any key or value can break a record over lines or reach the
// terminal as a control sequence.
func TestTextEscapesSoOneRecordIsOneLine(t *testing.T) {
	h := NewText(&bytes.Buffer{}, nil)
	cases := []struct {
		msg  string
		attr slog.Attr
		want string
	}{
		{"two\nlines", slog.String("k", "v"), `"two\nlines" k=v`},
		{"red \x1b[31mtext", slog.String("k", "v"), `"red \x1b[31mtext" k=v`},
		{"plain message, with spaces", slog.String("k", "a\nb\r\n"), `plain message, with spaces k="a\nb\r\n"`},
		{"m", slog.String("k", "has space"), `m k="has space"`},
		{"m", slog.String("k", "a=b"), `m k="a=b"`},
		{"m", slog.String("k", `say "hi"`), `m k="say \"hi\""`},
		{"m", slog.String("k", ""), `m k=""`},
		{"m", slog.String("k", "tab\there"), `m k="tab\there"`},
		{"m", slog.String("k", "bad\xffutf8"), `m k="bad\xffutf8"`},
		{"m", slog.String("k", "line\u2028sep"), `m k="line\u2028sep"`},
		{"m", slog.String("k", "ünïcödé✓"), `m k=ünïcödé✓`},
		{"m", slog.String("a key\n", "v"), `m "a key\n"=v`},
		{"m", slog.Any("k", errors.New("first\nsecond")), `m k="first\nsecond"`},
		{"m", slog.Any("k", []string{"x y", "z\n"}), `m k=["x y","z\n"]`},
	}
	for _, c := range cases {
		got := line(t, h, slog.LevelInfo, c.msg, c.attr)
		if strings.Count(got, "\n") != 1 || !strings.HasSuffix(got, "\n") || strings.ContainsAny(strings.TrimSuffix(got, "\n"), "\r\x1b\t") {
			t.Errorf("%q: not one clean line: %q", c.msg, got)
		}
		if want := "12:34:56.789 INFO  " + c.want + "\n"; got != want {
			t.Errorf("got  %s\nwant %s", got, want)
		}
		// A quoted value reads back as what was logged.
		if c.attr.Value.Kind() == slog.KindString {
			val := got[strings.LastIndex(got, "=")+1 : len(got)-1]
			if strings.HasPrefix(val, `"`) {
				if u, err := strconv.Unquote(val); err != nil || u != c.attr.Value.String() {
					t.Errorf("%q does not unquote to %q (%v)", val, c.attr.Value.String(), err)
				}
			}
		}
	}
	// A process name is escaped too (a child's line names its own).
	if got := line(t, h, slog.LevelInfo, "m", slog.String(ProcessKey, "evil\n\x1b[2J")); strings.Count(got, "\n") != 1 || strings.Contains(got, "\x1b") {
		t.Fatalf("process not escaped: %q", got)
	}
}

// The text output shows what the JSON output shows: secrets stay masked however they are
// logged, and what encoding/json leaves out (unexported fields) is left out here too.
func TestTextKeepsSecretsOut(t *testing.T) {
	type creds struct {
		User   string
		Token  service.Secret
		hidden string
	}
	secret := service.Secret("hunter2-do-not-log")
	attrs := []slog.Attr{
		slog.Any("token", secret),
		slog.Any("creds", creds{User: "bot", Token: secret, hidden: string(secret)}),
		slog.Any("ptr", &creds{User: "bot", Token: secret}),
		slog.Group("g", slog.Any("token", secret)),
		slog.String("printed", fmt.Sprint(secret)),
		slog.Any("list", []service.Secret{secret}),
		slog.Any("map", map[string]service.Secret{"k": secret}),
	}
	var textOut, jsonOut bytes.Buffer
	slog.New(NewText(&textOut, nil)).LogAttrs(context.Background(), slog.LevelInfo, "creds", attrs...)
	slog.New(slog.NewJSONHandler(&jsonOut, nil)).LogAttrs(context.Background(), slog.LevelInfo, "creds", attrs...)
	if strings.Contains(textOut.String(), "hunter2") || strings.Contains(jsonOut.String(), "hunter2") {
		t.Fatalf("a secret was logged:\ntext: %s\njson: %s", textOut.String(), jsonOut.String())
	}
	want := `creds token=[redacted] creds={"User":"bot","Token":"[redacted]"} ptr={"User":"bot","Token":"[redacted]"} ` +
		`g.token=[redacted] printed=[redacted] list=["[redacted]"] map={"k":"[redacted]"}`
	if got := textOut.String(); !strings.HasSuffix(got, want+"\n") {
		t.Fatalf("got  %q\nwant it to end %q", got, want)
	}
}

func TestTextColor(t *testing.T) {
	var plain, colored bytes.Buffer
	slog.New(NewText(&plain, nil)).With(ProcessKey, "dev").Warn("careful", "k", "v")
	slog.New(NewText(&colored, &TextOptions{Color: true})).With(ProcessKey, "dev").Warn("careful", "k", "v")
	if strings.Contains(plain.String(), "\x1b") {
		t.Fatalf("colour without asking: %q", plain.String())
	}
	for _, want := range []string{yellow + "WARN " + reset, bold + cyan + "dev       " + reset, faint + "k=" + reset} {
		if !strings.Contains(colored.String(), want) {
			t.Fatalf("coloured line %q lacks %q", colored.String(), want)
		}
	}
	if got := ansi.ReplaceAllString(colored.String(), ""); got[12:] != plain.String()[12:] {
		t.Fatalf("colour changes the text:\n%q\n%q", got, plain.String())
	}
}

var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

// Lines written at once from many goroutines stay whole.
func TestTextConcurrentRecordsStayWhole(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewText(&buf, nil)).With(ProcessKey, "dev")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := log.With("g", g)
			for i := range 200 {
				l.Info("record", "i", i, "pad", strings.Repeat("x", 100))
			}
		}()
	}
	wg.Wait()
	re := regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d{3} INFO  dev        record g=\d i=\d+ pad=x{100}$`)
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 1600 {
		t.Fatalf("%d lines, want 1600", len(lines))
	}
	for _, l := range lines {
		if !re.MatchString(l) {
			t.Fatalf("torn line %q", l)
		}
	}
}

// The standard library's handler conformance tests, reading the lines back into maps.
func TestTextHandlerConformance(t *testing.T) {
	var buf bytes.Buffer
	slogtest.Run(t, func(*testing.T) slog.Handler {
		buf.Reset()
		return NewText(&buf, nil)
	}, func(t *testing.T) map[string]any {
		return parseLine(t, strings.TrimSuffix(buf.String(), "\n"))
	})
}

// parseLine reads a line of TextHandler's without a process column and with a message of
// one word (as slogtest's are) into the map slogtest wants: keys with dots nest.
func parseLine(t *testing.T, s string) map[string]any {
	t.Helper()
	m := map[string]any{}
	if len(s) > 12 && regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d{3} `).MatchString(s) {
		m[slog.TimeKey] = s[:12]
		s = s[13:]
	}
	fields := strings.SplitN(s, " ", 2)
	m[slog.LevelKey] = fields[0]
	s = strings.TrimLeft(fields[1], " ")
	msg, rest := token(t, s)
	m[slog.MessageKey] = msg
	for rest != "" {
		if rest[0] != ' ' {
			t.Fatalf("no space before %q in %q", rest, s)
		}
		var key, val string
		key, rest = token(t, rest[1:])
		if !strings.HasPrefix(rest, "=") {
			t.Fatalf("no = after key %q in %q", key, s)
		}
		val, rest = token(t, rest[1:])
		parts := strings.Split(key, ".")
		group := m
		for _, p := range parts[:len(parts)-1] {
			sub, ok := group[p].(map[string]any)
			if !ok {
				sub = map[string]any{}
				group[p] = sub
			}
			group = sub
		}
		group[parts[len(parts)-1]] = val
	}
	return m
}

// token reads a bare or quoted word (ended by a space or '=') from the start of s.
func token(t *testing.T, s string) (string, string) {
	t.Helper()
	if strings.HasPrefix(s, `"`) {
		q, err := strconv.QuotedPrefix(s)
		if err != nil {
			t.Fatalf("bad quoting in %q: %v", s, err)
		}
		u, _ := strconv.Unquote(q)
		return u, s[len(q):]
	}
	end := strings.IndexAny(s, " =")
	if end < 0 {
		return s, ""
	}
	return s[:end], s[end:]
}

// The text handler beside slog's JSON handler, in the same run, on a dispatcher's usual
// record; and Forward re-emitting such a record a child wrote as JSON.
func BenchmarkHandlers(b *testing.B) {
	attrs := []any{"job", "5828f2c4-a9d6-462d-84db-b5b1e55a8048", "org", "acme", "attempt", 2,
		"took", 1500 * time.Millisecond, "err", errors.New("heartbeatAgentJob: 502 bad_gateway")}
	for _, c := range []struct {
		name string
		h    slog.Handler
	}{
		{"json", slog.NewJSONHandler(io.Discard, nil)},
		{"text", NewText(io.Discard, nil)},
		{"text+color", NewText(io.Discard, &TextOptions{Color: true})},
	} {
		b.Run(c.name, func(b *testing.B) {
			log := slog.New(c.h).With(ProcessKey, "dispatcher")
			b.ReportAllocs()
			for b.Loop() {
				log.Info("job outcome", attrs...)
			}
		})
	}
	var line bytes.Buffer
	slog.New(slog.NewJSONHandler(&line, nil)).With(ProcessKey, "worker").Info("job outcome", attrs...)
	b.Run("forward-json-to-text", func(b *testing.B) {
		in := bytes.Repeat(line.Bytes(), 1000)
		h := NewText(io.Discard, nil)
		b.ReportAllocs()
		b.SetBytes(int64(len(in)))
		for b.Loop() {
			if err := Forward(bytes.NewReader(in), h, "unit"); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000), "ns/line")
	})
}
