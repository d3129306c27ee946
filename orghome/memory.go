package orghome

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"unicode/utf8"
)

// Hermes' memory store (tools/memory_tool.py): entries joined by "\n§\n", each stripped of
// surrounding whitespace, empty ones dropped, duplicates dropped (first kept). The fill is
// the length of the joined entries in characters (Python's len, so Unicode code points),
// against a limit of 2,200 for MEMORY.md and 1,375 for USER.md; config.yaml's
// memory.memory_char_limit and memory.user_char_limit override them, as in Hermes.
const (
	memoryEntryDelimiter = "\n§\n"
	DefaultMemoryLimit   = 2200
	DefaultUserLimit     = 1375
)

// Memory is what the agent remembers, as Hermes injects it. The host only reads it:
// writing from outside trips Hermes' drift detection and blocks the agent's own edits.
type Memory struct {
	Memory MemoryFile // memories/MEMORY.md: the agent's notes
	User   MemoryFile // memories/USER.md: what it knows about the people it works with
}

// MemoryFile is one memory file with its fill.
type MemoryFile struct {
	Name    string // MEMORY.md or USER.md
	Exists  bool
	Entries []string
	Chars   int // characters Hermes counts against Limit
	Limit   int
	// Over says the file holds more than Hermes allows; Hermes truncates what it shows the
	// model and asks it to consolidate.
	Over bool
}

// Percent is the fill, rounded down, as Hermes shows it.
func (m MemoryFile) Percent() int {
	if m.Limit <= 0 {
		return 0
	}
	return m.Chars * 100 / m.Limit
}

// memoryReadLimit bounds a read: far above any limit, so an over-full file still shows.
const memoryReadLimit = 4 << 20

// Memory reads memories/MEMORY.md and memories/USER.md. A missing file is an empty one.
func (h *Home) Memory() (Memory, error) {
	memLimit, userLimit := DefaultMemoryLimit, DefaultUserLimit
	// A config.yaml that cannot be read leaves Hermes on its default limits too
	// (load_on_disk_store); the skills page is where a broken config is reported.
	if cfg, err := h.readConfig(); err == nil {
		if n, ok := cfg.intAt("memory", "memory_char_limit"); ok {
			memLimit = n
		}
		if n, ok := cfg.intAt("memory", "user_char_limit"); ok {
			userLimit = n
		}
	}
	var (
		m   Memory
		err error
	)
	if m.Memory, err = h.memoryFile("MEMORY.md", memLimit); err != nil {
		return Memory{}, err
	}
	if m.User, err = h.memoryFile("USER.md", userLimit); err != nil {
		return Memory{}, err
	}
	return m, nil
}

func (h *Home) memoryFile(name string, limit int) (MemoryFile, error) {
	f := MemoryFile{Name: name, Limit: limit}
	raw, _, _, err := h.readLimited("memories/"+name, memoryReadLimit)
	if errors.Is(err, fs.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return MemoryFile{}, fmt.Errorf("read memory: %w", err)
	}
	f.Exists = true
	f.Entries = ParseMemory(string(raw))
	f.Chars = utf8.RuneCountInString(strings.Join(f.Entries, memoryEntryDelimiter))
	f.Over = f.Chars > limit
	return f, nil
}

// ParseMemory splits a memory file into entries exactly as Hermes does.
func ParseMemory(raw string) []string {
	if strings.TrimSpace(raw) == "" {
		return nil
	}
	seen := map[string]bool{}
	var entries []string
	for _, e := range strings.Split(raw, memoryEntryDelimiter) {
		e = strings.TrimSpace(e)
		if e == "" || seen[e] {
			continue
		}
		seen[e] = true
		entries = append(entries, e)
	}
	return entries
}
