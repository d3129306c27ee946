package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"hermeshost/service"
)

// The health alarms a Login raises.
const (
	// alarmPersist is up while the rotated login lives only in memory.
	alarmPersist = "auth_persist"
	// alarmLogin is up while the provider refuses the login or answers for another identity.
	alarmLogin = "auth_login"
)

// refreshTimeout bounds one refresh-token grant. The grant runs apart from the request
// that needed it: once the provider rotates the refresh token, the answer must be
// received and kept even if that request's client has gone.
const refreshTimeout = 30 * time.Second

// ErrIdentityMismatch is a login of another account than the one expected: a refresh
// answered for someone else, or an auth.json that now holds another identity.
var ErrIdentityMismatch = errors.New("the login belongs to another identity")

// ErrLoginClosed is a refresh asked of a Login after Close.
var ErrLoginClosed = errors.New("the gateway login is closed")

// LoginOptions configure OpenLogin.
type LoginOptions struct {
	// Path is auth.json.
	Path  string
	OAuth OAuthConfig
	Log   *slog.Logger
	// Health carries the alarms; Registry the login's metrics.
	Health   *service.Health
	Registry prometheus.Registerer
	// Now is the clock that decides whether the access token has expired; nil is time.Now.
	Now func() time.Time
	// RetryMin and RetryMax bound the backoff between attempts to write a rotated login
	// that could not be written; zero means 1s and 1m.
	RetryMin, RetryMax time.Duration
}

// Login is the gateway's one OAuth login: it hands out the access token, refreshes it in
// one place however many requests need it at once, and keeps auth.json in step.
//
// A rotated refresh token is written to auth.json (atomically, with a receipt) before the
// new access token is handed out. If the write fails the provider has already invalidated
// the old token, so the new one is kept in memory and used, the write is retried with
// backoff, and an alarm (health, log, gateway_auth_persist_pending) stays up until a
// write succeeds.
type Login struct {
	path     string
	oauth    OAuthConfig
	log      *slog.Logger
	health   *service.Health
	metrics  *loginMetrics
	now      func() time.Time
	identity string
	retryMin time.Duration
	retryMax time.Duration

	flight singleflight.Group
	// refreshMu makes refreshes one at a time: with rotation, a second concurrent grant
	// would spend a refresh token the first already spent.
	refreshMu sync.Mutex
	closed    bool
	// writeMu orders writes of auth.json; creds only change while it is held, so a retry
	// always writes the newest login.
	writeMu sync.Mutex

	mu      sync.Mutex
	creds   Credentials
	pending bool          // creds are newer than auth.json
	synced  chan struct{} // closed while !pending

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

// OpenLogin loads auth.json with the strict loader: a missing, empty, truncated or
// unparseable file is an error naming it, never an empty login.
func OpenLogin(opts LoginOptions) (*Login, error) {
	creds, err := loadCredentials(opts.Path)
	if err != nil {
		return nil, err
	}
	if opts.Log == nil || opts.Health == nil || opts.Registry == nil {
		return nil, errors.New("gateway login: Log, Health and Registry are required")
	}
	if opts.OAuth.TokenURL == "" {
		return nil, errors.New("gateway login: no token URL to refresh the login at")
	}
	l := &Login{
		path: opts.Path, oauth: opts.OAuth, log: opts.Log, health: opts.Health,
		metrics: newLoginMetrics(opts.Registry), now: opts.Now, identity: creds.Identity,
		retryMin: opts.RetryMin, retryMax: opts.RetryMax,
		creds: creds, synced: make(chan struct{}),
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	close(l.synced)
	if l.now == nil {
		l.now = time.Now
	}
	if l.retryMin <= 0 {
		l.retryMin = time.Second
	}
	if l.retryMax < l.retryMin {
		l.retryMax = max(time.Minute, l.retryMin)
	}
	go l.persistLoop()
	l.log.Info("gateway login loaded", "path", l.path, "login", creds)
	return l, nil
}

// Synced is closed while auth.json holds the login in memory, and replaced by an open
// channel whenever a rotated login could not be written.
func (l *Login) Synced() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.synced
}

// CheckFile is the health probe of auth.json: it must load strictly and still be this
// gateway's identity, so a file that goes bad while the gateway runs shows on /healthz.
func (l *Login) CheckFile(context.Context) error {
	on, err := loadCredentials(l.path)
	if err != nil {
		return err
	}
	if on.Identity != l.identity {
		return fmt.Errorf("%s now holds the login of %q, not %q which this gateway serves; restart the gateway to use it", l.path, on.Identity, l.identity)
	}
	return nil
}

// Close stops the write retries, after one last attempt if auth.json is behind.
func (l *Login) Close() error {
	l.refreshMu.Lock()
	l.closed = true
	l.refreshMu.Unlock()
	close(l.stop)
	<-l.done
	if err := l.writePending(); err != nil {
		l.log.Error("gateway login: auth.json is behind the rotated login, which is lost with this process; log in again",
			"path", l.path, "err", err)
		return err
	}
	return nil
}

func (l *Login) token(ctx context.Context) (string, error) {
	l.mu.Lock()
	c := l.creds
	l.mu.Unlock()
	if c.fresh(l.now()) {
		return c.AccessToken, nil
	}
	return l.refresh(ctx, c.AccessToken)
}

func (l *Login) rejected(ctx context.Context, token string) (string, bool, error) {
	next, err := l.refresh(ctx, token)
	if err != nil {
		return "", false, err
	}
	return next, next != token, nil
}

// refresh returns an access token other than stale, refreshing the login if no fresh one
// is at hand. Callers holding the same stale token share one grant.
func (l *Login) refresh(ctx context.Context, stale string) (string, error) {
	ch := l.flight.DoChan(stale, func() (any, error) { return l.refreshOnce(stale) })
	select {
	case <-ctx.Done():
		return "", ctx.Err()
	case res := <-ch:
		if res.Err != nil {
			return "", res.Err
		}
		return res.Val.(string), nil
	}
}

func (l *Login) refreshOnce(stale string) (string, error) {
	l.refreshMu.Lock()
	defer l.refreshMu.Unlock()
	if l.closed {
		return "", ErrLoginClosed
	}
	l.mu.Lock()
	cur := l.creds
	l.mu.Unlock()
	// Another grant may have finished while this one waited for refreshMu.
	if cur.AccessToken != stale && cur.fresh(l.now()) {
		return cur.AccessToken, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), refreshTimeout)
	defer cancel()
	a, err := l.oauth.refresh(ctx, cur.RefreshToken)
	if err != nil {
		l.metrics.refreshes.WithLabelValues("failed").Inc()
		if IsInvalidGrant(err) {
			l.health.Alarm(alarmLogin, "the provider refused the refresh token; run hermes-host gateway login")
		}
		l.log.Error("gateway login: refresh failed", "identity", l.identity, "err", err)
		return "", err
	}
	// Providers need not send an id token with a refresh; when one comes, it must be
	// the stored identity's.
	if a.IDToken != "" {
		id, err := identityOf(a.IDToken)
		if err != nil || id != l.identity {
			l.metrics.refreshes.WithLabelValues("identity_mismatch").Inc()
			reason := fmt.Sprintf("the provider answered a refresh of %q for another identity; the answer was refused", l.identity)
			l.health.Alarm(alarmLogin, reason)
			l.log.Error("gateway login: "+reason, "identity", l.identity, "answered_for", id, "err", err)
			return "", fmt.Errorf("refresh the gateway login of %q: %w", l.identity, ErrIdentityMismatch)
		}
	}
	next := a.credentials(l.identity, cur.RefreshToken, l.now())
	persisted := l.adopt(next)
	l.metrics.refreshes.WithLabelValues("ok").Inc()
	l.health.Alarm(alarmLogin, "")
	l.log.Info("gateway login refreshed", "login", next, "rotated", next.RefreshToken != cur.RefreshToken, "persisted", persisted)
	return next.AccessToken, nil
}

