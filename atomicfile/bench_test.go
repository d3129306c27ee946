package atomicfile

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkWrite measures Write of 4 KiB against os.WriteFile, which neither
// syncs nor renames, in the same run on the same file system.
func BenchmarkWrite(b *testing.B) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 256)
	b.Run("os.WriteFile", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "auth.json")
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for b.Loop() {
			if err := os.WriteFile(path, data, 0o600); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, bc := range []struct {
		name string
		opts []Option
	}{
		{"Write", nil},
		{"Write+receipts", []Option{WithReceipts(5)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "auth.json")
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if err := Write(path, data, 0o600, bc.opts...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
