// Package latency reports the latency percentiles benchmarks measure, in one shape for
// every figure of the README.
package latency

import (
	"slices"
	"testing"
	"time"
)

// Report sorts lat and reports its p50 and p99 in milliseconds on b.
func Report(b *testing.B, lat []time.Duration) { ReportNamed(b, "", lat) }

// ReportNamed is Report for one of several figures of a benchmark: the metrics are
// <name>-p50-ms and <name>-p99-ms.
func ReportNamed(b *testing.B, name string, lat []time.Duration) {
	b.Helper()
	if len(lat) == 0 {
		return
	}
	if name != "" {
		name += "-"
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, name+"p50-ms")
	b.ReportMetric(float64(lat[min(len(lat)-1, len(lat)*99/100)].Microseconds())/1000, name+"p99-ms")
}
