// Package logfmt makes the handler every hermes-host process logs through: one JSON object
// per record for production, files and pipes, or one readable line per record on a terminal
// (TextHandler). Forward turns what a child process prints into records of the parent's
// handler, so that `hermes-host dev` shows its children's lines in its own format.
package logfmt

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"
)

// The values of LOG_FORMAT.
const (
	// FormatAuto is FormatText when the output is a terminal, FormatJSON otherwise.
	FormatAuto = "auto"
	FormatJSON = "json"
	FormatText = "text"
)

// Formats are the values New accepts, in the order the documentation lists them.
var Formats = []string{FormatAuto, FormatJSON, FormatText}

// ProcessKey is the attribute naming the process a record comes from. TextHandler shows it
// in a column of its own rather than among the other attributes.
const ProcessKey = "process"

// Options says how New writes.
type Options struct {
	// Level is the lowest level written; nil means slog.LevelInfo.
	Level slog.Leveler
	// Format is one of Formats; empty means FormatAuto.
	Format string
	// LookupEnv reads NO_COLOR; nil means os.LookupEnv.
	LookupEnv func(string) (string, bool)
}

// New is the handler that writes to w as opts say. A regular file always gets JSON,
// whatever the format. FormatAuto writes text only to a terminal. Text is coloured only on
// a terminal, and only while NO_COLOR is unset or empty (https://no-color.org).
func New(w io.Writer, opts Options) (slog.Handler, error) {
	format := opts.Format
	if format == "" {
		format = FormatAuto
	}
	switch format {
	case FormatAuto, FormatJSON, FormatText:
	default:
		return nil, fmt.Errorf("unknown log format %q (want auto, json or text)", opts.Format)
	}
	file, terminal := describe(w)
	if file || format == FormatJSON || (format == FormatAuto && !terminal) {
		return slog.NewJSONHandler(w, &slog.HandlerOptions{Level: opts.Level}), nil
	}
	lookup := opts.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	noColor, _ := lookup("NO_COLOR")
	return NewText(w, &TextOptions{Level: opts.Level, Color: terminal && noColor == ""}), nil
}

// describe says whether w is a regular file and whether it is a terminal.
func describe(w io.Writer) (file, terminal bool) {
	f, ok := w.(*os.File)
	if !ok {
		return false, false
	}
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		return true, false
	}
	return false, IsTerminal(f)
}

// IsTerminal says whether f is a terminal.
func IsTerminal(f *os.File) bool {
	// Through SyscallConn, not Fd, which would put the descriptor in blocking mode.
	raw, err := f.SyscallConn()
	if err != nil {
		return false
	}
	var termErr error
	if err := raw.Control(func(fd uintptr) { _, termErr = unix.IoctlGetTermios(int(fd), unix.TCGETS) }); err != nil {
		return false
	}
	return termErr == nil
}
