package atomicfile

import (
	"slices"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// WriteErrorCounts reads what WriteErrors counted, by cause, leaving out causes with none:
// a worker reports its failed writes with it.
func TestWriteErrorCountsReadTheCounter(t *testing.T) {
	_, path := startingWith(t, "checkpoint.json", oldContent)
	before := WriteErrorCounts()
	for _, errno := range []syscall.Errno{syscall.ENOSPC, syscall.EDQUOT, syscall.EIO} {
		if err := Write(path, newContent, 0o600, withFileSystem(&faultFS{fault: failWrite, offset: 1, err: errno})); err == nil {
			t.Fatalf("a write failing with %v succeeded", errno)
		}
	}
	after := WriteErrorCounts()
	if after["disk_full"]-before["disk_full"] != 2 || after["io"]-before["io"] != 1 {
		t.Fatalf("counts went from %v to %v, want 2 more disk_full and 1 more io", before, after)
	}
	for cause, n := range after {
		if n == 0 || !slices.Contains(WriteErrorCauses(), cause) {
			t.Errorf("cause %q: %d", cause, n)
		}
		if got := testutil.ToFloat64(WriteErrors.WithLabelValues(cause)); got != float64(n) {
			t.Errorf("cause %q: %d, the counter says %v", cause, n, got)
		}
	}
}
