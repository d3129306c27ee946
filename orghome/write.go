package orghome

import (
	"io/fs"
)

// writeOwned writes a file the host owns in the home. PLACEHOLDER until atomicfile lands.
func (h *Home) writeOwned(name string, data []byte, perm fs.FileMode, receipt bool) error {
	_ = receipt
	return h.root.WriteFile(name, data, perm)
}
