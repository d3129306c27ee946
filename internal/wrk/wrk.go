// Package wrk runs Debian's wrk, a load generator in a process of its own, against a URL on
// this machine and reads its figures, for the benchmarks whose numbers the README reports.
package wrk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Load is one run's shape.
type Load struct {
	Connections int
	Threads     int
	Duration    time.Duration
	Headers     map[string]string
}

// Result is what wrk measured.
type Result struct {
	Requests      int
	PerSecond     float64
	P50, P99      time.Duration
	Non2xx        int // responses that were not 2xx or 3xx
	SocketErrors  string
	Output        string // wrk's own report
	URL           string
	Connections   int
	DurationAsked time.Duration
}

func (r Result) String() string {
	return fmt.Sprintf("%.0f req/s, p50 %s, p99 %s (%d requests, %d non-2xx, %d connections)",
		r.PerSecond, r.P50, r.P99, r.Requests, r.Non2xx, r.Connections)
}

// Available says whether wrk is installed.
func Available() error {
	_, err := exec.LookPath("wrk")
	if err != nil {
		return errors.New("wrk is not installed (apt-get install wrk)")
	}
	return nil
}

// Run loads url as l says; the URL must be on this machine (a loopback address).
func Run(ctx context.Context, url string, l Load) (Result, error) {
	if !strings.HasPrefix(url, "http://127.") && !strings.HasPrefix(url, "http://localhost") && !strings.HasPrefix(url, "http://[::1]") {
		return Result{}, fmt.Errorf("wrk: %s is not on this machine", url)
	}
	args := []string{"-t", strconv.Itoa(max(l.Threads, 1)), "-c", strconv.Itoa(l.Connections),
		"-d", fmt.Sprintf("%ds", int(l.Duration.Seconds())), "--latency"}
	for k, v := range l.Headers {
		args = append(args, "-H", k+": "+v)
	}
	args = append(args, url)
	cmd := exec.CommandContext(ctx, "wrk", args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return Result{}, fmt.Errorf("wrk: %w: %s", err, errb.String())
	}
	r, err := Parse(out.String())
	r.URL, r.Connections, r.DurationAsked = url, l.Connections, l.Duration
	return r, err
}

var (
	reqLine    = regexp.MustCompile(`(?m)^\s*(\d+) requests in `)
	rpsLine    = regexp.MustCompile(`(?m)^Requests/sec:\s+([\d.]+)`)
	pctLine    = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$`)
	non2xxLine = regexp.MustCompile(`(?m)^\s*Non-2xx or 3xx responses:\s+(\d+)`)
	sockLine   = regexp.MustCompile(`(?m)^\s*Socket errors:.*$`)
)

// Parse reads wrk's report (run with --latency).
func Parse(report string) (Result, error) {
	r := Result{Output: report}
	m := reqLine.FindStringSubmatch(report)
	rps := rpsLine.FindStringSubmatch(report)
	if m == nil || rps == nil {
		return r, fmt.Errorf("wrk: no figures in its report:\n%s", report)
	}
	r.Requests, _ = strconv.Atoi(m[1])
	r.PerSecond, _ = strconv.ParseFloat(rps[1], 64)
	for _, p := range pctLine.FindAllStringSubmatch(report, -1) {
		v, _ := strconv.ParseFloat(p[2], 64)
		unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second}[p[3]]
		d := time.Duration(v * float64(unit))
		if p[1] == "50" {
			r.P50 = d
		} else {
			r.P99 = d
		}
	}
	if r.P50 == 0 || r.P99 == 0 {
		return r, fmt.Errorf("wrk: no latency distribution in its report (--latency):\n%s", report)
	}
	if n := non2xxLine.FindStringSubmatch(report); n != nil {
		r.Non2xx, _ = strconv.Atoi(n[1])
	}
	r.SocketErrors = strings.TrimSpace(sockLine.FindString(report))
	return r, nil
}
