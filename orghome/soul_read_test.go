package orghome

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadSoulSplitsTheBlockFromTheFreeSectionAndSaysWhatIsWrong(t *testing.T) {
	_, h := newHome(t, "acme")
	s, err := h.ReadSoul()
	if err != nil || s.Exists || s.Problem == "" {
		t.Fatalf("no SOUL.md: %+v %v", s, err)
	}

	writeFile(t, h.Dir, "SOUL.md", freeText)
	ensure(t, h)
	s, err = h.ReadSoul()
	if err != nil {
		t.Fatal(err)
	}
	if !s.Exists || s.BlockVersion != SoulBlockVersion || !s.Intact || s.Problem != "" || s.Free != freeText {
		t.Fatalf("ensured SOUL.md: %+v", s)
	}
	if !strings.Contains(s.Block, "You act only for the organization `acme`") || strings.Contains(s.Block, "hermes-host:identity") {
		t.Fatalf("block without its markers: %q", s.Block)
	}

	good, err := os.ReadFile(filepath.Join(h.Dir, "SOUL.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct{ content, problem string }{
		"edited":   {strings.Replace(string(good), "only for", "for", 1), "the generated block was edited"},
		"no block": {freeText, "SOUL.md has no generated block"},
		"unclosed": {strings.Replace(string(good), "END v1", "FINISH v1", 1), "malformed markers"},
		"moved":    {"intro\n" + string(good), "moved from the top"},
		"older":    {strings.ReplaceAll(string(good), " v1", " v0"), "the generated block is v0; this host writes v1"},
		"two":      {string(good) + "\n" + string(good), "malformed markers (2 blocks"},
	} {
		t.Run(name, func(t *testing.T) {
			writeFile(t, h.Dir, "SOUL.md", c.content)
			s, err := h.ReadSoul()
			if err != nil || !strings.Contains(s.Problem, c.problem) {
				t.Fatalf("%+v %v, want a problem with %q", s, err, c.problem)
			}
		})
	}

	if err := os.Remove(filepath.Join(h.Dir, "SOUL.md")); err != nil {
		t.Fatal(err)
	}
	symlink(t, "/etc/passwd", filepath.Join(h.Dir, "SOUL.md"))
	s, err = h.ReadSoul()
	if err != nil || !strings.Contains(s.Problem, "not a regular file") || s.Free != "" {
		t.Fatalf("SOUL.md a link out of the home: %+v %v", s, err)
	}
}
