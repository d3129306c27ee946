package orghome

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// newHome makes ORGS_ROOT with one org's home in a temporary folder and opens it.
func newHome(t testing.TB, id string) (*Orgs, *Home) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "orgs")
	if err := os.MkdirAll(filepath.Join(root, id), 0o755); err != nil {
		t.Fatal(err)
	}
	orgs, err := OpenOrgs(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { orgs.Close() })
	h, err := orgs.Open(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	captureLog(t, h)
	return orgs, h
}

// testLog sends a home's log lines to the test's own log, and keeps them to assert on.
type testLog struct {
	t   testing.TB
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.t.Log(string(bytes.TrimRight(p, "\n")))
	return l.buf.Write(p)
}

func (l *testLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// captureLog points the home's log at the test and returns what it keeps.
func captureLog(t testing.TB, h *Home) *testLog {
	l := &testLog{t: t}
	h.Log = slog.New(slog.NewTextHandler(l, nil))
	return l
}

// writeFile writes a file under dir, making its folders.
func writeFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func symlink(t testing.TB, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}
