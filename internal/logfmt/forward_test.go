package logfmt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"hermeshost/service"
)

// childEnv makes the test binary play a child process that logs JSON to its stderr, as
// every hermes-host process does on a pipe.
const childEnv = "LOGFMT_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		child()
		return
	}
	os.Exit(m.Run())
}

func child() {
	h, err := New(os.Stderr, Options{Level: slog.LevelDebug})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	log := slog.New(h).With(ProcessKey, "dashboard", "org", "acme")
	log.Info("listening", "addr", "unix:/run/dash.sock", "secret", service.Secret("hunter2"))
	log.Debug("detail", slog.Group("req", slog.String("path", "/a b"), slog.Int("status", 200)))
	log.Warn("chat stderr", "line", "two\nlines")
	// What a program that does not log through slog prints (bubblewrap, a panic).
	fmt.Fprintln(os.Stderr, "bwrap: Can't mount proc on /newroot/proc: Operation not permitted")
	fmt.Fprint(os.Stderr, "goroutine 1 [running]:\n\tmain.main()\n")
	os.Stdout.WriteString(`{"msg":"on stdout","level":"ERROR","n":1.5,"big":18446744073709551615,"list":[1,"a"],"nil":null,"ok":false}` + "\n")
	os.Stdout.WriteString("{not json\n")
	os.Stdout.WriteString(`{"level":"INFO","no":"msg"}` + "\n")
	os.Stdout.WriteString("no newline at the end")
}

// startChild runs the child with its stdout and stderr on one pipe, as the process runtime
// gives its units, and returns the pipe's reading end.
func startChild(t *testing.T) (io.Reader, func()) {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = []string{childEnv + "=1"}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	return pr, func() {
		if err := cmd.Wait(); err != nil {
			t.Errorf("child: %v", err)
		}
		pr.Close()
	}
}

// A child's lines become records of the parent's text handler: JSON lines keep their time,
// level, process, message and attributes; other lines are one record each.
func TestForwardTurnsAChildsLinesIntoReadableRecords(t *testing.T) {
	var out bytes.Buffer
	h := NewText(&out, &TextOptions{Level: slog.LevelDebug})
	r, wait := startChild(t)
	before := time.Now().Add(-time.Second)
	if err := Forward(r, h, "unit"); err != nil {
		t.Fatal(err)
	}
	wait()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	want := []string{
		`INFO  dashboard  listening org=acme addr=unix:/run/dash.sock secret=[redacted]`,
		`DEBUG dashboard  detail org=acme req.path="/a b" req.status=200`,
		`WARN  dashboard  chat stderr org=acme line="two\nlines"`,
		`INFO  unit       bwrap: Can't mount proc on /newroot/proc: Operation not permitted`,
		`INFO  unit       goroutine 1 [running]:`,
		`INFO  unit       "\tmain.main()"`,
		`ERROR unit       on stdout n=1.5 big=18446744073709551615 list=[1,"a"] nil=null ok=false`,
		`INFO  unit       {not json`,
		`INFO  unit       {"level":"INFO","no":"msg"}`,
		`INFO  unit       no newline at the end`,
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, l := range lines {
		stamp, rest, _ := strings.Cut(l, " ")
		if rest != want[i] {
			t.Errorf("line %d:\ngot  %s\nwant %s", i, rest, want[i])
		}
		at, err := time.ParseInLocation("15:04:05.000", stamp, time.Local)
		if err != nil {
			t.Errorf("line %d: time %q: %v", i, stamp, err)
			continue
		}
		now := time.Now()
		at = time.Date(now.Year(), now.Month(), now.Day(), at.Hour(), at.Minute(), at.Second(), at.Nanosecond(), time.Local)
		if at.Before(before.Truncate(time.Millisecond)) || at.After(now) {
			t.Errorf("line %d: time %s is not the child's", i, stamp)
		}
	}
	if strings.Contains(out.String(), "hunter2") || strings.Contains(out.String(), `{"time"`) {
		t.Fatalf("a secret or a raw JSON record got through:\n%s", out.String())
	}
}

// Re-emitted through a JSON handler, a child's record reads as the child wrote it.
func TestForwardThroughJSONKeepsTheRecord(t *testing.T) {
	var child, parent bytes.Buffer
	when := time.Date(2026, 5, 6, 7, 8, 9, 123_000_000, time.UTC)
	fixTime := func(groups []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey && len(groups) == 0 {
			a.Value = slog.TimeValue(when)
		}
		return a
	}
	clog := slog.New(slog.NewJSONHandler(&child, &slog.HandlerOptions{ReplaceAttr: fixTime})).With(ProcessKey, "worker")
	clog.LogAttrs(context.Background(), slog.LevelWarn, "worker idle", slog.Int("n", 3), slog.Group("g", slog.String("a", "b")),
		slog.Float64("f", 0.25), slog.Bool("ok", true), slog.Any("list", []any{1, "x"}))
	rec := child.String()
	if want := `{"time":"2026-05-06T07:08:09.123Z","level":"WARN","msg":"worker idle","process":"worker","n":3,"g":{"a":"b"},"f":0.25,"ok":true,"list":[1,"x"]}` + "\n"; rec != want {
		t.Fatalf("the child wrote %s", rec)
	}
	if err := Forward(strings.NewReader(rec), slog.NewJSONHandler(&parent, nil), "unit"); err != nil {
		t.Fatal(err)
	}
	if parent.String() != rec {
		t.Fatalf("got  %s\nwant %s", parent.String(), rec)
	}
	// The parent's level applies to the child's records.
	parent.Reset()
	if err := Forward(strings.NewReader(rec+`{"level":"DEBUG","msg":"noise"}`+"\n"), slog.NewJSONHandler(&parent, &slog.HandlerOptions{Level: slog.LevelError}), "unit"); err != nil {
		t.Fatal(err)
	}
	if parent.Len() != 0 {
		t.Fatalf("records below the parent's level: %s", parent.String())
	}
}

// A line longer than MaxLine is logged in pieces, none longer than MaxLine.
func TestForwardCutsOverlongLines(t *testing.T) {
	var out bytes.Buffer
	long := strings.Repeat("x", 2*MaxLine+10)
	if err := Forward(strings.NewReader(long+"\nafter\n"), NewText(&out, nil), "unit"); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 4 || !strings.HasSuffix(lines[3], "unit       after") {
		t.Fatalf("%d lines; the last %q", len(lines), lines[len(lines)-1])
	}
	total := 0
	for _, l := range lines[:3] {
		total += strings.Count(l, "x")
	}
	if total != len(long) {
		t.Fatalf("%d of %d bytes forwarded", total, len(long))
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("read failed") }

func TestForwardReturnsReadErrors(t *testing.T) {
	if err := Forward(failingReader{}, NewText(io.Discard, nil), "unit"); err == nil || err.Error() != "read failed" {
		t.Fatalf("got %v", err)
	}
}
