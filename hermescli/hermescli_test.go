package hermescli

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestArgsAreTheHeadlessContract(t *testing.T) {
	got := Args("do it", 30, "")
	want := []string{"chat", "-q", "do it", "-Q", "--source", "tool", "--max-turns", "30"}
	if !slices.Equal(got, want) {
		t.Fatalf("args %q", got)
	}
	got = Args("go on", 5, "20261203_141812_7c2bfe")
	if !slices.Equal(got[len(got)-2:], []string{"--resume", "20261203_141812_7c2bfe"}) || slices.Contains(got, "--ignore-rules") {
		t.Fatalf("resume args %q", got)
	}
}

// write sends text in small pieces, as a pipe may deliver it.
func write(w io.Writer, text string) {
	for len(text) > 0 {
		n := min(7, len(text))
		_, _ = w.Write([]byte(text[:n]))
		text = text[n:]
	}
}

func TestOutputReadsTheSessionLineAndTheTurnLimitLine(t *testing.T) {
	var o Output
	var passed bytes.Buffer
	write(o.Stdout(), "⚠ tirith security scanner disabled\n⚠️  Reached maximum iterations (3). Requesting summary...\n"+
		"So far I persisted tone and colors.\n{\"categories\": [\"tone\", \"colors\"]}\n")
	write(o.Stderr(&passed), "↻ Resumed session 20261203_141812_7c2bfe (4 messages)\nsession_id: 20261203_141812_7c2bfe")
	r := o.Result()
	if r.SessionID != "20261203_141812_7c2bfe" || !r.TurnLimit || r.StdoutCut {
		t.Fatalf("result %+v", r)
	}
	if !strings.HasSuffix(string(r.Stdout), "{\"categories\": [\"tone\", \"colors\"]}\n") {
		t.Fatalf("stdout %q", r.Stdout)
	}
	if !strings.Contains(passed.String(), "session_id: 20261203_141812_7c2bfe") {
		t.Fatalf("stderr not passed on: %q", passed.String())
	}
}

func TestOutputWithoutMarkers(t *testing.T) {
	var o Output
	write(o.Stdout(), "Done.\n{\"categories\": [\"tone\"]}\n")
	// A session line on stdout (the model's text, say) is not the CLI's.
	write(o.Stdout(), "session_id: 20990101_000000_ffffff\n")
	write(o.Stderr(nil), "session_id: not an id at all!\n")
	r := o.Result()
	if r.SessionID != "" || r.TurnLimit {
		t.Fatalf("result %+v", r)
	}
}

func TestOutputCutsAFlood(t *testing.T) {
	var o Output
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	for range 6 {
		_, _ = o.Stdout().Write(chunk)
	}
	r := o.Result()
	if !r.StdoutCut || len(r.Stdout) != MaxStdout {
		t.Fatalf("kept %d bytes, cut %v", len(r.Stdout), r.StdoutCut)
	}
}