// adopt writes next to auth.json and only then makes it the login in memory. When the
// write fails next is adopted anyway (the provider has rotated the old refresh token
// away) and the retries take over.
func (l *Login) adopt(next Credentials) (persisted bool) {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	err := l.write(next)
	l.mu.Lock()
	l.creds = next
	l.mu.Unlock()
	if err != nil {
		l.persistFailed(err)
		return false
	}
	l.persistSucceeded()
	return true
}

// writePending writes the login in memory if auth.json is behind it.
func (l *Login) writePending() error {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	l.mu.Lock()
	c, pending := l.creds, l.pending
	l.mu.Unlock()
	if !pending {
		return nil
	}
	if err := l.write(c); err != nil {
		l.persistFailed(err)
		return err
	}
	l.persistSucceeded()
	return nil
}

// write writes c to auth.json unless the file now holds another identity's login (an
// operator ran login --replace while this gateway ran): that one is never overwritten.
func (l *Login) write(c Credentials) error {
	if on, err := loadCredentials(l.path); err == nil && on.Identity != c.Identity {
		return fmt.Errorf("refusing to write over %s, which now holds the login of %q: %w", l.path, on.Identity, ErrIdentityMismatch)
	}
	return writeCredentials(l.path, c)
}

// persistFailed raises the alarm and schedules a retry. Called with writeMu held.
func (l *Login) persistFailed(err error) {
	l.mu.Lock()
	if !l.pending {
		l.pending = true
		l.synced = make(chan struct{})
	}
	l.mu.Unlock()
	l.metrics.persistFailed.Inc()
	l.metrics.persistPending.Set(1)
	l.health.Alarm(alarmPersist, fmt.Sprintf("the rotated login is only in memory: writing %s failed: %v", l.path, err))
	l.log.Error("gateway login: could not write the rotated login; keeping it in memory and retrying", "path", l.path, "err", err)
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// persistSucceeded clears the alarm. Called with writeMu held.
func (l *Login) persistSucceeded() {
	l.mu.Lock()
	was, synced := l.pending, l.synced
	l.pending = false
	l.mu.Unlock()
	if !was {
		return
	}
	// The alarm and gauge come down before Synced fires, so whoever waits on it
	// sees the gateway healthy.
	l.metrics.persistPending.Set(0)
	l.health.Alarm(alarmPersist, "")
	l.log.Info("gateway login: auth.json holds the rotated login again", "path", l.path)
	close(synced)
}

// persistLoop retries a failed write with backoff until one succeeds.
func (l *Login) persistLoop() {
	defer close(l.done)
	for {
		select {
		case <-l.stop:
			return
		case <-l.kick:
		}
		delay := l.retryMin
		for {
			t := time.NewTimer(delay)
			select {
			case <-l.stop:
				t.Stop()
				return
			case <-t.C:
			}
			if l.writePending() == nil {
				break
			}
			delay = min(2*delay, l.retryMax)
		}
	}
}
