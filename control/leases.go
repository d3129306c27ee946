package control

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"hermeshost/lease"
	"hermeshost/service"
)

// maxKeyID is the longest id a stored lease key may have (lease's key pattern).
const maxKeyID = 200

// leaseKey is a lease key as the caller names it and as it is stored.
type leaseKey struct {
	client string // home:<org> or session:<id>
	stored string // home:<org> or session:<org>.<id>
}

// scopeKey maps the caller's key into its org: home:<own org> as it is, session:<id> to
// session:<org>.<id> (org ids have no dots, so the first dot ends the org). Any other key
// is refused; on refusal it has answered and returns false.
func scopeKey(w http.ResponseWriter, org, key string) (leaseKey, bool) {
	if err := lease.CheckKey(key); err != nil {
		badRequest(w, "%v", err)
		return leaseKey{}, false
	}
	ns, id, _ := strings.Cut(key, ":")
	switch ns {
	case "home":
		if id != org {
			service.WriteError(w, http.StatusForbidden, CodeForbidden, "a control key reaches only its own org's home lease, home:"+org)
			return leaseKey{}, false
		}
		return leaseKey{client: key, stored: key}, true
	case "session":
		if most := maxKeyID - len(org) - 1; len(id) > most {
			badRequest(w, "session id is %d characters; this org's may have at most %d", len(id), most)
			return leaseKey{}, false
		}
		return leaseKey{client: key, stored: "session:" + org + "." + id}, true
	}
	service.WriteError(w, http.StatusForbidden, CodeForbidden, "only home:"+org+" and session: leases are reachable with a control key; "+ns+": leases are the dispatcher's")
	return leaseKey{}, false
}

// millis is a JSON millisecond count as a Duration, saturating instead of overflowing, so
// that lease.CheckTTL sees an absurd value as too long rather than as something else.
func millis(ms int64) time.Duration {
	const perMS = int64(time.Millisecond)
	switch {
	case ms > math.MaxInt64/perMS:
		return math.MaxInt64
	case ms < math.MinInt64/perMS:
		return math.MinInt64
	}
	return time.Duration(ms) * time.Millisecond
}

func checkEpoch(w http.ResponseWriter, epoch int64) bool {
	if epoch <= 0 {
		badRequest(w, "epoch must be a positive integer, the one acquire returned")
		return false
	}
	return true
}

// checkTTL speaks of ttl_ms, the field the caller sent, rather than of a Duration.
func checkTTL(w http.ResponseWriter, ttl time.Duration) bool {
	if lease.CheckTTL(ttl) != nil {
		badRequest(w, "ttl_ms must be from 1 to %d", lease.MaxTTL.Milliseconds())
		return false
	}
	return true
}

func checkLeaseInput(w http.ResponseWriter, err error) bool {
	if err != nil {
		badRequest(w, "%v", err)
		return false
	}
	return true
}

func wireLease(k leaseKey, l lease.Lease) Lease {
	return Lease{Key: k.client, Holder: l.Holder, Epoch: l.Epoch, AcquiredAt: l.AcquiredAt, ExpiresAt: l.ExpiresAt}
}

type acquireRequest struct {
	Key    string `json:"key"`
	Holder string `json:"holder"`
	TTLMS  int64  `json:"ttl_ms"`
	WaitMS int64  `json:"wait_ms"`
}

