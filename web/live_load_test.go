package web

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"hermeshost/assertion"
)

// TestLiveUpdatesUnderLoad (issue #18) measures the live updates of one dashboard: a load
// client in a second OS process (this test binary run again, liveLoadChildEnv set) holds
// liveLoadConns SSE streams of <prefix>/events open while mirror events of a few running jobs
// are written at a steady pace; for every (stream, event) it takes the time from the event's
// commit to the arrival of its id at the client, and the test process's CPU time and memory.
// The same events with one stream are the baseline. It asserts only that every event reached
// every stream and no stream was dropped; its figures are the README's. `make bench-live`
// runs it (HERMES_BENCH_SSE=1).
func TestLiveUpdatesUnderLoad(t *testing.T) {
	if os.Getenv("HERMES_BENCH_SSE") == "" {
		t.Skip("a load measurement, not a test: make bench-live runs it (HERMES_BENCH_SSE=1)")
	}
	loadBefore := liveLoadAverage()
	d := newLiveDash(t)
	idle := liveMemoryNow(true)
	phases := []*livePhase{
		runLivePhase(t, d, 1),
		runLivePhase(t, d, liveLoadConns),
	}

	var b strings.Builder
	row := func(what string, f func(p *livePhase) string) {
		fmt.Fprintf(&b, "| %s |", what)
		for _, p := range phases {
			fmt.Fprintf(&b, " %s |", f(p))
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "| %d progress events of %d jobs, %d/s |", liveLoadEvents, liveLoadJobs, int(time.Second/liveLoadEvery))
	for _, p := range phases {
		fmt.Fprintf(&b, " %d stream(s) |", p.conns)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(phases)) + "\n")
	row("deliveries (stream × event)", func(p *livePhase) string { return strconv.Itoa(len(p.latencies)) })
	row("missing / duplicated", func(p *livePhase) string { return fmt.Sprintf("%d / %d", p.missing, p.duplicated) })
	for _, q := range []struct {
		name string
		p    float64
	}{{"commit → arrival p50", 0.50}, {"p90", 0.90}, {"p99", 0.99}, {"max", 1}} {
		row(q.name, func(p *livePhase) string { return liveMS(percentile(p.latencies, q.p)) })
	}
	row("test process CPU (user+sys) over the events", func(p *livePhase) string { return liveSeconds(p.cpu) })
	row("the same per 1000 events", func(p *livePhase) string {
		return liveSeconds(p.cpu * 1000 / time.Duration(liveLoadEvents))
	})
	row("wall time of the events", func(p *livePhase) string { return liveSeconds(p.wall) })
	row("load client CPU (whole run)", func(p *livePhase) string { return liveSeconds(p.clientCPU) })
	row(fmt.Sprintf("heap in use: idle %s; streams connected (after GC)", liveMB(idle.heap)), func(p *livePhase) string { return liveMB(p.connected.heap) })
	row("heap in use, most during the events", func(p *livePhase) string { return liveMB(p.during.heap) })
	row(fmt.Sprintf("RSS: idle %s; streams connected", liveMB(idle.rss)), func(p *livePhase) string { return liveMB(p.connected.rss) })
	row("RSS, most during the events", func(p *livePhase) string { return liveMB(p.during.rss) })
	row(fmt.Sprintf("goroutines: idle %d; streams connected", idle.goroutines), func(p *livePhase) string { return strconv.Itoa(p.connected.goroutines) })
	t.Logf("figures (on %d CPUs):\n%s", runtime.NumCPU(), b.String())
	t.Logf("note: the machine's load average (1, 5, 15 min) was %s before and %s after: other work on it skews the figures, the tail most", loadBefore, liveLoadAverage())
	t.Logf("note: CPU and memory are the test process's, which also holds the control API, the mirror writer and the pgx pools beside the dashboard: an upper bound for the dashboard; Postgres and the load client are other processes")
	t.Logf("note: the commit time is taken when the INSERT ... RETURNING id has returned (autocommit), an upper bound on the commit instant, so a latency is a lower bound by at most one round trip to Postgres")
}

