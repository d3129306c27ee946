package control

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gavv/httpexpect/v2"
	"github.com/jackc/pgx/v5"

	"hermeshost/lease"
)

type acquireBody = map[string]any

func TestHomeLeaseAcquireRefreshRelease(t *testing.T) {
	f := newFixture(t)
	a := f.as(orgA)
	got := a.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "home:acme", "holder": "worker-1", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK).JSON().Object()
	got.HasValue("key", "home:acme").HasValue("holder", "worker-1").HasValue("epoch", 1).ContainsKey("acquired_at").ContainsKey("expires_at")
	var l Lease
	got.Decode(&l)

	// Someone else of the same org is told who holds it.
	held := a.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "home:acme", "holder": "worker-2", "ttl_ms": 60000}).
		Expect().Status(http.StatusConflict).JSON().Object()
	held.HasValue("error", "held").HasValue("holder", "worker-1").HasValue("epoch", 1).ContainsKey("expires_at")
	held.Value("message").String().Contains("home:acme").NotContains("session:")

	if len(l.Secret) < 20 {
		t.Fatalf("the acquire answered secret %q", l.Secret)
	}
	// Knowing the key, the holder and the epoch (any key of the org's reads them) is not
	// enough: without the holding's secret a release and a refresh are refused and the
	// holding is left as it was.
	before := f.snapshot()
	for _, secret := range []any{nil, "", "guessed"} {
		body := acquireBody{"key": "home:acme", "holder": "worker-1", "epoch": 1}
		if secret != nil {
			body["secret"] = secret
		}
		a.POST("/v1/leases/release").WithJSON(body).Expect().Status(http.StatusConflict).JSON().Object().HasValue("error", "not_holder")
		body["ttl_ms"] = 3600000
		a.POST("/v1/leases/refresh").WithJSON(body).Expect().Status(http.StatusConflict).JSON().Object().HasValue("error", "lost")
	}
	if after := f.snapshot(); after != before {
		t.Fatalf("refused calls changed the lease:\n%s\nthen\n%s", before, after)
	}

	var r Lease
	a.POST("/v1/leases/refresh").WithJSON(acquireBody{"key": "home:acme", "holder": "worker-1", "epoch": 1, "secret": l.Secret, "ttl_ms": 3600000}).
		Expect().Status(http.StatusOK).JSON().Decode(&r)
	if r.Key != "home:acme" || r.Epoch != 1 || !r.AcquiredAt.Equal(l.AcquiredAt) || !r.ExpiresAt.After(l.ExpiresAt) {
		t.Fatalf("refreshed %+v from %+v", r, l)
	}
	a.GET("/v1/leases/home:acme").Expect().Status(http.StatusOK).JSON().Object().
		HasValue("held", true).HasValue("holder", "worker-1").HasValue("epoch", 1)

	if r.Secret != "" {
		t.Fatal("a refresh's answer carries the secret")
	}
	a.GET("/v1/leases/home:acme").Expect().Status(http.StatusOK).JSON().Object().NotContainsKey("secret")
	a.POST("/v1/leases/release").WithJSON(acquireBody{"key": "home:acme", "holder": "worker-1", "epoch": 1, "secret": l.Secret}).
		Expect().Status(http.StatusNoContent).NoContent()
	a.POST("/v1/leases/release").WithJSON(acquireBody{"key": "home:acme", "holder": "worker-1", "epoch": 1, "secret": l.Secret}).
		Expect().Status(http.StatusNoContent)
	a.GET("/v1/leases/home:acme").Expect().Status(http.StatusOK).JSON().Object().
		IsEqual(map[string]any{"key": "home:acme", "holder": "", "epoch": 1, "held": false})
	a.POST("/v1/leases/refresh").WithJSON(acquireBody{"key": "home:acme", "holder": "worker-1", "epoch": 1, "ttl_ms": 60000}).
		Expect().Status(http.StatusConflict).JSON().Object().HasValue("error", "lost")
	a.POST("/v1/leases/release").WithJSON(acquireBody{"key": "home:acme", "holder": "worker-2", "epoch": 1}).
		Expect().Status(http.StatusNoContent) // the key is free of that epoch's holding either way

	a.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "home:acme", "holder": "worker-2", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK).JSON().Object().HasValue("epoch", 2)
	a.POST("/v1/leases/release").WithJSON(acquireBody{"key": "home:acme", "holder": "worker-1", "epoch": 1}).
		Expect().Status(http.StatusConflict).JSON().Object().HasValue("error", "lost")
	a.POST("/v1/leases/release").WithJSON(acquireBody{"key": "home:acme", "holder": "worker-1", "epoch": 2}).
		Expect().Status(http.StatusConflict).JSON().Object().HasValue("error", "not_holder")
	a.GET("/v1/leases/session:never").Expect().Status(http.StatusNotFound).JSON().Object().HasValue("error", "not_found")
}

