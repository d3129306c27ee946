// Package lease is who owns a turn: a Postgres row every process can see, not a lock in
// one process's memory. A lease has a holder, an expiry and an epoch (fencing token) that
// only grows for its key, so a holder that wakes up late is refused everywhere: its
// refreshes, its release and every write it fences with the epoch.
//
// Keys are namespaced: session:<id>, home:<org>, org:<id>. Every acquire, takeover,
// refresh, release, expiry and forced release is an event row and a metric.
package lease

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"
)

// Namespaces a key may use.
var Namespaces = []string{"session", "home", "org", "instance"}

var keyPattern = regexp.MustCompile(`^(session|home|org|instance):[A-Za-z0-9._-]{1,200}$`)

// Limits on what callers pass in.
const (
	MaxHolderLen = 200
	MaxTTL       = 24 * time.Hour
)

// Lease is one holding of a key, as the database granted it.
type Lease struct {
	Key        string
	Holder     string
	Epoch      int64
	AcquiredAt time.Time
	ExpiresAt  time.Time
	// Secret is the holding's own, handed out by Acquire (the database keeps only its
	// hash): Refresh and Release need it, so knowing key, holder and epoch is not enough.
	Secret string
}

// Info is what the database says about a key now.
type Info struct {
	Key        string
	Holder     string // empty when free
	Epoch      int64
	AcquiredAt time.Time
	ExpiresAt  time.Time
	UpdatedAt  time.Time
}

// Held reports whether someone holds the key and the holding has not expired at now.
func (i Info) Held(now time.Time) bool { return i.Holder != "" && i.ExpiresAt.After(now) }

// Event is one row of a key's history.
type Event struct {
	ID             int64
	Key            string
	Kind           string
	Holder         string
	Epoch          int64
	PreviousHolder string
	Actor          string
	Reason         string
	At             time.Time
}

// Event kinds.
const (
	KindAcquire      = "acquire"
	KindTakeover     = "takeover"
	KindRefresh      = "refresh"
	KindRelease      = "release"
	KindExpire       = "expire"
	KindForceRelease = "force_release"
)

var (
	// ErrHeld: someone else holds the key (TryAcquire). The error is a *HeldError.
	ErrHeld = errors.New("lease is held")
	// ErrLost: the lease is no longer this holder's at this epoch (it expired and was
	// taken, or was forced): refresh, release and fenced writes are refused.
	ErrLost = errors.New("lease lost")
	// ErrNotHolder: a release by someone who never held this epoch.
	ErrNotHolder = errors.New("not the lease holder")
	// ErrNotHeld: a forced release of a key nobody holds.
	ErrNotHeld = errors.New("lease is not held")
	// ErrUnknownKey: no lease was ever taken on the key.
	ErrUnknownKey = errors.New("no such lease")
	// ErrInvalid: bad input; nothing was written.
	ErrInvalid = errors.New("invalid lease request")
)

// HeldError says who holds the key and until when.
type HeldError struct {
	Key       string
	Holder    string
	Epoch     int64
	ExpiresAt time.Time
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("lease %s is held by %s (epoch %d) until %s", e.Key, e.Holder, e.Epoch, e.ExpiresAt.UTC().Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
}

// CheckKey validates a namespaced key.
func CheckKey(key string) error {
	if key == "" {
		return invalid("empty key")
	}
	if !keyPattern.MatchString(key) {
		ns, _, found := strings.Cut(key, ":")
		if !found || !isNamespace(ns) {
			return invalid("key %q is not in a known namespace (want %s:<id>)", clip(key), strings.Join(Namespaces, ":, "))
		}
		return invalid("key %q: the id must be 1-200 of A-Z a-z 0-9 . _ -", clip(key))
	}
	return nil
}

func isNamespace(ns string) bool {
	for _, n := range Namespaces {
		if n == ns {
			return true
		}
	}
	return false
}

// CheckHolder validates a holder name: 1-200 printable characters.
func CheckHolder(holder string) error {
	if holder == "" {
		return invalid("empty holder")
	}
	if len(holder) > MaxHolderLen {
		return invalid("holder is %d bytes, more than %d", len(holder), MaxHolderLen)
	}
	for _, r := range holder {
		if !unicode.IsPrint(r) {
			return invalid("holder %q has a non-printable character", clip(holder))
		}
	}
	return nil
}

// CheckTTL validates a lease duration.
func CheckTTL(ttl time.Duration) error {
	if ttl <= 0 {
		return invalid("ttl %s is not positive", ttl)
	}
	if ttl > MaxTTL {
		return invalid("ttl %s is longer than %s", ttl, MaxTTL)
	}
	if ttl < time.Millisecond {
		return invalid("ttl %s is shorter than 1ms", ttl)
	}
	return nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// Namespace is the part of a valid key before the colon (for metrics).
func Namespace(key string) string {
	ns, _, _ := strings.Cut(key, ":")
	return ns
}
