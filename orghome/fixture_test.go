package orghome

import (
	"os"
	"path/filepath"
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
	return orgs, h
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
