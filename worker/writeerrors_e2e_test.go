package worker_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"hermeshost/sartiq"
)

// fullDisk mounts a 64 KiB tmpfs at dir and fills it to the last byte, so a write there
// fails with ENOSPC for real. Without root, or where mounting is not allowed, it skips and
// says why.
func fullDisk(t *testing.T, dir string) {
	t.Helper()
	if uid := os.Geteuid(); uid != 0 {
		t.Skipf("mounting a tmpfs needs root, and this runs as uid %d", uid)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700"); err != nil {
		t.Skipf("cannot mount a 64 KiB tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte{'f'}, 4096)
	for written := 0; ; {
		n, err := f.Write(chunk)
		written += n
		if errors.Is(err, syscall.ENOSPC) {
			if _, err := f.Write([]byte{'f'}); errors.Is(err, syscall.ENOSPC) {
				return
			}
			continue // the last page still had room; fill it too
		}
		if err != nil {
			t.Fatal(err)
		}
		if written > 1<<20 {
			t.Fatalf("wrote %d bytes to a 64 KiB disk without ENOSPC", written)
		}
	}
}

// A run-job whose file write fails on a full disk says so in its outcome, by cause: run-job
// is never scraped, and this is how the failure reaches the dispatcher's metrics. Here the
// org's workspaces are full, so the job's manifest.json cannot be written and the run
// crashes; the outcome counts that one write as disk_full.
func TestAFailedWriteOnAFullDiskIsCountedInTheOutcome(t *testing.T) {
	w := newWorld(t, "process")
	ctx := context.Background()
	fullDisk(t, filepath.Join(w.home("acme"), "workspaces"))
	job := w.backend.DemoJob(t, "acme", sartiq.TypeGuidelinesExtraction)
	r := w.runJob(ctx, "acme", job, nil)
	if r.outcome.Status != "crashed" || !strings.Contains(r.outcome.Reason, "disk full") {
		t.Fatalf("outcome %+v, want crashed on a full disk\n%s", r.outcome, r.stderr)
	}
	if got := r.outcome.FileWriteErrors; len(got) != 1 || got["disk_full"] != 1 {
		t.Fatalf("the outcome's file_write_errors are %v, want disk_full: 1\n%s", got, r.stdout)
	}
}
