package orghome

import (
	"errors"
	"fmt"
	"io/fs"
)

// Soul is SOUL.md as a page shows it: the host's generated block and the free section.
// It only reads; EnsureSoul, before every agent start, is what puts a block right.
type Soul struct {
	Exists bool
	// BlockVersion is the generated block's version, 0 without one; SoulBlockVersion is
	// this build's.
	BlockVersion int
	Block        string // the block's text between its marker lines
	// Intact says the block is as the host wrote it, for whatever identity: its body
	// matches the digest in its first line.
	Intact bool
	Free   string // the free section, byte for byte
	// Problem says what EnsureSoul will put right at the next agent start: no block,
	// malformed markers, an edited or moved block, an older version. Empty when none.
	Problem string
}

// ReadSoul reads SOUL.md. A missing file is a Soul that does not exist.
func (h *Home) ReadSoul() (Soul, error) {
	fi, err := h.Lstat(soulFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Soul{Problem: "there is no SOUL.md yet: it is written before the first agent start"}, nil
	case err != nil:
		return Soul{}, fmt.Errorf("read SOUL.md: %w", err)
	case !fi.Mode().IsRegular():
		return Soul{Exists: true, Problem: "SOUL.md is not a regular file (" + fi.Mode().Type().String() + "): it is replaced before the next agent start"}, nil
	}
	raw, more, _, err := h.readLimited(soulFile, soulReadLimit)
	if err != nil {
		return Soul{}, fmt.Errorf("read SOUL.md: %w", err)
	}
	if more {
		return Soul{Exists: true, Problem: fmt.Sprintf("SOUL.md is over %d bytes; the host does not rewrite it, and agent starts fail until it is smaller", soulReadLimit)}, nil
	}
	p := splitSoul(raw)
	s := Soul{Exists: true, Free: string(p.free)}
	if len(p.blocks) > 0 {
		b := p.blocks[0]
		s.BlockVersion, s.Block, s.Intact = b.version, string(b.body), b.intact()
	}
	switch {
	case p.noMarker:
		s.Problem = "SOUL.md has no generated block"
	case p.orphans > 0 || len(p.blocks) != 1:
		s.Problem = fmt.Sprintf("malformed markers (%d blocks, %d stray markers)", len(p.blocks), p.orphans)
	case !s.Intact:
		s.Problem = "the generated block was edited"
	case s.BlockVersion != SoulBlockVersion:
		s.Problem = fmt.Sprintf("the generated block is v%d; this host writes v%d", s.BlockVersion, SoulBlockVersion)
	case !p.atTop:
		s.Problem = "the generated block was moved from the top"
	}
	return s, nil
}