// leaseAcquire is POST /v1/leases/acquire: try once (wait_ms 0), or wait up to wait_ms for
// the key to come free.
func (s *Server) leaseAcquire(w http.ResponseWriter, r *http.Request) {
	var req acquireRequest
	if !decodeBody(w, r, &req) {
		return
	}
	key, ok := scopeKey(w, orgOf(r), req.Key)
	if !ok {
		return
	}
	ttl, wait := millis(req.TTLMS), millis(req.WaitMS)
	if !checkLeaseInput(w, lease.CheckHolder(req.Holder)) || !checkTTL(w, ttl) {
		return
	}
	if wait < 0 || wait > s.cfg.MaxWait {
		badRequest(w, "wait_ms must be from 0 to %d", s.cfg.MaxWait.Milliseconds())
		return
	}
	var l lease.Lease
	var err error
	if wait == 0 {
		l, err = s.cfg.Leases.TryAcquire(r.Context(), key.stored, req.Holder, ttl)
	} else {
		service.LongAnswer(w) // the wait may outlast the server's read timeout
		wctx, cancel := context.WithTimeout(r.Context(), wait)
		l, err = s.cfg.Leases.Acquire(wctx, key.stored, req.Holder, ttl)
		waitOver := wctx.Err() != nil && r.Context().Err() == nil
		cancel()
		if err != nil && waitOver {
			// One last try, which also says who holds the key if it is still held.
			l, err = s.cfg.Leases.TryAcquire(r.Context(), key.stored, req.Holder, ttl)
		}
	}
	var held *lease.HeldError
	switch {
	case errors.As(err, &held):
		msg := fmt.Sprintf("lease %s is held by %s (epoch %d)", key.client, held.Holder, held.Epoch)
		if !held.ExpiresAt.IsZero() {
			msg += " until " + held.ExpiresAt.UTC().Format(time.RFC3339Nano)
		}
		writeJSON(w, http.StatusConflict, errorBody{Code: CodeHeld, Message: msg, Holder: held.Holder, Epoch: held.Epoch, ExpiresAt: held.ExpiresAt})
	case err != nil:
		s.internal(w, r, err)
	default:
		held := wireLease(key, l)
		held.Secret = l.Secret // the holder's alone: refresh and release need it
		writeJSON(w, http.StatusOK, held)
	}
}

type refreshRequest struct {
	Key    string `json:"key"`
	Holder string `json:"holder"`
	Epoch  int64  `json:"epoch"`
	Secret string `json:"secret"`
	TTLMS  int64  `json:"ttl_ms"`
}

// leaseRefresh is POST /v1/leases/refresh: extend a holding that is still this holder's.
func (s *Server) leaseRefresh(w http.ResponseWriter, r *http.Request) {
	var req refreshRequest
	if !decodeBody(w, r, &req) {
		return
	}
	key, ok := scopeKey(w, orgOf(r), req.Key)
	if !ok {
		return
	}
	ttl := millis(req.TTLMS)
	if !checkLeaseInput(w, lease.CheckHolder(req.Holder)) || !checkTTL(w, ttl) || !checkEpoch(w, req.Epoch) {
		return
	}
	l, err := s.cfg.Leases.Refresh(r.Context(), lease.Lease{Key: key.stored, Holder: req.Holder, Epoch: req.Epoch, Secret: req.Secret}, ttl)
	switch {
	case errors.Is(err, lease.ErrLost):
		writeLost(w, key, req.Holder, req.Epoch)
	case err != nil:
		s.internal(w, r, err)
	default:
		writeJSON(w, http.StatusOK, wireLease(key, l))
	}
}

func writeLost(w http.ResponseWriter, key leaseKey, holder string, epoch int64) {
	service.WriteError(w, http.StatusConflict, CodeLost,
		fmt.Sprintf("lease %s is no longer %s's at epoch %d: it expired, was taken or was released by force", key.client, holder, epoch))
}

type releaseRequest struct {
	Key    string `json:"key"`
	Holder string `json:"holder"`
	Epoch  int64  `json:"epoch"`
	Secret string `json:"secret"`
}

// leaseRelease is POST /v1/leases/release: free a holding of this holder's.
func (s *Server) leaseRelease(w http.ResponseWriter, r *http.Request) {
	var req releaseRequest
	if !decodeBody(w, r, &req) {
		return
	}
	key, ok := scopeKey(w, orgOf(r), req.Key)
	if !ok {
		return
	}
	if !checkLeaseInput(w, lease.CheckHolder(req.Holder)) || !checkEpoch(w, req.Epoch) {
		return
	}
	err := s.cfg.Leases.Release(r.Context(), lease.Lease{Key: key.stored, Holder: req.Holder, Epoch: req.Epoch, Secret: req.Secret})
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, lease.ErrLost):
		writeLost(w, key, req.Holder, req.Epoch)
	case errors.Is(err, lease.ErrNotHolder):
		service.WriteError(w, http.StatusConflict, CodeNotHolder,
			fmt.Sprintf("%s does not hold lease %s at epoch %d", req.Holder, key.client, req.Epoch))
	case errors.Is(err, lease.ErrUnknownKey):
		writeNotFound(w, "no lease "+key.client+" was ever taken")
	default:
		s.internal(w, r, err)
	}
}