const (
	// liveLoadChildEnv, when set, is the URL of the stream and makes this test binary the
	// load client (liveLoadClientMain) instead of the tests.
	liveLoadChildEnv     = "HERMES_LIVE_LOAD_URL"
	liveLoadStreamsEnv   = "HERMES_LIVE_LOAD_STREAMS"
	liveLoadAssertionEnv = "HERMES_LIVE_LOAD_ASSERTION"

	liveLoadConns  = 200
	liveLoadEvents = 300
	liveLoadEvery  = 50 * time.Millisecond // 20 events a second
	liveLoadJobs   = 4                     // running at once, each phase its own
)

// The early check of the load client: before the tests (and their TestMain) start.
func init() {
	if url := os.Getenv(liveLoadChildEnv); url != "" {
		os.Exit(liveLoadClientMain(url))
	}
}

// liveArrivals is one stream's record, a JSON line of the client's output: the id of each
// message carrying one, and when its line was read (UnixNano).
type liveArrivals struct {
	Stream int     `json:"stream"`
	IDs    []int64 `json:"ids"`
	At     []int64 `json:"at"`
	// Ended says why the stream ended before the client closed it (the dashboard dropped
	// it, or an error), empty when it did not.
	Ended string `json:"ended,omitempty"`
}

// liveLoadClientMain is the load client: it opens the streams, prints "live" once each of
// them has said so, reads the last event id to expect from stdin, prints "done" once every
// stream has it (or 20 s after), then a liveArrivals line per stream.
func liveLoadClientMain(url string) int {
	n, err := strconv.Atoi(os.Getenv(liveLoadStreamsEnv))
	if err != nil || n < 1 {
		fmt.Fprintln(os.Stderr, "load client: no stream count in", liveLoadStreamsEnv)
		return 2
	}
	token := os.Getenv(liveLoadAssertionEnv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	streams := make([]liveArrivals, n)
	newest := make([]atomic.Int64, n)
	var wg, live sync.WaitGroup
	live.Add(n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			streams[i].Stream = i
			liveLoadRead(ctx, client, url, token, &streams[i], &newest[i], sync.OnceFunc(live.Done))
		}()
	}
	wait := make(chan struct{})
	go func() { live.Wait(); close(wait) }()
	select {
	case <-wait:
	case <-time.After(time.Minute):
		fmt.Fprintln(os.Stderr, "load client: the streams did not all go live within a minute")
		return 1
	}
	out := bufio.NewWriterSize(os.Stdout, 1<<20)
	fmt.Fprintln(out, "live")
	if err := out.Flush(); err != nil {
		return 1
	}
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	last, perr := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil || perr != nil {
		fmt.Fprintln(os.Stderr, "load client: no last event id on stdin:", err, perr)
		return 1
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		all := true
		for i := range newest {
			if newest[i].Load() < last {
				all = false
				break
			}
		}
		if all {
			break
		}
	}
	fmt.Fprintln(out, "done")
	if err := out.Flush(); err != nil {
		return 1
	}
	cancel()
	wg.Wait()
	enc := json.NewEncoder(out)
	for i := range streams {
		if err := enc.Encode(&streams[i]); err != nil {
			return 1
		}
	}
	if err := out.Flush(); err != nil {
		return 1
	}
	return 0
}

