package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"hermeshost/pg"
)

// The contention test runs this test binary as several OS processes, each hammering a
// few keys from many goroutines and writing audit rows under its leases.

const (
	childEnv       = "LEASE_CONTENTION_CHILD"
	childURLEnv    = "LEASE_CONTENTION_URL"
	childGoroutine = "LEASE_CONTENTION_GOROUTINES"
	childDuration  = "LEASE_CONTENTION_DURATION"
	contendedKeys  = 3
	contentionTTL  = 150 * time.Millisecond
)

func childMode() bool { return os.Getenv(childEnv) != "" }

func runContentionChild() {
	ctx := context.Background()
	n, _ := strconv.Atoi(os.Getenv(childGoroutine))
	d, _ := time.ParseDuration(os.Getenv(childDuration))
	pool, _, err := pg.Open(ctx, os.Getenv(childURLEnv), "")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer pool.Close()
	s := New(pool, Options{Poll: 50 * time.Millisecond})
	defer s.Close()
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failure error
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holder := fmt.Sprintf("%s/p%d/g%d", os.Getenv(childEnv), os.Getpid(), g)
			for time.Now().Before(deadline) {
				key := fmt.Sprintf("session:k%d", rand.IntN(contendedKeys))
				if err := contendOnce(ctx, s, key, holder); err != nil {
					mu.Lock()
					failure = errors.Join(failure, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if failure != nil {
		fmt.Fprintln(os.Stderr, failure)
		os.Exit(1)
	}
}

// contendOnce takes key, writes a start and an end audit row under it, and releases it.
// One turn in twenty stalls past its TTL, so takeovers of live-but-paused holders happen.
func contendOnce(ctx context.Context, s *Store, key, holder string) error {
	actx, cancel := context.WithTimeout(ctx, time.Second)
	l, err := s.Acquire(actx, key, holder, contentionTTL)
	cancel()
	if errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := fencedAudit(ctx, s, l, "start"); err != nil && !errors.Is(err, ErrLost) {
		return err
	}
	if rand.IntN(20) == 0 {
		time.Sleep(contentionTTL + 20*time.Millisecond)
	} else {
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
	}
	if err := fencedAudit(ctx, s, l, "end"); err != nil && !errors.Is(err, ErrLost) {
		return err
	}
	if err := s.Release(ctx, l); err != nil && !errors.Is(err, ErrLost) {
		return err
	}
	return nil
}

func TestContentionAcrossProcessesNeverOverlaps(t *testing.T) {
	f := newFixture(t, Options{})
	createAudit(t, f.pool)
	const procs, perProc = 3, 11 // 33 goroutines in 3 OS processes
	duration := 4 * time.Second
	var wg sync.WaitGroup
	errs := make([]error, procs)
	outs := make([][]byte, procs)
	for p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(),
				childEnv+"="+strconv.Itoa(p), childURLEnv+"="+f.url,
				childGoroutine+"="+strconv.Itoa(perProc), childDuration+"="+duration.String())
			outs[p], errs[p] = cmd.CombinedOutput()
		}()
	}
	wg.Wait()
	for p := range procs {
		if errs[p] != nil {
			t.Fatalf("process %d: %v\n%s", p, errs[p], outs[p])
		}
	}

	ctx := context.Background()
	rows, err := f.pool.Query(ctx, `SELECT key, holder, epoch, note, at FROM audit ORDER BY key, id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	type span struct {
		holder     string
		epoch      int64
		start, end time.Time
	}
	byKey := map[string][]*span{}
	writes := 0
	for rows.Next() {
		var key, holder, note string
		var epoch int64
		var at time.Time
		if err := rows.Scan(&key, &holder, &epoch, &note, &at); err != nil {
			t.Fatal(err)
		}
		writes++
		spans := byKey[key]
		if n := len(spans); n > 0 && spans[n-1].epoch == epoch {
			if spans[n-1].holder != holder {
				t.Fatalf("%s epoch %d has two holders: %s and %s", key, epoch, spans[n-1].holder, holder)
			}
			spans[n-1].end = at
			continue
		}
		byKey[key] = append(spans, &span{holder: holder, epoch: epoch, start: at, end: at})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	turns := 0
	for key, spans := range byKey {
		for i := 1; i < len(spans); i++ {
			prev, cur := spans[i-1], spans[i]
			if cur.epoch <= prev.epoch {
				t.Errorf("%s: epoch %d written after epoch %d", key, cur.epoch, prev.epoch)
			}
			if !cur.start.After(prev.end) {
				t.Errorf("%s: %s (epoch %d) wrote at %s while %s (epoch %d) still wrote until %s",
					key, cur.holder, cur.epoch, cur.start.Format(time.RFC3339Nano), prev.holder, prev.epoch, prev.end.Format(time.RFC3339Nano))
			}
		}
		turns += len(spans)
	}
	var takeovers int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'takeover') FROM lease_events`).Scan(&takeovers); err != nil {
		t.Fatal(err)
	}
	if turns < 100 || len(byKey) != contendedKeys {
		t.Fatalf("too little contention to mean anything: %d turns on %d keys", turns, len(byKey))
	}
	t.Logf("%d fenced writes in %d turns on %d keys, %d takeovers of paused holders", writes, turns, len(byKey), takeovers)
	if takeovers == 0 {
		t.Fatal("no paused holder was ever taken over: the test did not exercise fencing")
	}
}