func TestOtherOrgsAndOrgLeasesAreForbiddenAndUntouched(t *testing.T) {
	f := newFixture(t)
	// B holds its home, and the dispatcher holds both orgs.
	f.as(orgB).POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "home:globex", "holder": "worker-b", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK)
	for _, org := range []string{orgA, orgB} {
		if _, err := f.leases.TryAcquire(context.Background(), "org:"+org, "dispatcher-1", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	before := f.snapshot()
	a := f.as(orgA)
	for _, key := range []string{"home:globex", "home:acme-2", "home:ACME", "org:acme", "org:globex"} {
		t.Run(key, func(t *testing.T) {
			for _, r := range []*httpexpect.Response{
				a.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": key, "holder": "worker-a", "ttl_ms": 60000}).Expect(),
				a.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": key, "holder": "worker-a", "ttl_ms": 60000, "wait_ms": 1000}).Expect(),
				a.POST("/v1/leases/refresh").WithJSON(acquireBody{"key": key, "holder": "worker-b", "epoch": 1, "ttl_ms": 60000}).Expect(),
				a.POST("/v1/leases/release").WithJSON(acquireBody{"key": key, "holder": "worker-b", "epoch": 1}).Expect(),
				a.POST("/v1/leases/release").WithJSON(acquireBody{"key": key, "holder": "dispatcher-1", "epoch": 1}).Expect(),
				a.GET("/v1/leases/{key}", key).Expect(),
			} {
				r.Status(http.StatusForbidden).JSON().Object().HasValue("error", "forbidden")
			}
		})
	}
	if after := f.snapshot(); after != before {
		t.Fatalf("a forbidden request wrote:\n%s\nthen\n%s", before, after)
	}
}

func TestSessionLeasesAreSeparatePerOrg(t *testing.T) {
	f := newFixture(t)
	a, b := f.as(orgA), f.as(orgB)
	var la, lb Lease
	a.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "session:x", "holder": "worker-a", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK).JSON().Decode(&la)
	b.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "session:x", "holder": "worker-b", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK).JSON().Decode(&lb)
	if la.Key != "session:x" || lb.Key != "session:x" || la.Epoch != 1 || lb.Epoch != 1 {
		t.Fatalf("both hold session:x: %+v %+v", la, lb)
	}
	// Stored apart, under each org's name.
	for key, holder := range map[string]string{"session:acme.x": "worker-a", "session:globex.x": "worker-b"} {
		info, err := f.leases.Holder(context.Background(), key)
		if err != nil || info.Holder != holder {
			t.Fatalf("%s: %+v %v", key, info, err)
		}
	}
	b.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "session:only-b", "holder": "worker-b", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK)
	before := f.snapshot()

	// A knows B's holder and epoch, and still reaches only its own keys.
	a.POST("/v1/leases/release").WithJSON(acquireBody{"key": "session:x", "holder": "worker-b", "epoch": lb.Epoch}).
		Expect().Status(http.StatusConflict).JSON().Object().HasValue("error", "not_holder")
	a.POST("/v1/leases/refresh").WithJSON(acquireBody{"key": "session:x", "holder": "worker-b", "epoch": lb.Epoch, "ttl_ms": 60000}).
		Expect().Status(http.StatusConflict).JSON().Object().HasValue("error", "lost")
	a.POST("/v1/leases/release").WithJSON(acquireBody{"key": "session:only-b", "holder": "worker-b", "epoch": 1}).
		Expect().Status(http.StatusNotFound)
	a.GET("/v1/leases/session:only-b").Expect().Status(http.StatusNotFound)
	// The stored form is just another session id to A: it maps into A's own keys.
	a.GET("/v1/leases/session:globex.x").Expect().Status(http.StatusNotFound)
	a.POST("/v1/leases/release").WithJSON(acquireBody{"key": "session:globex.x", "holder": "worker-b", "epoch": 1}).
		Expect().Status(http.StatusNotFound)
	if after := f.snapshot(); after != before {
		t.Fatalf("A changed B's leases:\n%s\nthen\n%s", before, after)
	}
	b.GET("/v1/leases/session:x").Expect().Status(http.StatusOK).JSON().Object().
		HasValue("key", "session:x").HasValue("holder", "worker-b").HasValue("held", true)
}

