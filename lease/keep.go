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

// Stop ends the refreshing (it does not release) and returns the lease as last refreshed.
func (k *Kept) Stop() Lease {
	k.once.Do(func() { close(k.stop) })
	<-k.done
	return k.Lease()
}

// Keep refreshes l every ttl/3 while work runs. A notification on the key (a forced
// release) triggers an immediate refresh, so a forced-out holder stops within
// milliseconds rather than at its next refresh.
func (s *Store) Keep(ctx context.Context, l Lease, ttl time.Duration) *Kept {
	kctx, cancel := context.WithCancelCause(ctx)
	k := &Kept{ctx: kctx, cancel: cancel, stop: make(chan struct{}), done: make(chan struct{}), lease: l}
	if err := CheckTTL(ttl); err != nil {
		cancel(err)
		close(k.done)
		return k
	}
	// The lease is certainly ours until the earlier of its recorded expiry and ttl from now.
	deadline := time.Now().Add(min(ttl, time.Until(l.ExpiresAt)))
	wakeups, unsubscribe := s.ensureListener(kctx).Subscribe(l.Key)
	go func() {
		defer close(k.done)
		defer unsubscribe()
		interval := ttl / 3
		retry := max(interval/4, time.Millisecond)
		timer := time.NewTimer(interval)
		defer timer.Stop()
		for {
			select {
			case <-k.stop:
				return
			case <-kctx.Done():
				return
			case <-wakeups:
			case <-timer.C:
			}
			if time.Now().After(deadline) {
				cancel(fmt.Errorf("lease %s not refreshed before it expired: %w", l.Key, ErrLost))
				return
			}
			sent := time.Now()
			// A refresh still waiting (for a connection, a row lock) when the lease may have
			// expired is given up: the work must stop then, not when the refresh returns.
			rctx, rcancel := context.WithDeadline(kctx, deadline)
			next, err := s.Refresh(rctx, k.Lease(), ttl)
			rcancel()
			switch {
			case err == nil:
				k.mu.Lock()
				k.lease = next
				k.mu.Unlock()
				deadline = sent.Add(ttl)
				resetTimer(timer, interval)
			case errors.Is(err, ErrLost):
				s.log.Warn("lease lost; cancelling the work under it", "key", l.Key, "holder", l.Holder, "epoch", l.Epoch)
				cancel(err)
				return
			case kctx.Err() != nil:
				return
			default:
				s.log.Warn("lease refresh failed; retrying", "key", l.Key, "err", err)
				resetTimer(timer, min(retry, max(time.Until(deadline), time.Millisecond)))
			}
		}
	}()
	return k
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
