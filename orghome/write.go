package orghome

import (
	"fmt"
	"io/fs"
	"path/filepath"

	"hermeshost/atomicfile"
)

// receiptsKept is how many previous versions of a host-owned file stay beside it
// (<home>/.<name>.receipts/, see atomicfile).
const receiptsKept = 10

// writeOwned replaces a file the host owns in the home (SOUL.md, config.yaml) through
// atomicfile: a full disk or a crash leaves the old file as it was, and with receipt the
// version replaced is kept. atomicfile works on paths, so the folders leading to the file
// are first checked to be real folders of the home: no link can steer the write out. A
// link at the file itself is replaced, never followed. An existing file keeps its mode.
func (h *Home) writeOwned(name string, data []byte, perm fs.FileMode, receipt bool) error {
	if err := CheckPath(name); err != nil {
		return fmt.Errorf("write in home of org %s: %w", h.ID, err)
	}
	if dir := filepath.Dir(name); dir != "." {
		if err := h.realDir(dir); err != nil {
			return err
		}
	}
	if fi, err := h.root.Lstat(name); err == nil && fi.Mode().IsRegular() {
		perm = fi.Mode().Perm()
	}
	// Through the home's own os.Root too: a folder swapped for a link after the check
	// above still leads nowhere.
	opts := []atomicfile.Option{atomicfile.WithinFolder(h.Dir)}
	if receipt {
		opts = append(opts, atomicfile.WithReceipts(receiptsKept))
	}
	if err := atomicfile.Write(filepath.Join(h.Dir, name), data, perm, opts...); err != nil {
		return fmt.Errorf("write %s in home of org %s: %w", name, h.ID, err)
	}
	return nil
}

// Receipts lists the kept previous versions of a host-owned file of the home, newest first.
func (h *Home) Receipts(name string) ([]atomicfile.Receipt, error) {
	if err := CheckPath(name); err != nil {
		return nil, fmt.Errorf("receipts in home of org %s: %w", h.ID, err)
	}
	return atomicfile.Receipts(filepath.Join(h.Dir, name))
}
