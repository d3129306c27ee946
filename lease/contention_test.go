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
	childTurns     = "LEASE_CONTENTION_TURNS"
	contendedKeys  = 3
	contentionTTL  = 150 * time.Millisecond
)

func childMode() bool { return os.Getenv(childEnv) != "" }

func runContentionChild() {
	ctx := context.Background()
	n, _ := strconv.Atoi(os.Getenv(childGoroutine))
	turns, _ := strconv.Atoi(os.Getenv(childTurns))
	pool, _, err := pg.Open(ctx, os.Getenv(childURLEnv), "")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer pool.Close()
	s := New(pool, Options{Poll: 50 * time.Millisecond})
	defer s.Close()
	// The work is counted, not timed: a loaded CI machine takes longer, never does less.
	// The deadline only keeps a wedged store from hanging the test.
	deadline := time.Now().Add(2 * time.Minute)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failure error
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holder := fmt.Sprintf("%s/p%d/g%d", os.Getenv(childEnv), os.Getpid(), g)
			for done := 0; done < turns; {
				if time.Now().After(deadline) {
					mu.Lock()
					failure = errors.Join(failure, fmt.Errorf("%s: %d of %d turns before the deadline", holder, done, turns))
					mu.Unlock()
					return
				}
				key := fmt.Sprintf("session:k%d", rand.IntN(contendedKeys))
				// About one turn in eight stalls past its TTL, so takeovers of live-but-paused
				// holders happen in every run, not by chance.
				took, err := contendOnce(ctx, s, key, holder, (g+done)%8 == 0)
				if err != nil {
					mu.Lock()
					failure = errors.Join(failure, err)
					mu.Unlock()
					return
				}
				if took {
					done++
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

// contendOnce takes key, writes a start and an end audit row under it, and releases it;
// took says whether the lease was had at all. A stalling turn sleeps past its TTL.
func contendOnce(ctx context.Context, s *Store, key, holder string, stall bool) (took bool, err error) {
	actx, cancel := context.WithTimeout(ctx, time.Second)
	l, err := s.Acquire(actx, key, holder, contentionTTL)
	cancel()
	if errors.Is(err, context.DeadlineExceeded) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := fencedAudit(ctx, s, l, "start"); err != nil && !errors.Is(err, ErrLost) {
		return true, err
	}
	if stall {
		time.Sleep(contentionTTL + 20*time.Millisecond)
	} else {
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
	}
	if err := fencedAudit(ctx, s, l, "end"); err != nil && !errors.Is(err, ErrLost) {
		return true, err
	}
	if err := s.Release(ctx, l); err != nil && !errors.Is(err, ErrLost) {
		return true, err
	}
	return true, nil
}

func TestContentionAcrossProcessesNeverOverlaps(t *testing.T) {
	f := newFixture(t, Options{})
	createAudit(t, f.pool)
	const procs, perProc, turnsEach = 3, 11, 5 // 33 goroutines in 3 OS processes, 165 turns
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
				childGoroutine+"="+strconv.Itoa(perProc), childTurns+"="+strconv.Itoa(turnsEach))
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
	var takeovers, had int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'takeover'), count(*) FILTER (WHERE kind IN ('acquire', 'takeover'))
		FROM lease_events`).Scan(&takeovers, &had); err != nil {
		t.Fatal(err)
	}
	// Every goroutine had its lease turnsEach times. A turn whose lease was taken before its
	// first write leaves no row, and on a loaded machine many do (CI on a914f77: 102 of
	// 165), which is fencing at work; every key must still have turns one after another to
	// compare.
	// (An Acquire that gave up at its deadline as its statement committed had one too.)
	if had < procs*perProc*turnsEach {
		t.Fatalf("%d leases had, want %d turns at least", had, procs*perProc*turnsEach)
	}
	for key, spans := range byKey {
		if len(spans) < 2 {
			t.Fatalf("too little contention to mean anything: %s had %d turn(s) that wrote", key, len(spans))
		}
	}
	if len(byKey) != contendedKeys {
		t.Fatalf("too little contention to mean anything: writes on %d of %d keys", len(byKey), contendedKeys)
	}
	t.Logf("%d fenced writes in %d of %d turns on %d keys, %d takeovers of paused holders", writes, turns, had, len(byKey), takeovers)
	if takeovers == 0 {
		t.Fatal("no paused holder was ever taken over: the test did not exercise fencing")
	}
}
