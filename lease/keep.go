package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Kept is a lease being refreshed in the background while work runs under it.
type Kept struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{}
	once   sync.Once
	done   chan struct{}

	mu    sync.Mutex
	lease Lease

	// deadline is when the lease may have expired unless a refresh lands first; its
	// keeper's mu guards it.
	deadline time.Time
}

// Context is the work's context: it ends, with cause ErrLost, the moment the lease is lost
// (a refresh refused, or no refresh succeeded before the lease would expire), and when the
// parent ends.
func (k *Kept) Context() context.Context { return k.ctx }

// Lease is the lease as last refreshed.
func (k *Kept) Lease() Lease {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lease
}

func (k *Kept) setLease(l Lease) {
	k.mu.Lock()
	k.lease = l
	k.mu.Unlock()
}

// Stop ends the refreshing (it does not release) and returns the lease as last refreshed.
// A refresh in flight is waited for (unless the work's context has ended), so the lease
// it returns is the one the table holds.
func (k *Kept) Stop() Lease {
	k.once.Do(func() { close(k.stop) })
	<-k.done
	return k.Lease()
}

// Keep refreshes l every ttl/3 while work runs. Every lease kept through one Store with one
// ttl is refreshed in the same round, in one statement and one commit (RefreshAll): a
// dispatcher running many jobs at once makes one commit a round, where a commit per job
// let a saturated machine's rounds outlast the TTL. A notification on the key (a forced
// release) triggers a round at once, so a forced-out holder stops within milliseconds
// rather than at the next round.
func (s *Store) Keep(ctx context.Context, l Lease, ttl time.Duration) *Kept {
	kctx, cancel := context.WithCancelCause(ctx)
	k := &Kept{ctx: kctx, cancel: cancel, stop: make(chan struct{}), done: make(chan struct{}), lease: l}
	// A lease the round's statement would refuse is refused here, alone, rather than
	// failing the round of every other lease kept with it.
	if err := errors.Join(CheckTTL(ttl), CheckKey(l.Key), CheckHolder(l.Holder)); err != nil {
		cancel(err)
		close(k.done)
		return k
	}
	// The lease is certainly ours until the earlier of its recorded expiry and ttl from now.
	k.deadline = time.Now().Add(min(ttl, time.Until(l.ExpiresAt)))
	wakeups, unsubscribe := s.ensureListener(kctx).Subscribe(l.Key)
	kp := s.keeper(ttl)
	kp.join(k)
	go func() {
		defer close(k.done)
		defer unsubscribe()
		defer kp.leave(k)
		for {
			select {
			case <-k.stop:
				return
			case <-kctx.Done():
				return
			case <-wakeups:
				kp.wake()
			}
		}
	}()
	return k
}

// keeper refreshes the leases kept with one TTL, all of them in each round.
type keeper struct {
	s        *Store
	ttl      time.Duration
	interval time.Duration
	kick     chan struct{}

	mu      sync.Mutex
	members map[*Kept]struct{}
	running bool       // a goroutine runs the rounds; it ends when no lease is kept
	round   *keepRound // the round in flight, if any
}

type keepRound struct {
	done    chan struct{}
	members map[*Kept]bool
}

func (s *Store) keeper(ttl time.Duration) *keeper {
	s.keepersMu.Lock()
	defer s.keepersMu.Unlock()
	if s.keepers == nil {
		s.keepers = map[time.Duration]*keeper{}
	}
	kp := s.keepers[ttl]
	if kp == nil {
		kp = &keeper{s: s, ttl: ttl, interval: ttl / 3, kick: make(chan struct{}, 1), members: map[*Kept]struct{}{}}
		s.keepers[ttl] = kp
	}
	return kp
}

// wake asks for a round now.
func (kp *keeper) wake() {
	select {
	case kp.kick <- struct{}{}:
	default:
	}
}

func (kp *keeper) join(k *Kept) {
	kp.mu.Lock()
	kp.members[k] = struct{}{}
	start := !kp.running
	kp.running = true
	// A lease with less life left than the next round would leave it (taken a while
	// before it was kept) is refreshed at once.
	soon := time.Until(k.deadline) < 2*kp.interval
	kp.mu.Unlock()
	kp.s.metrics.kept.Inc()
	if start {
		go kp.run()
	}
	if soon {
		kp.wake()
	}
}

