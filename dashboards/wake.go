package dashboards

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Wake is a channel that receives a value after every notification on the store's channel
// (LISTEN hermes_dashboards), coalesced: a burst of requests is one value. It also receives
// one each time the listener (re)connects, since requests made while nobody listened were
// not heard; the first value therefore says the listener is up. The first call starts the
// listener on a connection of its own; Close stops it. It is meant for one consumer, the
// dispatcher's loop, which should still look every few seconds: a notification sent while
// the connection was down is lost.
func (s *Store) Wake() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.listening {
		s.listening = true
		ctx, cancel := context.WithCancel(context.Background())
		s.stopListen, s.listenerDone = cancel, make(chan struct{})
		go s.listen(ctx, s.listenerDone)
	}
	return s.wake
}

func (s *Store) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Store) listen(ctx context.Context, done chan struct{}) {
	defer close(done)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		listened, err := s.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if listened {
			backoff = 100 * time.Millisecond
		}
		s.log.Warn("dashboard request listener lost its connection; requests are polled until it is back",
			"channel", s.channel, "err", err, "retry_in", backoff.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// listenOnce listens on one connection until it fails; listened says LISTEN took effect.
func (s *Store) listenOnce(ctx context.Context) (listened bool, err error) {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		return false, err
	}
	s.signal()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return true, err
		}
		s.signal()
	}
}