// leaseShow is GET /v1/leases/{key}: who holds the key, since when and until when.
func (s *Server) leaseShow(w http.ResponseWriter, r *http.Request) {
	raw, err := url.PathUnescape(chi.URLParam(r, "key"))
	if err != nil {
		badRequest(w, "the lease key in the path is not validly escaped")
		return
	}
	key, ok := scopeKey(w, orgOf(r), raw)
	if !ok {
		return
	}
	info, err := s.cfg.Leases.Holder(r.Context(), key.stored)
	switch {
	case errors.Is(err, lease.ErrUnknownKey):
		writeNotFound(w, "no lease "+key.client+" was ever taken")
	case err != nil:
		s.internal(w, r, err)
	default:
		writeJSON(w, http.StatusOK, LeaseInfo{
			Lease: Lease{Key: key.client, Holder: info.Holder, Epoch: info.Epoch, AcquiredAt: info.AcquiredAt, ExpiresAt: info.ExpiresAt},
			Held:  info.Held(time.Now()),
		})
	}
}

// Bounds of GET /v1/leases?limit=.
const (
	DefaultLeasesLimit = 100
	MaxLeasesLimit     = 500
)

// LeaseList is GET /v1/leases: the caller's own home: lease and session: leases, keys in
// the caller's form; held ones first, then the most recently changed. Truncated says more
// were left out.
type LeaseList struct {
	Leases    []LeaseInfo `json:"leases"`
	Truncated bool        `json:"truncated"`
}

// leaseList is GET /v1/leases?held=true&limit=N: the leases a key of this org reaches, and
// no other: home:<org> (looked up by its exact key, so home:<org>-2 is not listed) and the
// session:<org>.<id> rows (the dot ends the org id, which has none). org: leases and every
// other org's stay out of it.
func (s *Server) leaseList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := DefaultLeasesLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxLeasesLimit {
			badRequest(w, "limit must be an integer from 1 to %d", MaxLeasesLimit)
			return
		}
		limit = n
	}
	heldOnly := false
	switch v := q.Get("held"); v {
	case "", "false":
	case "true":
		heldOnly = true
	default:
		badRequest(w, "held must be true or false")
		return
	}
	org := orgOf(r)
	var infos []lease.Info
	home, err := s.cfg.Leases.Holder(r.Context(), "home:"+org)
	switch {
	case err == nil:
		infos = append(infos, home)
	case !errors.Is(err, lease.ErrUnknownKey):
		s.internal(w, r, err)
		return
	}
	sessionPrefix := "session:" + org + "."
	sessions, err := s.cfg.Leases.List(r.Context(), sessionPrefix)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	infos = append(infos, sessions...)
	now := time.Now()
	out := LeaseList{Leases: []LeaseInfo{}}
	changed := make(map[string]time.Time, len(infos))
	for _, i := range infos {
		held := i.Held(now)
		if heldOnly && !held {
			continue
		}
		key := i.Key
		if id, ok := strings.CutPrefix(key, sessionPrefix); ok {
			key = "session:" + id
		}
		out.Leases = append(out.Leases, LeaseInfo{
			Lease: Lease{Key: key, Holder: i.Holder, Epoch: i.Epoch, AcquiredAt: i.AcquiredAt, ExpiresAt: i.ExpiresAt},
			Held:  held,
		})
		changed[key] = i.UpdatedAt
	}
	sort.SliceStable(out.Leases, func(a, b int) bool {
		la, lb := out.Leases[a], out.Leases[b]
		if la.Held != lb.Held {
			return la.Held
		}
		if ca, cb := changed[la.Key], changed[lb.Key]; !ca.Equal(cb) {
			return ca.After(cb)
		}
		return la.Key < lb.Key
	})
	if len(out.Leases) > limit {
		out.Leases, out.Truncated = out.Leases[:limit], true
	}
	writeJSON(w, http.StatusOK, out)
}

