package orghome

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const outsideSecret = "outside-secret-7f3a"

// escapeHome is a home whose tree holds every kind of way out: links to /etc, to a
// sibling folder, chains of links, and a linked directory. The secret file lives outside.
func escapeHome(t testing.TB) *Home {
	t.Helper()
	_, h := newHome(t, "acme")
	outside := filepath.Join(filepath.Dir(filepath.Dir(h.Dir)), "outside")
	writeFile(t, outside, "secret.txt", outsideSecret)
	writeFile(t, h.Dir, "memories/MEMORY.md", "inside")
	symlink(t, "/etc", filepath.Join(h.Dir, "etc-link"))
	symlink(t, "/etc/passwd", filepath.Join(h.Dir, "passwd-link"))
	symlink(t, filepath.Join(outside, "secret.txt"), filepath.Join(h.Dir, "abs-secret"))
	symlink(t, "../../outside/secret.txt", filepath.Join(h.Dir, "rel-secret"))
	symlink(t, "chain2", filepath.Join(h.Dir, "chain1"))
	symlink(t, "chain3", filepath.Join(h.Dir, "chain2"))
	symlink(t, "../../outside/secret.txt", filepath.Join(h.Dir, "chain3"))
	symlink(t, outside, filepath.Join(h.Dir, "skills", "outdir"))
	symlink(t, "memories/MEMORY.md", filepath.Join(h.Dir, "inside-link"))
	// The links really reach the secret outside the os.Root, so refusing them is the Root's doing.
	for _, l := range []string{"abs-secret", "rel-secret", "chain1", "skills/outdir/secret.txt"} {
		if b, err := os.ReadFile(filepath.Join(h.Dir, l)); err != nil || string(b) != outsideSecret {
			t.Fatalf("fixture: %s does not reach the outside secret: %q, %v", l, b, err)
		}
	}
	return h
}

func TestPathEscapesAreRefused(t *testing.T) {
	h := escapeHome(t)
	cases := []struct{ name, path string }{
		{"parent", ".."},
		{"parent file", "../outside/secret.txt"},
		{"climb through a folder", "a/../../x"},
		{"climb deep", "memories/../../../outside/secret.txt"},
		{"absolute", "/etc/passwd"},
		{"absolute inside name", filepath.Join(h.Dir, "memories/MEMORY.md")},
		{"empty", ""},
		{"NUL byte", "memories/MEMORY.md\x00../../x"},
		{"symlink to /etc", "etc-link/passwd"},
		{"symlink to a file in /etc", "passwd-link"},
		{"absolute symlink out", "abs-secret"},
		{"relative symlink out", "rel-secret"},
		{"symlink chain out", "chain1"},
		{"symlinked directory out", "skills/outdir/secret.txt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := h.ReadFile(c.path)
			if !errors.Is(err, ErrOutsideHome) {
				t.Fatalf("ReadFile(%q) = %q, %v; want ErrOutsideHome", c.path, b, err)
			}
			if !strings.Contains(err.Error(), "acme") {
				t.Errorf("error %q does not name the org", err)
			}
			if _, err := h.Stat(c.path); !errors.Is(err, ErrOutsideHome) {
				t.Errorf("Stat(%q): %v; want ErrOutsideHome", c.path, err)
			}
		})
	}
}

func TestPathsInsideTheHomeAreRead(t *testing.T) {
	h := escapeHome(t)
	for _, p := range []string{"memories/MEMORY.md", "inside-link", "memories/../memories/MEMORY.md", "./memories/MEMORY.md"} {
		b, err := h.ReadFile(p)
		if err != nil || string(b) != "inside" {
			t.Errorf("ReadFile(%q) = %q, %v; want the file", p, b, err)
		}
	}
	if _, err := h.ReadFile("memories/none.md"); !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrOutsideHome) {
		t.Errorf("a missing file inside: %v; want not-exist, not an escape", err)
	}
}

func FuzzOpenPath(f *testing.F) {
	for _, s := range []string{"", ".", "..", "a/../../x", "/etc/passwd", "chain1", "rel-secret", "abs-secret",
		"skills/outdir/secret.txt", "etc-link/passwd", "memories/MEMORY.md", "inside-link", "a\x00b", "memories//../..//x",
		"./././..", "skills/outdir/../outdir/secret.txt", strings.Repeat("../", 40) + "etc/passwd"} {
		f.Add(s)
	}
	h := escapeHome(f)
	f.Fuzz(func(t *testing.T, name string) {
		b, err := h.ReadFile(name)
		if err == nil && bytes.Contains(b, []byte(outsideSecret)) {
			t.Fatalf("ReadFile(%q) read the file outside the home", name)
		}
		if CheckPath(name) != nil && !errors.Is(err, ErrOutsideHome) {
			t.Fatalf("ReadFile(%q): %v; a lexically escaping path must be refused", name, err)
		}
		if fi, err := h.Stat(name); err == nil && fi.Name() == "secret.txt" {
			t.Fatalf("Stat(%q) reached the file outside the home", name)
		}
		if entries, err := h.ReadDir(name); err == nil {
			for _, e := range entries {
				if e.Name() == "secret.txt" {
					t.Fatalf("ReadDir(%q) listed the folder outside the home", name)
				}
			}
		}
	})
}

func TestValidID(t *testing.T) {
	for _, ok := range []string{"a", "acme", "acme-2", "0rg", strings.Repeat("a", 63)} {
		if err := ValidID(ok); err != nil {
			t.Errorf("ValidID(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-acme", "Acme", "ac_me", "ac.me", "..", "a/b", strings.Repeat("a", 64), "acme\x00"} {
		if err := ValidID(bad); !errors.Is(err, ErrInvalidID) {
			t.Errorf("ValidID(%q): %v; want ErrInvalidID", bad, err)
		}
	}
}

func TestListOrgsReportsWhatIsNotAnOrg(t *testing.T) {
	orgs, _ := newHome(t, "acme")
	dir := orgs.Dir()
	for _, d := range []string{"beta", "Bad_Name", ".hidden"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, dir, "notes.txt", "x")
	symlink(t, filepath.Join(dir, "beta"), filepath.Join(dir, "gamma"))

	idx, err := orgs.List()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"acme", "beta"}; !reflect.DeepEqual(idx.Orgs, want) {
		t.Errorf("orgs = %v, want %v", idx.Orgs, want)
	}
	ignored := map[string]string{}
	for _, e := range idx.Ignored {
		ignored[e.Name] = e.Reason
	}
	for _, name := range []string{"Bad_Name", ".hidden", "notes.txt", "gamma"} {
		if ignored[name] == "" {
			t.Errorf("%s not reported as ignored: %v", name, idx.Ignored)
		}
	}
	if _, err := orgs.Open("gamma"); !errors.Is(err, ErrOutsideHome) {
		t.Errorf("opening a symlinked org: %v; want ErrOutsideHome", err)
	}
	if _, err := orgs.Open("../x"); !errors.Is(err, ErrInvalidID) {
		t.Errorf("opening ../x: %v; want ErrInvalidID", err)
	}
}
