package logfmt

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hermeshost/internal/testio"
)

func openPTY(t *testing.T) (term, reader *os.File) {
	t.Helper()
	term, reader, err := testio.OpenPTY()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { term.Close(); reader.Close() })
	return term, reader
}

// readSome is what reader has within a second, up to one read.
func readSome(t *testing.T, reader *os.File) string {
	t.Helper()
	if err := reader.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := reader.Read(buf)
	if err != nil {
		t.Fatalf("read the terminal: %v", err)
	}
	return string(buf[:n])
}

func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

// What New writes for each format to a terminal, a pipe and a file.
func TestNewPicksTheFormatByOutput(t *testing.T) {
	term, reader := openPTY(t)
	if !IsTerminal(term) {
		t.Fatal("a pseudo-terminal is not taken for a terminal")
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	file, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if IsTerminal(pw) || IsTerminal(file) {
		t.Fatal("a pipe or a file is taken for a terminal")
	}

	kind := func(h slog.Handler) string {
		switch h := h.(type) {
		case *slog.JSONHandler:
			return "json"
		case *TextHandler:
			if h.opts.Color {
				return "text+color"
			}
			return "text"
		}
		return fmt.Sprintf("%T", h)
	}
	color, noColor := env(nil), env(map[string]string{"NO_COLOR": "1"})
	cases := []struct {
		w      io.Writer
		where  string
		format string
		env    func(string) (string, bool)
		want   string
	}{
		{term, "terminal", "", color, "text+color"},
		{term, "terminal", FormatAuto, color, "text+color"},
		{term, "terminal", FormatAuto, noColor, "text"},
		{term, "terminal", FormatAuto, env(map[string]string{"NO_COLOR": ""}), "text+color"},
		{term, "terminal", FormatText, noColor, "text"},
		{term, "terminal", FormatJSON, color, "json"},
		{pw, "pipe", FormatAuto, color, "json"},
		{pw, "pipe", FormatText, color, "text"},
		{pw, "pipe", FormatJSON, color, "json"},
		{file, "file", FormatAuto, color, "json"},
		{file, "file", FormatText, color, "json"},
		{&bytes.Buffer{}, "buffer", FormatAuto, color, "json"},
		{&bytes.Buffer{}, "buffer", FormatText, color, "text"},
	}
	for _, c := range cases {
		h, err := New(c.w, Options{Format: c.format, LookupEnv: c.env})
		if err != nil {
			t.Fatal(err)
		}
		if got := kind(h); got != c.want {
			t.Errorf("format %q to a %s: got %s, want %s", c.format, c.where, got, c.want)
		}
	}
	if _, err := New(term, Options{Format: "yaml"}); err == nil || !strings.Contains(err.Error(), `"yaml"`) {
		t.Fatalf("an unknown format: %v", err)
	}

	// What reaches the terminal: coloured text, one line per record.
	h, _ := New(term, Options{Level: slog.LevelDebug, LookupEnv: color})
	slog.New(h).With(ProcessKey, "dev").Debug("on a terminal", "k", "v")
	got := readSome(t, reader)
	if !strings.Contains(got, "\x1b[") || !strings.Contains(ansi.ReplaceAllString(got, ""), "DEBUG dev        on a terminal k=v\r\n") {
		t.Fatalf("the terminal got %q", got)
	}
	h, _ = New(term, Options{LookupEnv: noColor})
	slog.New(h).Info("no colour", "k", "v")
	if got := readSome(t, reader); strings.Contains(got, "\x1b") || !strings.HasSuffix(got, " INFO  no colour k=v\r\n") {
		t.Fatalf("the terminal got %q under NO_COLOR", got)
	}
	h, _ = New(term, Options{Format: FormatJSON})
	slog.New(h).Info("as JSON", "k", "v")
	if got := readSome(t, reader); !strings.HasPrefix(got, `{"time":`) || !strings.HasSuffix(got, `"level":"INFO","msg":"as JSON","k":"v"}`+"\r\n") {
		t.Fatalf("the terminal got %q with LOG_FORMAT=json", got)
	}
}
