// Package latency reports the latency percentiles benchmarks measure, in one shape for
// every figure of the README.
package latency

import (
	"slices"
	"testing"
	"time"
)

// Report sorts lat and reports its p50 and p99 in milliseconds on b.
func Report(b *testing.B, lat []time.Duration) {
	b.Helper()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds())/1000, "p99-ms")
}
