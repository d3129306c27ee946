package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"hermeshost/pg"
)

// ensureListener starts the Store's one LISTEN connection on first use: it wakes the
// waiters of a key when it is released, forced or swept; while the connection is down,
// waiters fall back on polling.
func (s *Store) ensureListener(ctx context.Context) *pg.Listener {
	s.listenOnce.Do(func() {
		s.listener = pg.Listen(s.pool.Config().ConnConfig, s.channel, s.log)
	})
	s.listener.Started(ctx)
	return s.listener
}

// Acquire waits until it holds key, woken by a notification when the key is released,
// forced or swept, and retrying at the poll interval (or when the current holding
// expires, if sooner) in case a notification is missed. It honours ctx.
func (s *Store) Acquire(ctx context.Context, key, holder string, ttl time.Duration) (Lease, error) {
	if err := errors.Join(CheckKey(key), CheckHolder(holder), CheckTTL(ttl)); err != nil {
		return Lease{}, err
	}
	start := time.Now()
	wakeups, unsubscribe := s.ensureListener(ctx).Subscribe(key)
	defer unsubscribe()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for {
		l, err := s.tryAcquire(ctx, key, holder, ttl, 2*s.poll)
		if err == nil {
			s.metrics.wait.WithLabelValues(Namespace(key)).Observe(time.Since(start).Seconds())
			return l, nil
		}
		var held *HeldError
		if !errors.As(err, &held) {
			return Lease{}, err
		}
		wait := s.poll
		if untilExpiry := time.Until(held.ExpiresAt) + time.Millisecond; untilExpiry > 0 && untilExpiry < wait {
			wait = untilExpiry
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return Lease{}, fmt.Errorf("wait for lease %s: %w", key, context.Cause(ctx))
		case <-wakeups:
			if !timer.Stop() {
				<-timer.C
			}
		case <-timer.C:
		}
	}
}