// liveLoadRead holds one stream open until ctx ends, recording each id's arrival in rec;
// live is called once the stream says it is live, or it failed before.
func liveLoadRead(ctx context.Context, client *http.Client, url, token string, rec *liveArrivals, newest *atomic.Int64, live func()) {
	defer live()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		rec.Ended = err.Error()
		return
	}
	req.Header.Set(assertion.Header, token)
	resp, err := client.Do(req)
	if err != nil {
		rec.Ended = err.Error()
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		rec.Ended = resp.Status
		return
	}
	r := bufio.NewReaderSize(resp.Body, 64<<10)
	mid := false // within a line longer than the buffer (a data line): not a field's start
	for {
		line, err := r.ReadSlice('\n')
		full := err == bufio.ErrBufferFull
		if err != nil && !full {
			if ctx.Err() == nil {
				rec.Ended = "the stream ended: " + err.Error()
			}
			return
		}
		if !mid {
			switch {
			case bytes.HasPrefix(line, []byte("id: ")):
				at := time.Now().UnixNano()
				id, err := strconv.ParseInt(string(bytes.TrimSpace(line[len("id: "):])), 10, 64)
				if err != nil {
					rec.Ended = "a bad id line: " + string(line)
					return
				}
				rec.IDs = append(rec.IDs, id)
				rec.At = append(rec.At, at)
				newest.Store(max(newest.Load(), id))
			case string(line) == ": live\n":
				live()
			}
		}
		mid = full
	}
}

// livePhase is one run of the events with conns streams open.
type livePhase struct {
	conns                int
	latencies            []time.Duration // sorted
	missing, duplicated  int
	cpu, wall, clientCPU time.Duration
	connected, during    liveMemory
}

type liveMemory struct {
	heap, rss  uint64 // bytes
	goroutines int
}