func TestWaitingAcquireGetsTheLeaseWhenReleased(t *testing.T) {
	f := newFixture(t)
	a := f.as(orgA)
	var first Lease
	a.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "session:turn", "holder": "first", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK).JSON().Decode(&first)

	done := make(chan *httpexpect.Response, 1)
	start := time.Now()
	go func() {
		done <- a.POST("/v1/leases/acquire").
			WithJSON(acquireBody{"key": "session:turn", "holder": "second", "ttl_ms": 60000, "wait_ms": testMaxWait.Milliseconds()}).
			Expect()
	}()
	// The waiter marks the row as waited for; release once it has.
	for {
		var waited bool
		if err := f.pool.QueryRow(context.Background(),
			`SELECT coalesce(waiting_until > now(), false) FROM leases WHERE key = 'session:acme.turn'`).Scan(&waited); err != nil {
			t.Fatal(err)
		}
		if waited {
			break
		}
		if time.Since(start) > testMaxWait {
			t.Fatal("the second acquirer never waited")
		}
		time.Sleep(5 * time.Millisecond)
	}
	a.POST("/v1/leases/release").WithJSON(acquireBody{"key": "session:turn", "holder": "first", "epoch": first.Epoch, "secret": first.Secret}).
		Expect().Status(http.StatusNoContent)
	released := time.Now()
	r := <-done
	r.Status(http.StatusOK).JSON().Object().HasValue("key", "session:turn").HasValue("holder", "second").HasValue("epoch", 2)
	// Woken by the release's notification, not by the 1s poll or the wait's end.
	if d := time.Since(released); d > 900*time.Millisecond {
		t.Fatalf("the waiter got the lease %s after the release", d)
	}
}

func TestWaitingAcquireThatTimesOutSaysWhoHolds(t *testing.T) {
	f := newFixture(t)
	a := f.as(orgA)
	a.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "home:acme", "holder": "first", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK)
	start := time.Now()
	a.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "home:acme", "holder": "second", "ttl_ms": 60000, "wait_ms": 200}).
		Expect().Status(http.StatusConflict).JSON().Object().HasValue("error", "held").HasValue("holder", "first").HasValue("epoch", 1)
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("answered after %s, before the wait was over", d)
	}
}

