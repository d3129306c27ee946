package atomicfile

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// mountTinyDisk mounts a 64 KiB tmpfs, a disk small enough to fill for real.
// Without root, or where mounting is not allowed, it skips and says why; the
// fault-injection tests cover the same steps everywhere.
func mountTinyDisk(t *testing.T) string {
	t.Helper()
	if uid := os.Geteuid(); uid != 0 {
		t.Skipf("mounting a tmpfs needs root, and this runs as uid %d", uid)
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700"); err != nil {
		t.Skipf("cannot mount a 64 KiB tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fillDisk writes dir/filler until the disk refuses another byte.
func fillDisk(t *testing.T, dir string) (filler string) {
	t.Helper()
	filler = filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte{'f'}, 4096)
	for written := 0; ; {
		n, err := f.Write(chunk)
		written += n
		if errors.Is(err, syscall.ENOSPC) {
			if _, err := f.Write([]byte{'f'}); !errors.Is(err, syscall.ENOSPC) {
				continue // the last page still had room; fill it too
			}
			return filler
		}
		if err != nil {
			t.Fatal(err)
		}
		if written > 1<<20 {
			t.Fatalf("wrote %d bytes to a 64 KiB disk without ENOSPC", written)
		}
	}
}

func TestWriteOnFullDisk(t *testing.T) {
	dir := mountTinyDisk(t)
	path := filepath.Join(dir, "auth.json")
	old := bytes.Repeat([]byte(`{"refresh_token":"kept"}`), 50)
	if err := Write(path, old, 0o600); err != nil {
		t.Fatal(err)
	}
	filler := fillDisk(t, dir)

	stopWatching := watchFile(t, path, func(data []byte) error {
		if !bytes.Equal(data, old) {
			return fmt.Errorf("%d bytes that are not the old file: %.40q", len(data), data)
		}
		return nil
	})
	full, other := testutil.ToFloat64(WriteErrors.WithLabelValues("disk_full")), testutil.ToFloat64(WriteErrors.WithLabelValues("other"))
	for _, size := range []int{1, 100, 4096, 20_000, 100_000} {
		for _, receipts := range []int{0, 3} {
			err := Write(path, bytes.Repeat([]byte{'n'}, size), 0o600, WithReceipts(receipts))
			werr := assertWriteError(t, err, path, opWriteTemp, syscall.ENOSPC, "disk full")
			if werr.Replaced() || !strings.Contains(err.Error(), "the previous content is unchanged") {
				t.Fatalf("%d bytes: %q claims the file was replaced", size, err)
			}
			assertContent(t, path, old)
			// No temp file, and no receipt directory made for a write
			// that never got its content down.
			assertDirHolds(t, dir, "auth.json", "filler")
		}
	}
	stopWatching()
	// Each failed write is counted once, as the disk being full: what operators alert on.
	if got := testutil.ToFloat64(WriteErrors.WithLabelValues("disk_full")) - full; got != 10 {
		t.Errorf("hermes_file_write_errors_total{cause=\"disk_full\"} grew by %v over 10 failed writes", got)
	}
	if got := testutil.ToFloat64(WriteErrors.WithLabelValues("other")) - other; got != 0 {
		t.Errorf("hermes_file_write_errors_total{cause=\"other\"} grew by %v", got)
	}

	// Once there is room again, the same write goes through, and is not counted.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	next := bytes.Repeat([]byte{'n'}, 4096)
	if err := Write(path, next, 0o600); err != nil {
		t.Fatalf("after freeing space: %v", err)
	}
	assertContent(t, path, next)
	if got := testutil.ToFloat64(WriteErrors.WithLabelValues("disk_full")) - full; got != 10 {
		t.Errorf("a successful write was counted as failed: %v", got)
	}
}

func TestReceiptsOnFullDisk(t *testing.T) {
	dir := mountTinyDisk(t)
	path := filepath.Join(dir, "SOUL.md")
	clock := newStepClock()
	for i := 1; i <= 2; i++ {
		if err := Write(path, numbered(i), 0o600, WithReceipts(3), WithClock(clock.Now)); err != nil {
			t.Fatal(err)
		}
	}
	receiptsDir := filepath.Join(dir, ".SOUL.md.receipts")
	before := dirNames(t, receiptsDir)
	fillDisk(t, dir)

	stopWatching := watchFile(t, path, func(data []byte) error {
		if !bytes.Equal(data, numbered(2)) {
			return fmt.Errorf("%d bytes that are not version 2: %.40q", len(data), data)
		}
		return nil
	})
	for range 10 {
		err := Write(path, bytes.Repeat([]byte{'n'}, 8192), 0o600, WithReceipts(3), WithClock(clock.Now))
		assertWriteError(t, err, path, opWriteTemp, syscall.ENOSPC, "disk full")
		assertContent(t, path, numbered(2))
		assertDirHolds(t, dir, "SOUL.md", ".SOUL.md.receipts", "filler")
		assertDirHolds(t, receiptsDir, before...)
	}
	stopWatching()
	if got := receiptContents(t, path); !slices.Equal(got, []string{string(numbered(1))}) {
		t.Fatalf("receipts %q, want only version 1", got)
	}
}