// CodeNotHeld is a force release of a key nobody holds.
const CodeNotHeld = "not_held"

// Bounds of GET /v1/leases/{key}/events?limit=.
const (
	DefaultLeaseEventsLimit = 20
	MaxLeaseEventsLimit     = 200
)

// LeaseEvent is one row of a lease's history, its key in the caller's form.
type LeaseEvent struct {
	ID             int64     `json:"id"`
	Key            string    `json:"key"`
	Kind           string    `json:"kind"` // acquire, takeover, refresh, release, expire, force_release
	Holder         string    `json:"holder"`
	Epoch          int64     `json:"epoch"`
	PreviousHolder string    `json:"previous_holder,omitempty"`
	Actor          string    `json:"actor,omitempty"`
	Reason         string    `json:"reason,omitempty"`
	At             time.Time `json:"at"`
}

// LeaseEvents is GET /v1/leases/{key}/events: the key's newest events, newest first.
type LeaseEvents struct {
	Events []LeaseEvent `json:"events"`
}

// leaseEvents is GET /v1/leases/{key}/events?limit=N: the history of a key of the caller's
// own (home:<org>, session:<id>); another org's key or an org: key is 403, as everywhere.
func (s *Server) leaseEvents(w http.ResponseWriter, r *http.Request) {
	raw, err := url.PathUnescape(chi.URLParam(r, "key"))
	if err != nil {
		badRequest(w, "the lease key in the path is not validly escaped")
		return
	}
	key, ok := scopeKey(w, orgOf(r), raw)
	if !ok {
		return
	}
	limit := DefaultLeaseEventsLimit
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxLeaseEventsLimit {
			badRequest(w, "limit must be an integer from 1 to %d", MaxLeaseEventsLimit)
			return
		}
		limit = n
	}
	evs, err := s.cfg.Leases.Events(r.Context(), key.stored, limit)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	out := LeaseEvents{Events: make([]LeaseEvent, 0, len(evs))}
	for _, e := range evs {
		out.Events = append(out.Events, LeaseEvent{
			ID: e.ID, Key: key.client, Kind: e.Kind, Holder: e.Holder, Epoch: e.Epoch,
			PreviousHolder: e.PreviousHolder, Actor: e.Actor, Reason: e.Reason, At: e.At,
		})
	}
	writeJSON(w, http.StatusOK, out)
}

type forceReleaseRequest struct {
	Key    string `json:"key"`
	Actor  string `json:"actor"`
	Reason string `json:"reason"`
}

// leaseForceRelease is POST /v1/leases/force-release {key, actor, reason}: frees a key of
// the caller's own (home:<org>, session:<id>) whoever holds it, moving the epoch on so the
// old holder's refreshes and fenced writes are refused; the event records actor and
// reason. The answer is the holding that was released. org: keys and other orgs' are 403,
// nothing changed; a key nobody holds is 409 not_held.
func (s *Server) leaseForceRelease(w http.ResponseWriter, r *http.Request) {
	var req forceReleaseRequest
	if !decodeBody(w, r, &req) {
		return
	}
	key, ok := scopeKey(w, orgOf(r), req.Key)
	if !ok {
		return
	}
	if strings.TrimSpace(req.Reason) == "" {
		badRequest(w, "a force release needs a reason, recorded with it")
		return
	}
	if !checkLeaseInput(w, lease.CheckHolder(req.Actor)) {
		return
	}
	old, err := s.cfg.Leases.ForceRelease(r.Context(), key.stored, req.Actor, req.Reason)
	switch {
	case errors.Is(err, lease.ErrNotHeld):
		service.WriteError(w, http.StatusConflict, CodeNotHeld, "lease "+key.client+" is not held; there is nothing to release")
	case errors.Is(err, lease.ErrUnknownKey):
		writeNotFound(w, "no lease "+key.client+" was ever taken")
	case errors.Is(err, lease.ErrInvalid):
		badRequest(w, "%v", err)
	case err != nil:
		s.internal(w, r, err)
	default:
		writeJSON(w, http.StatusOK, wireLease(key, old))
	}
}

