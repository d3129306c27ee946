package atomicfile

import (
	"errors"
	"io"
	"io/fs"
	"slices"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// WriteErrors counts this process's failed writes (Write and Restore), by the cause an
// operator acts on: "disk_full" (no space or quota), "io" (the device failed or lost data),
// "read_only", "permission" or "other". It is one collector for the whole process, which
// every process's registry shows (service.NewRegistry registers it), so a full or failing
// disk under any file the host writes (SOUL.md, a checkpoint, config.yaml, the gateway's
// login) can be alerted on, whichever component wrote it.
var WriteErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "hermes_file_write_errors_total",
	Help: "Atomic file writes that failed, by cause (disk_full, io, read_only, permission, other); the previous content stayed in place unless the log says otherwise.",
}, []string{"cause"})

// writeErrorCauses are the label values, set to zero up front so a rate exists before the
// first failure.
var writeErrorCauses = []string{"disk_full", "io", "read_only", "permission", "other"}

// WriteErrorCauses are the causes WriteErrors counts by.
func WriteErrorCauses() []string { return slices.Clone(writeErrorCauses) }

// WriteErrorCounts are this process's failed writes so far, by cause, read from
// WriteErrors; causes with none are left out, and nil means none at all. A process no one
// scrapes (a worker's run-job) reports them this way instead.
func WriteErrorCounts() map[string]uint64 {
	var counts map[string]uint64
	for _, c := range writeErrorCauses {
		var m dto.Metric
		if err := WriteErrors.WithLabelValues(c).Write(&m); err != nil {
			continue
		}
		if n := uint64(m.GetCounter().GetValue()); n > 0 {
			if counts == nil {
				counts = make(map[string]uint64)
			}
			counts[c] = n
		}
	}
	return counts
}

func init() {
	for _, c := range writeErrorCauses {
		WriteErrors.WithLabelValues(c)
	}
}

// countWriteError records a failed write by its cause.
func countWriteError(err error) {
	if err == nil {
		return
	}
	WriteErrors.WithLabelValues(writeErrorCause(err)).Inc()
}

func writeErrorCause(err error) string {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EFBIG):
		return "disk_full"
	case errors.Is(err, syscall.EIO), errors.Is(err, io.ErrShortWrite), errors.Is(err, errSizeMismatch):
		return "io"
	case errors.Is(err, syscall.EROFS):
		return "read_only"
	case errors.Is(err, fs.ErrPermission):
		return "permission"
	}
	return "other"
}