// The lease list is the caller's own home: and session: leases and nothing else: not another
// org's (whose home key shares a prefix with this one's, and whose sessions have the same
// ids), nor any org: lease.
func TestLeaseListShowsOnlyTheCallersOwnHomeAndSessionLeases(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a, b := f.as(orgA), f.as(orgB)
	a.GET("/v1/leases").Expect().Status(http.StatusOK).JSON().Object().
		IsEqual(map[string]any{"leases": []any{}, "truncated": false})

	secrets := map[string]string{}
	for _, take := range []struct {
		e      *httpexpect.Expect
		key    string
		holder string
	}{
		{a, "home:acme", "worker-a"},
		{a, "session:chat-1", "turn-a1"},
		{a, "session:chat-2", "turn-a2"},
		{b, "home:globex", "worker-b"},
		{b, "session:chat-1", "turn-b1"},
	} {
		var l Lease
		take.e.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": take.key, "holder": take.holder, "ttl_ms": 60000}).
			Expect().Status(http.StatusOK).JSON().Decode(&l)
		secrets[take.key+"/"+take.holder] = l.Secret
	}
	// Stored keys another org's listing must not pick up: a home whose id starts with
	// acme's, a session of that org, and the dispatcher's ownership leases.
	for _, key := range []string{"home:acme-2", "session:acme-2.chat-9", "org:acme", "org:globex"} {
		if _, err := f.leases.TryAcquire(ctx, key, "someone-else", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	// chat-2 is released: still listed (its epoch stays), not held.
	a.POST("/v1/leases/release").WithJSON(acquireBody{"key": "session:chat-2", "holder": "turn-a2", "epoch": 1, "secret": secrets["session:chat-2/turn-a2"]}).
		Expect().Status(http.StatusNoContent)
	before := f.snapshot()

	var all LeaseList
	a.GET("/v1/leases").Expect().Status(http.StatusOK).JSON().Decode(&all)
	got := map[string]LeaseInfo{}
	for _, l := range all.Leases {
		got[l.Key] = l
	}
	if len(all.Leases) != 3 || all.Truncated {
		t.Fatalf("acme's leases: %+v", all)
	}
	if h := got["home:acme"]; !h.Held || h.Holder != "worker-a" || h.Epoch != 1 || h.ExpiresAt.IsZero() {
		t.Fatalf("home:acme: %+v", h)
	}
	if s := got["session:chat-1"]; !s.Held || s.Holder != "turn-a1" {
		t.Fatalf("session:chat-1 of acme: %+v", s)
	}
	if s := got["session:chat-2"]; s.Held || s.Holder != "" || s.Epoch != 1 {
		t.Fatalf("released session:chat-2: %+v", s)
	}
	// Held ones come first.
	if all.Leases[2].Key != "session:chat-2" {
		t.Fatalf("order: %+v", all.Leases)
	}
	body := a.GET("/v1/leases").Expect().Body().Raw()
	for _, leak := range []string{"globex", "acme-2", "org:", "someone-else", "turn-b1", "session:acme."} {
		if strings.Contains(body, leak) {
			t.Errorf("acme's lease list holds %q: %s", leak, body)
		}
	}

	var held LeaseList
	a.GET("/v1/leases").WithQuery("held", "true").Expect().Status(http.StatusOK).JSON().Decode(&held)
	if len(held.Leases) != 2 || !held.Leases[0].Held || !held.Leases[1].Held {
		t.Fatalf("held leases: %+v", held)
	}
	a.GET("/v1/leases").WithQuery("limit", 1).Expect().Status(http.StatusOK).JSON().Object().
		HasValue("truncated", true).Value("leases").Array().Length().IsEqual(1)
	b.GET("/v1/leases").Expect().Status(http.StatusOK).JSON().Object().Value("leases").Array().Length().IsEqual(2)
	for _, bad := range []map[string]any{{"limit": 0}, {"limit": MaxLeasesLimit + 1}, {"limit": "x"}, {"held": "yes"}} {
		req := a.GET("/v1/leases")
		for k, v := range bad {
			req = req.WithQuery(k, v)
		}
		req.Expect().Status(http.StatusBadRequest).JSON().Object().HasValue("error", "invalid")
	}
	if after := f.snapshot(); after != before {
		t.Fatalf("listing wrote:\n%s\nthen\n%s", before, after)
	}

	// The client reads the same.
	list, err := f.client(f.key(orgA)).Leases(ctx, LeaseQuery{Held: true, Limit: 5})
	if err != nil || len(list.Leases) != 2 || list.Truncated {
		t.Fatalf("client: %+v %v", list, err)
	}
}

func TestForceReleaseMovesTheEpochOnAndRefusesTheOldHoldersFencedWrite(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := f.as(orgA)
	var held Lease
	a.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "home:acme", "holder": "worker-1", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK).JSON().Decode(&held)
	f.as(orgB).POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "session:chat-1", "holder": "globex-turn", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK)
	a.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "session:chat-1", "holder": "acme-turn", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK)

	c := f.client(f.key(orgA))
	old, err := c.ForceRelease(ctx, "home:acme", "operator:ada", "worker wedged")
	if err != nil {
		t.Fatal(err)
	}
	if old.Key != "home:acme" || old.Holder != "worker-1" || old.Epoch != held.Epoch {
		t.Fatalf("released %+v", old)
	}
	a.GET("/v1/leases/home:acme").Expect().Status(http.StatusOK).JSON().Object().
		HasValue("held", false).HasValue("holder", "").HasValue("epoch", held.Epoch+1)
	// The old holder can neither refresh nor write under its holding.
	a.POST("/v1/leases/refresh").WithJSON(acquireBody{"key": "home:acme", "holder": "worker-1", "epoch": held.Epoch, "ttl_ms": 60000}).
		Expect().Status(http.StatusConflict).JSON().Object().HasValue("error", "lost")
	wrote := false
	err = f.leases.WithFence(ctx, lease.Lease{Key: "home:acme", Holder: "worker-1", Epoch: held.Epoch}, func(pgx.Tx) error {
		wrote = true
		return nil
	})
	if !errors.Is(err, lease.ErrLost) || wrote {
		t.Fatalf("the old holder's fenced write: %v (ran: %v)", err, wrote)
	}

	evs, err := c.LeaseEvents(ctx, "home:acme", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Kind != "force_release" || evs[0].Actor != "operator:ada" || evs[0].Reason != "worker wedged" ||
		evs[0].Holder != "worker-1" || evs[0].Key != "home:acme" || evs[1].Kind != "acquire" {
		t.Fatalf("events %+v", evs)
	}

	// A session lease is the caller's own: globex's of the same id is left held.
	if _, err := c.ForceRelease(ctx, "session:chat-1", "operator:ada", "stuck turn"); err != nil {
		t.Fatal(err)
	}
	f.as(orgB).GET("/v1/leases/session:chat-1").Expect().Status(http.StatusOK).JSON().Object().
		HasValue("held", true).HasValue("holder", "globex-turn")
	sevs, err := c.LeaseEvents(ctx, "session:chat-1", 1)
	if err != nil || len(sevs) != 1 || sevs[0].Key != "session:chat-1" || sevs[0].Kind != "force_release" {
		t.Fatalf("session events %+v %v", sevs, err)
	}

	// Nothing held, never taken, no reason: refused, each for its reason.
	if _, err := c.ForceRelease(ctx, "home:acme", "operator:ada", "again"); !IsNotHeld(err) {
		t.Errorf("a second force release: %v", err)
	}
	if _, err := c.ForceRelease(ctx, "session:never", "operator:ada", "why"); !IsNotFound(err) {
		t.Errorf("a key never taken: %v", err)
	}
	a.POST("/v1/leases/force-release").WithJSON(map[string]any{"key": "session:chat-1", "actor": "operator:ada", "reason": " "}).
		Expect().Status(http.StatusBadRequest).JSON().Object().HasValue("error", "invalid")
	a.GET("/v1/leases/home:acme/events").WithQuery("limit", 0).Expect().Status(http.StatusBadRequest)
}

