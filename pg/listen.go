package pg

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Listener is one LISTEN connection on one channel that wakes whoever subscribed to a
// notification's payload. When the connection drops it reconnects with backoff; waiters are
// expected to poll as a fallback meanwhile, since a notification sent while it was away is
// gone.
type Listener struct {
	log     *slog.Logger
	cfg     *pgx.ConnConfig
	channel string
	cancel  context.CancelFunc
	done    chan struct{}
	started chan struct{} // closed once the first LISTEN attempt has finished

	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
}

// Listen starts a Listener on channel with its own connection made from cfg. Close it.
func Listen(cfg *pgx.ConnConfig, channel string, log *slog.Logger) *Listener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Listener{
		log: log, cfg: cfg.Copy(), channel: channel, cancel: cancel,
		done: make(chan struct{}), started: make(chan struct{}),
		waiters: map[string]map[chan struct{}]struct{}{},
	}
	go l.run(ctx)
	return l
}

// Started waits until the first LISTEN has been tried (or ctx ends), so that a
// notification sent after it returns is not missed while the connection is up.
func (l *Listener) Started(ctx context.Context) {
	select {
	case <-l.started:
	case <-ctx.Done():
	}
}

// Close ends the connection and waits for its goroutine.
func (l *Listener) Close() {
	l.cancel()
	<-l.done
}

// Subscribe returns a channel that receives a wake-up whenever payload is notified, and the
// function that ends the subscription.
func (l *Listener) Subscribe(payload string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	if l.waiters[payload] == nil {
		l.waiters[payload] = map[chan struct{}]struct{}{}
	}
	l.waiters[payload][ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(l.waiters[payload], ch)
		if len(l.waiters[payload]) == 0 {
			delete(l.waiters, payload)
		}
		l.mu.Unlock()
	}
}

// Subscribed reports whether anyone waits for payload.
func (l *Listener) Subscribed(payload string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.waiters[payload]) > 0
}

func (l *Listener) wake(payload string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch := range l.waiters[payload] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (l *Listener) run(ctx context.Context) {
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
		l.log.Warn("notification listener lost its connection; waiters poll until it is back", "channel", l.channel, "err", err, "retry_in", backoff.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (l *Listener) listen(ctx context.Context, started func()) error {
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

// Await looks until look says it found something (or fails), for at most wait: between
// looks it sleeps until a wake-up arrives on wakeups (a Listener subscription; nil polls
// only) or poll passes, since a notification can be missed while the listener reconnects.
// It returns look's error, or ctx's cause when ctx ends first; nil when wait passed with
// nothing found.
func Await(ctx context.Context, wakeups <-chan struct{}, wait, poll time.Duration, look func() (bool, error)) error {
	deadline := time.Now().Add(wait)
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for {
		found, err := look()
		if err != nil || found {
			return err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil
		}
		timer.Reset(min(left, poll))
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-wakeups:
			if !timer.Stop() {
				<-timer.C
			}
		case <-timer.C:
		}
	}
}
