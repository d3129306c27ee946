package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// listener is one LISTEN connection per Store that wakes the waiters of a key when it is
// released, forced or swept. When the connection drops, waiters fall back on polling
// until it is back.
type listener struct {
	log     *slog.Logger
	cfg     *pgx.ConnConfig
	channel string
	cancel  context.CancelFunc
	done    chan struct{}
	started chan struct{} // closed once the first LISTEN attempt has finished

	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
}

func (s *Store) ensureListener(ctx context.Context) *listener {
	s.listenOnce.Do(func() {
		lctx, cancel := context.WithCancel(context.Background())
		s.listener = &listener{
			log: s.log, cfg: s.pool.Config().ConnConfig.Copy(), channel: s.channel, cancel: cancel,
			done: make(chan struct{}), started: make(chan struct{}),
			waiters: map[string]map[chan struct{}]struct{}{},
		}
		go s.listener.run(lctx)
	})
	select {
	case <-s.listener.started:
	case <-ctx.Done():
	}
	return s.listener
}

func (l *listener) close() {
	l.cancel()
	<-l.done
}

// subscribe returns a channel that receives a wake-up whenever key is freed.
func (l *listener) subscribe(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	if l.waiters[key] == nil {
		l.waiters[key] = map[chan struct{}]struct{}{}
	}
	l.waiters[key][ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(l.waiters[key], ch)
		if len(l.waiters[key]) == 0 {
			delete(l.waiters, key)
		}
		l.mu.Unlock()
	}
}

func (l *listener) wake(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch := range l.waiters[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	var startOnce sync.Once
	started := func() { startOnce.Do(func() { close(l.started) }) }
	defer started()
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := l.listen(ctx, started)
		started()
		if ctx.Err() != nil {
			return
		}
		l.log.Warn("lease listener lost its connection; waiters poll until it is back", "err", err, "retry_in", backoff.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (l *listener) listen(ctx context.Context, started func()) error {
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		return err
	}
	started()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		l.wake(n.Payload)
	}
}

// Acquire waits until it holds key, woken by a notification when the key is released,
// forced or swept, and retrying at the poll interval (or when the current holding
// expires, if sooner) in case a notification is missed. It honours ctx.
func (s *Store) Acquire(ctx context.Context, key, holder string, ttl time.Duration) (Lease, error) {
	if err := errors.Join(CheckKey(key), CheckHolder(holder), CheckTTL(ttl)); err != nil {
		return Lease{}, err
	}
	start := time.Now()
	wakeups, unsubscribe := s.ensureListener(ctx).subscribe(key)
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