// runLivePhase starts the load client with conns streams, waits for all of them to be
// subscribed, writes the events and collects what arrived.
func runLivePhase(t *testing.T, d *liveDash, conns int) *livePhase {
	t.Helper()
	// The phase's jobs are claimed before its streams open, so each phase's jobs have the
	// same history (the dashboard reads a job's newest events for each event of it); what
	// is measured is their progress, as a worker reports it through the dispatcher.
	var jobs []string
	for j := range liveLoadJobs {
		jobs = append(jobs, fmt.Sprintf("load-%d-job-%d", conns, j+1))
		d.event(jobs[j], "claim", map[string]string{"instance": "load-1"})
	}
	tok, err := d.signer.Sign("ada", "acme")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		liveLoadChildEnv+"="+d.srv.URL+"/orgs/acme/events",
		liveLoadStreamsEnv+"="+strconv.Itoa(conns),
		liveLoadAssertionEnv+"="+tok)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		s := bufio.NewScanner(stdout)
		s.Buffer(nil, 16<<20)
		for s.Scan() {
			lines <- s.Text()
		}
	}()
	waited := false
	defer func() { // on a failure too: no child outlives the phase
		if !waited {
			_ = cmd.Process.Kill()
			for range lines {
			}
			_ = cmd.Wait()
		}
	}()
	next := func(what string, within time.Duration) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				_ = cmd.Wait()
				waited = true
				t.Fatalf("the load client ended before %s: %v\n%s", what, cmd.ProcessState, stderr.String())
			}
			return l
		case <-time.After(within):
			t.Fatalf("no %s from the load client within %s\n%s", what, within, stderr.String())
		}
		return ""
	}
	if l := next("live", 2*time.Minute); l != "live" {
		t.Fatalf("the load client said %q, not live", l)
	}
	// The subscriptions as the dashboard counts them (a stream of the last phase may still
	// be leaving).
	for deadline := time.Now().Add(10 * time.Second); liveSubscribers(t, d) != conns; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d streams subscribed, not %d", liveSubscribers(t, d), conns)
		}
	}
	p := &livePhase{conns: conns, connected: liveMemoryNow(true)}

	// The most memory while the events are written, sampled without forcing a GC.
	stop, sampled := make(chan struct{}), make(chan liveMemory)
	go func() {
		var most liveMemory
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			m := liveMemoryNow(false)
			most.heap, most.rss, most.goroutines = max(most.heap, m.heap), max(most.rss, m.rss), max(most.goroutines, m.goroutines)
			select {
			case <-stop:
				sampled <- most
				return
			case <-tick.C:
			}
		}
	}()

	type commit struct {
		id int64
		at int64 // UnixNano
	}
	commits := make([]commit, 0, liveLoadEvents)
	persisted := map[string][]string{}
	categories := []string{"products", "prices", "stock", "images", "variants", "collections", "reviews", "translations"}
	cpu0, start := processCPU(t), time.Now()
	for i := range liveLoadEvents {
		time.Sleep(time.Until(start.Add(time.Duration(i) * liveLoadEvery)))
		job := jobs[i%len(jobs)]
		cat := categories[(i/len(jobs))%len(categories)]
		if !slices.Contains(persisted[job], cat) {
			persisted[job] = append(persisted[job], cat)
		}
		// What worker.Run emits after an accepted write, with the total the head's bar shows.
		id := d.event(job, "progress", map[string]any{"operation": "upsert", "category": cat, "persisted": persisted[job], "total": len(categories)})
		// The INSERT ... RETURNING id has returned in autocommit, so it has committed: this
		// is an upper bound on the commit instant (by one reply from Postgres).
		commits = append(commits, commit{id, time.Now().UnixNano()})
	}
	if _, err := fmt.Fprintf(stdin, "%d\n", commits[len(commits)-1].id); err != nil {
		t.Fatal(err)
	}
	_ = stdin.Close()
	if l := next("done", time.Minute); l != "done" {
		t.Fatalf("the load client said %q, not done", l)
	}
	p.cpu, p.wall = processCPU(t)-cpu0, time.Since(start)
	close(stop)
	p.during = <-sampled

	var got []liveArrivals
	for range conns {
		var a liveArrivals
		if err := json.Unmarshal([]byte(next("a stream's arrivals", time.Minute)), &a); err != nil {
			t.Fatal(err)
		}
		got = append(got, a)
	}
	for range lines {
	}
	waited = true
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the load client: %v\n%s", err, stderr.String())
	}
	p.clientCPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()

	for _, a := range got {
		if a.Ended != "" {
			t.Errorf("stream %d of %d: %s", a.Stream, conns, a.Ended)
		}
		arrived := make(map[int64]int64, len(a.IDs))
		for i, id := range a.IDs {
			if _, twice := arrived[id]; twice {
				p.duplicated++
			}
			arrived[id] = a.At[i]
		}
		for _, c := range commits {
			at, ok := arrived[c.id]
			if !ok {
				p.missing++
				continue
			}
			p.latencies = append(p.latencies, time.Duration(at-c.at))
		}
	}
	slices.Sort(p.latencies)
	if p.missing != 0 || p.duplicated != 0 {
		t.Errorf("%d streams: %d of %d deliveries missing, %d duplicated", conns, p.missing, conns*len(commits), p.duplicated)
	}
	if n := dropped(t, d); n != 0 {
		t.Errorf("%d streams: the dashboard dropped %d streams for falling behind", conns, n)
	}
	return p
}

// liveSubscribers is the dashboard's hermes_dashboard_live_subscribers.
func liveSubscribers(t *testing.T, d *liveDash) int {
	t.Helper()
	resp, err := d.srv.Client().Get(d.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "hermes_dashboard_live_subscribers "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return int(n)
		}
	}
	return -1
}

// processCPU is the test process's user and system CPU time so far.
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// liveMemoryNow is the Go heap in use, the resident set (VmRSS) and the goroutines of the
// test process, after a GC when gc says so.
func liveMemoryNow(gc bool) liveMemory {
	if gc {
		runtime.GC()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := liveMemory{heap: ms.HeapInuse, goroutines: runtime.NumGoroutine()}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				m.rss = kb << 10
			}
		}
	}
	return m
}

// liveLoadAverage is the first three fields of /proc/loadavg.
func liveLoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func liveMS(d time.Duration) string { return fmt.Sprintf("%.2f ms", d.Seconds()*1000) }

func liveSeconds(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

func liveMB(b uint64) string { return fmt.Sprintf("%.1f MB", float64(b)/(1<<20)) }