// IsNotHeld reports whether err is a force release of a key nobody holds.
func IsNotHeld(err error) bool { e := apiError(err); return e != nil && e.Code == CodeNotHeld }

// LeaseEvents is the newest limit events of key (one of the org's own), newest first;
// limit 0 is the server's default.
func (c *Client) LeaseEvents(ctx context.Context, key string, limit int) ([]LeaseEvent, error) {
	q := url.Values{}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out LeaseEvents
	err := c.do(ctx, "lease events", http.MethodGet, "/v1/leases/"+url.PathEscape(key)+"/events", q, nil, &out)
	return out.Events, err
}

// ForceRelease frees key (one of the org's own) whoever holds it, recording actor and
// reason, and returns the holding it ended; IsNotHeld when nobody holds it.
func (c *Client) ForceRelease(ctx context.Context, key, actor, reason string) (Lease, error) {
	var l Lease
	err := c.do(ctx, "force release", http.MethodPost, "/v1/leases/force-release", nil,
		forceReleaseRequest{Key: key, Actor: actor, Reason: reason}, &l)
	return l, err
}

// MaxLeaseChanges is how many events one GET /v1/leases/changes answers at most.
const MaxLeaseChanges = 200

// LeaseChanges is GET /v1/leases/changes: the org's home: and session: lease events after
// an id, oldest first, and the id to ask after next (Last). Asked without after, it holds
// no events and Last is the newest event id there is: a watcher starts from now.
type LeaseChanges struct {
	Events []LeaseEvent `json:"events"`
	Last   int64        `json:"last"`
}

// leaseChanges is GET /v1/leases/changes?after=&wait_ms=: what changed in the caller's
// leases (never org: keys, never another org's) after event id after, waiting up to wait_ms
// for a change, woken by its notification; without after, the head.
func (s *Server) leaseChanges(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var wait time.Duration
	if v := q.Get("wait_ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		most := min(s.cfg.MaxWait, lease.MaxChangesWait)
		if err != nil || ms < 0 || millis(ms) > most {
			badRequest(w, "wait_ms must be an integer from 0 to %d", most.Milliseconds())
			return
		}
		wait = millis(ms)
	}
	v := q.Get("after")
	if v == "" {
		head, err := s.cfg.Leases.Head(r.Context())
		if err != nil {
			s.internal(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, LeaseChanges{Events: []LeaseEvent{}, Last: head})
		return
	}
	after, err := strconv.ParseInt(v, 10, 64)
	if err != nil || after < 0 {
		badRequest(w, "after must be an event id (an integer from 0)")
		return
	}
	org := orgOf(r)
	if wait > 0 {
		service.LongAnswer(w) // the wait may outlast the server's read timeout
	}
	evs, err := s.cfg.Leases.Changes(r.Context(), org, after, MaxLeaseChanges, wait)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	out := LeaseChanges{Events: make([]LeaseEvent, 0, len(evs)), Last: after}
	for _, e := range evs {
		out.Events = append(out.Events, LeaseEvent{
			ID: e.ID, Key: clientKey(org, e.Key), Kind: e.Kind, Holder: e.Holder, Epoch: e.Epoch,
			PreviousHolder: e.PreviousHolder, Actor: e.Actor, Reason: e.Reason, At: e.At,
		})
		out.Last = e.ID
	}
	writeJSON(w, http.StatusOK, out)
}

// clientKey is a stored key of org as its control key names it (scopeKey's inverse).
func clientKey(org, stored string) string {
	if id, ok := strings.CutPrefix(stored, "session:"+org+"."); ok {
		return "session:" + id
	}
	return stored
}