// leave stops keeping k, waiting for a round in flight that refreshes it while k's
// context lasts.
func (kp *keeper) leave(k *Kept) {
	kp.mu.Lock()
	delete(kp.members, k)
	r := kp.round
	inRound := r != nil && r.members[k]
	empty := len(kp.members) == 0
	kp.mu.Unlock()
	kp.s.metrics.kept.Dec()
	if empty {
		kp.wake() // so that the rounds' goroutine ends now, not a round from now
	}
	if inRound {
		// Not past the end of k's context: the work is over, and a statement the database
		// is slow to answer must not hold up its shutdown.
		select {
		case <-r.done:
		case <-k.ctx.Done():
		}
	}
}

func (kp *keeper) run() {
	timer := time.NewTimer(kp.interval)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-kp.kick:
		}
		kp.mu.Lock()
		if len(kp.members) == 0 {
			kp.running = false
			kp.mu.Unlock()
			return
		}
		kp.mu.Unlock()
		resetTimer(timer, kp.refresh())
	}
}

// refresh runs one round and returns the wait until the next: the interval, or after a
// failed statement a quarter of it (and never past the first lease's deadline).
func (kp *keeper) refresh() time.Duration {
	began := time.Now()
	r := &keepRound{done: make(chan struct{}), members: map[*Kept]bool{}}
	var batch []*Kept
	kp.mu.Lock()
	for k := range kp.members {
		switch {
		case k.ctx.Err() != nil: // its goroutine is leaving
		case began.After(k.deadline):
			l := k.Lease()
			k.cancel(fmt.Errorf("lease %s not refreshed before it expired: %w", l.Key, ErrLost))
			delete(kp.members, k)
		default:
			r.members[k] = true
			batch = append(batch, k)
		}
	}
	kp.round = r
	kp.mu.Unlock()
	defer func() {
		kp.mu.Lock()
		kp.round = nil
		kp.mu.Unlock()
		close(r.done)
	}()

	failed := false
	// A key kept twice (the same lease kept by two callers) goes in a statement of its own.
	for pending := batch; len(pending) > 0; {
		var layer, rest []*Kept
		byKey := map[string]*Kept{}
		for _, k := range pending {
			if key := k.Lease().Key; byKey[key] == nil {
				byKey[key] = k
				layer = append(layer, k)
			} else {
				rest = append(rest, k)
			}
		}
		pending = rest
		ls := make([]Lease, len(layer))
		for i, k := range layer {
			ls[i] = k.Lease()
		}
		sent := time.Now()
		// A refresh that takes longer than the TTL is of no use to anyone.
		ctx, cancel := context.WithTimeout(context.Background(), kp.ttl)
		kept, lost, err := kp.s.RefreshAll(ctx, ls, kp.ttl)
		cancel()
		if err != nil {
			failed = true
			kp.s.log.Warn("lease refresh failed; retrying", "leases", len(ls), "err", err)
			continue
		}
		for _, l := range kept {
			k := byKey[l.Key]
			k.setLease(l)
			kp.mu.Lock()
			k.deadline = sent.Add(kp.ttl)
			kp.mu.Unlock()
		}
		for _, l := range lost {
			k := byKey[l.Key]
			kp.mu.Lock()
			if _, ok := kp.members[k]; ok {
				kp.s.log.Warn("lease lost; cancelling the work under it", "key", l.Key, "holder", l.Holder, "epoch", l.Epoch)
				k.cancel(fmt.Errorf("refresh %s as %s (epoch %d): %w", l.Key, l.Holder, l.Epoch, ErrLost))
				delete(kp.members, k)
			}
			kp.mu.Unlock()
		}
	}
	took := time.Since(began)
	kp.s.metrics.keepRound.Observe(took.Seconds())
	if took > kp.interval {
		kp.s.log.Warn("refreshing the kept leases took longer than their refresh interval",
			"leases", len(batch), "took", took.String(), "interval", kp.interval.String())
	}
	if !failed {
		return kp.interval
	}
	next := max(kp.interval/4, time.Millisecond)
	kp.mu.Lock()
	for k := range kp.members {
		next = min(next, max(time.Until(k.deadline), time.Millisecond))
	}
	kp.mu.Unlock()
	return next
}

func resetTimer(t *time.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(d)
}