func TestForceReleaseAndEventsOfOtherOrgsAndOrgLeasesAreForbiddenAndUntouched(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.as(orgB).POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "home:globex", "holder": "worker-b", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK)
	for _, org := range []string{orgA, orgB} {
		if _, err := f.leases.TryAcquire(ctx, "org:"+org, "dispatcher-1", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	before := f.snapshot()
	a := f.as(orgA)
	for _, key := range []string{"home:globex", "home:acme-2", "org:acme", "org:globex"} {
		a.POST("/v1/leases/force-release").WithJSON(map[string]any{"key": key, "actor": "operator:ada", "reason": "mine now"}).
			Expect().Status(http.StatusForbidden).JSON().Object().HasValue("error", "forbidden")
		a.GET("/v1/leases/{key}/events", key).Expect().Status(http.StatusForbidden)
	}
	if _, err := f.client(f.key(orgA)).LeaseEvents(ctx, "home:globex", 0); !IsForbidden(err) {
		t.Errorf("the client reading another org's events: %v", err)
	}
	if after := f.snapshot(); after != before {
		t.Fatalf("a forbidden request wrote:\n%s\nthen\n%s", before, after)
	}
}

// GET /v1/leases/changes: without after, the head; after it, the caller's own lease events
// under the names its key uses (never the stored session:<org>. form, never another org's
// or an org: lease), waiting for one when asked to; a bad after or wait_ms is 400.
func TestLeaseChangesAreTheCallersOwnFromTheHead(t *testing.T) {
	f := newFixture(t)
	a := f.as(orgA)
	var head LeaseChanges
	a.GET("/v1/leases/changes").Expect().Status(http.StatusOK).JSON().Decode(&head)
	if len(head.Events) != 0 {
		t.Fatalf("the head came with events: %+v", head)
	}
	f.as(orgB).POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "session:x", "holder": "worker-b", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK)
	if _, err := f.leases.TryAcquire(context.Background(), "org:acme", "dispatcher-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	got := make(chan LeaseChanges, 1)
	go func() {
		var ch LeaseChanges
		a.GET("/v1/leases/changes").WithQuery("after", head.Last).WithQuery("wait_ms", 4000).
			Expect().Status(http.StatusOK).JSON().Decode(&ch)
		got <- ch
	}()
	time.Sleep(100 * time.Millisecond) // let it wait; were it not waiting yet, it finds the event anyway
	a.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "session:x", "holder": "worker-a", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK)
	ch := <-got
	if len(ch.Events) != 1 || ch.Events[0].Key != "session:x" || ch.Events[0].Holder != "worker-a" || ch.Events[0].Kind != "acquire" || ch.Last != ch.Events[0].ID {
		t.Fatalf("acme's changes %+v", ch)
	}
	var none LeaseChanges
	a.GET("/v1/leases/changes").WithQuery("after", ch.Last).Expect().Status(http.StatusOK).JSON().Decode(&none)
	if len(none.Events) != 0 || none.Last != ch.Last {
		t.Fatalf("nothing new, and yet %+v", none)
	}
	for _, q := range []map[string]any{{"after": -1}, {"after": "x"}, {"after": 0, "wait_ms": -1}, {"after": 0, "wait_ms": 600000}} {
		r := a.GET("/v1/leases/changes")
		for k, v := range q {
			r = r.WithQuery(k, v)
		}
		r.Expect().Status(http.StatusBadRequest)
	}
}
