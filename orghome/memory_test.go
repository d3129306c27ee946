package orghome

import (
	"reflect"
	"strings"
	"testing"
)

func TestMemoryEntriesAndFillAsHermesCountsThem(t *testing.T) {
	cases := []struct {
		name    string
		file    *string // nil: no file
		entries []string
		chars   int
		over    bool
	}{
		{name: "missing", file: nil},
		{name: "empty", file: ptr(""), entries: nil},
		{name: "only whitespace", file: ptr(" \n\n "), entries: nil},
		{name: "one entry without separators", file: ptr("  Uses metric units.\nPrefers short answers.\n"),
			entries: []string{"Uses metric units.\nPrefers short answers."}, chars: 41},
		{name: "entries with separators, empty and duplicate ones dropped",
			file:    ptr("first\n§\nsecond § inline stays\n§\n\n§\nfirst\n§\nthird"),
			entries: []string{"first", "second § inline stays", "third"},
			// "first" + "\n§\n" + "second § inline stays" + "\n§\n" + "third": § is one character.
			chars: 5 + 3 + 21 + 3 + 5},
		{name: "over the limit", file: ptr(strings.Repeat("é", 1300) + "\n§\n" + strings.Repeat("z", 900)),
			entries: []string{strings.Repeat("é", 1300), strings.Repeat("z", 900)}, chars: 2203, over: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, h := newHome(t, "acme")
			if c.file != nil {
				writeFile(t, h.Dir, "memories/MEMORY.md", *c.file)
			}
			m, err := h.Memory()
			if err != nil {
				t.Fatal(err)
			}
			f := m.Memory
			if f.Exists != (c.file != nil) || !reflect.DeepEqual(f.Entries, c.entries) || f.Chars != c.chars || f.Over != c.over || f.Limit != DefaultMemoryLimit {
				t.Fatalf("MEMORY.md = %+v; want entries %q, %d chars, over %v", f, c.entries, c.chars, c.over)
			}
			if m.User.Exists || m.User.Limit != DefaultUserLimit {
				t.Errorf("USER.md = %+v", m.User)
			}
		})
	}
}

func TestMemoryLimitsFollowConfig(t *testing.T) {
	_, h := newHome(t, "acme")
	writeFile(t, h.Dir, "config.yaml", "memory:\n  memory_char_limit: 10\n  user_char_limit: 4000\n")
	writeFile(t, h.Dir, "memories/USER.md", "Name: Ada\n§\nRole: buyer")
	m, err := h.Memory()
	if err != nil {
		t.Fatal(err)
	}
	if m.Memory.Limit != 10 || m.User.Limit != 4000 || m.User.Chars != 23 || m.User.Percent() != 0 {
		t.Fatalf("memory = %+v", m)
	}
	if len(m.User.Entries) != 2 {
		t.Errorf("USER.md entries = %q", m.User.Entries)
	}
}

func ptr(s string) *string { return &s }
