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
		writeJSON(w, http.StatusOK, wireLease(key, l))
	}
}

type refreshRequest struct {
	Key    string `json:"key"`
	Holder string `json:"holder"`
	Epoch  int64  `json:"epoch"`
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
	l, err := s.cfg.Leases.Refresh(r.Context(), lease.Lease{Key: key.stored, Holder: req.Holder, Epoch: req.Epoch}, ttl)
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
	err := s.cfg.Leases.Release(r.Context(), lease.Lease{Key: key.stored, Holder: req.Holder, Epoch: req.Epoch})
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
