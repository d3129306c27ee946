package operator

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"hermeshost/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const good = "correct horse battery"

func newStore(t *testing.T) (*Store, *pgxpool.Pool) {
	t.Helper()
	_, pool := pgtest.Schema(t)
	s, err := New(pool, bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return s, pool
}

func count(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func kinds(t *testing.T, s *Store, name string) []string {
	t.Helper()
	evs, err := s.Events(context.Background(), name, 100)
	if err != nil {
		t.Fatal(err)
	}
	var k []string
	for i := len(evs) - 1; i >= 0; i-- {
		k = append(k, evs[i].Kind+prefixed(":", evs[i].Org))
	}
	return k
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

func TestAnOperatorLogsInOnlyWithTheRightPasswordWhileEnabled(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if err := s.Add(ctx, "ada", good, "root"); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(ctx, "ada", good+"!", "root"); !errors.Is(err, ErrExists) {
		t.Fatalf("second add: %v", err)
	}
	if err := s.Grant(ctx, "ada", "acme", "root"); err != nil {
		t.Fatal(err)
	}
	op, err := s.Authenticate(ctx, "ada", good, "127.0.0.1")
	if err != nil || op.Name != "ada" || !slices.Equal(op.Orgs, []string{"acme"}) || op.Disabled {
		t.Fatalf("login = %+v, %v", op, err)
	}
	for _, c := range []struct{ name, password string }{
		{"ada", good + "x"}, {"ada", "Correct horse battery"}, {"ada", ""}, {"bob", good}, {"ADA", good}, {"", ""},
		{"ada", strings.Repeat("x", 500)},
	} {
		if _, err := s.Authenticate(ctx, c.name, c.password, "127.0.0.1"); !errors.Is(err, ErrBadLogin) {
			t.Errorf("login %q/%q: %v, want ErrBadLogin", c.name, c.password, err)
		}
	}
	if err := s.SetDisabled(ctx, "ada", true, "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, "ada", good, "127.0.0.1"); !errors.Is(err, ErrBadLogin) {
		t.Fatalf("a disabled operator logged in: %v", err)
	}
	if ok, err := s.Allowed(ctx, "ada", "acme"); err != nil || ok {
		t.Fatalf("a disabled operator is still allowed into acme: %v %v", ok, err)
	}
	if err := s.SetDisabled(ctx, "ada", false, "root"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPassword(ctx, "ada", "a new long passphrase", "ada"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, "ada", good, "127.0.0.1"); !errors.Is(err, ErrBadLogin) {
		t.Fatalf("the old password still works: %v", err)
	}
	if _, err := s.Authenticate(ctx, "ada", "a new long passphrase", "127.0.0.1"); err != nil {
		t.Fatalf("the new password: %v", err)
	}
	want := []string{"add", "grant:acme", "login", "login_refused", "login_refused", "login_refused", "login_refused",
		"disable", "login_refused", "enable", "password", "login_refused", "login"}
	if got := kinds(t, s, "ada"); !slices.Equal(got, want) {
		t.Fatalf("ada's events:\n%v\nwant\n%v", got, want)
	}
}

// bcrypt reads 72 bytes: a password of exactly 72 must not also let in the same 72 with
// more after them.
func TestALongPasswordIsNotCutToItsFirst72Bytes(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	pw := strings.Repeat("p", MaxPasswordLen)
	if err := s.Add(ctx, "ada", pw, "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, "ada", pw, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, "ada", pw+"more", ""); !errors.Is(err, ErrBadLogin) {
		t.Fatalf("72 bytes and more let in: %v", err)
	}
	if err := s.Add(ctx, "bob", pw+"x", "root"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a 73-byte password was accepted: %v", err)
	}
}

func TestGrantsDecideWhichOrgsAnOperatorMayOpen(t *testing.T) {
	s, pool := newStore(t)
	ctx := context.Background()
	for _, n := range []string{"ada", "bob"} {
		if err := s.Add(ctx, n, good, "root"); err != nil {
			t.Fatal(err)
		}
	}
	for _, org := range []string{"acme", "globex", "acme"} {
		if err := s.Grant(ctx, "ada", org, "root"); err != nil {
			t.Fatal(err)
		}
	}
	allowed := func(name, org string) bool {
		t.Helper()
		ok, err := s.Allowed(ctx, name, org)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !allowed("ada", "acme") || !allowed("ada", "globex") || allowed("bob", "acme") || allowed("ada", "initech") {
		t.Fatal("grants do not decide")
	}
	// Names and orgs that are not ids are simply not allowed.
	if allowed("ada", "../acme") || allowed("ada' OR '1'='1", "acme") {
		t.Fatal("a malformed name or org was allowed")
	}
	if err := s.Revoke(ctx, "ada", "globex", "root"); err != nil {
		t.Fatal(err)
	}
	if err := s.Revoke(ctx, "ada", "globex", "root"); err != nil {
		t.Fatalf("a second revoke: %v", err)
	}
	if allowed("ada", "globex") {
		t.Fatal("a revoked grant still allows")
	}
	op, err := s.Get(ctx, "ada")
	if err != nil || !slices.Equal(op.Orgs, []string{"acme"}) {
		t.Fatalf("ada = %+v, %v", op, err)
	}
	if got := kinds(t, s, "ada"); !slices.Equal(got, []string{"add", "grant:acme", "grant:globex", "revoke:globex"}) {
		t.Fatalf("events: %v (a repeated grant or revoke is no event)", got)
	}
	if err := s.Grant(ctx, "carol", "acme", "root"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("grant to nobody: %v", err)
	}
	if err := s.Revoke(ctx, "carol", "acme", "root"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoke from nobody: %v", err)
	}
	if err := s.Remove(ctx, "ada", "root"); err != nil {
		t.Fatal(err)
	}
	if allowed("ada", "acme") || count(t, pool, "operator_grants") != 0 {
		t.Fatal("a removed operator's grants stayed")
	}
	if _, err := s.Authenticate(ctx, "ada", good, ""); !errors.Is(err, ErrBadLogin) {
		t.Fatalf("a removed operator logged in: %v", err)
	}
	if err := s.Remove(ctx, "ada", "root"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second remove: %v", err)
	}
	if got := kinds(t, s, "ada"); !slices.Equal(got[len(got)-2:], []string{"remove", "login_refused"}) {
		t.Fatalf("the history did not survive the removal: %v", got)
	}
	ops, err := s.List(ctx)
	if err != nil || len(ops) != 1 || ops[0].Name != "bob" {
		t.Fatalf("list = %+v, %v", ops, err)
	}
}

func TestBadOperatorInputIsRefusedAndWritesNothing(t *testing.T) {
	s, pool := newStore(t)
	ctx := context.Background()
	if err := s.Add(ctx, "ada", good, "root"); err != nil {
		t.Fatal(err)
	}
	before := count(t, pool, "operators") + count(t, pool, "operator_grants") + count(t, pool, "operator_events")
	for name, err := range map[string]error{
		"upper-case name":      s.Add(ctx, "Ada", good, "root"),
		"name with a space":    s.Add(ctx, "a b", good, "root"),
		"name too long":        s.Add(ctx, strings.Repeat("a", 65), good, "root"),
		"empty name":           s.Add(ctx, "", good, "root"),
		"short password":       s.Add(ctx, "bob", "short", "root"),
		"password with a NUL":  s.Add(ctx, "bob", good+"\x00", "root"),
		"password not UTF-8":   s.Add(ctx, "bob", good+"\xff", "root"),
		"no actor":             s.Add(ctx, "bob", good, ""),
		"short new password":   s.SetPassword(ctx, "ada", "short", "root"),
		"grant a bad org":      s.Grant(ctx, "ada", "Acme Corp", "root"),
		"grant a traversal":    s.Grant(ctx, "ada", "../globex", "root"),
		"revoke a bad org":     s.Revoke(ctx, "ada", "", "root"),
		"disable a bad name":   s.SetDisabled(ctx, "../ada", true, "root"),
		"remove without actor": s.Remove(ctx, "ada", ""),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if after := count(t, pool, "operators") + count(t, pool, "operator_grants") + count(t, pool, "operator_events"); after != before {
		t.Fatalf("refused calls wrote %d rows", after-before)
	}
	if _, err := New(pool, 3); err == nil {
		t.Fatal("a bcrypt cost below the minimum was accepted")
	}
}

func TestTooManyFailedLoginsThrottleTheNameFromThatAddressAlikeForUnknownNames(t *testing.T) {
	s, pool := newStore(t)
	ctx := context.Background()
	if err := s.Add(ctx, "ada", good, "root"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ada", "nobody"} {
		for i := range MaxLoginFailures {
			if _, err := s.Authenticate(ctx, name, "wrong password here", "10.0.0.1:4711"); !errors.Is(err, ErrBadLogin) {
				t.Fatalf("%s failure %d: %v", name, i+1, err)
			}
		}
		pw := good
		if name == "nobody" {
			pw = "anything at all here"
		}
		// The port is no other client: the address is.
		_, err := s.Authenticate(ctx, name, pw, "10.0.0.1:4712")
		var th *ThrottledError
		if !errors.As(err, &th) || !errors.Is(err, ErrThrottled) || time.Until(th.Until) > 2*time.Second {
			t.Fatalf("%s after %d failures: %v (an unknown name must be throttled alike, for a second)", name, MaxLoginFailures, err)
		}
	}
	// From elsewhere the operator logs in meanwhile.
	if _, err := s.Authenticate(ctx, "ada", good, "192.0.2.7:1"); err != nil {
		t.Fatalf("from another address: %v", err)
	}
	// Past the delay one more try is checked, and the next delay is twice as long.
	if _, err := pool.Exec(ctx, `UPDATE login_throttle SET last_at = last_at - interval '2 seconds'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, "ada", "wrong password here", "10.0.0.1:1"); !errors.Is(err, ErrBadLogin) {
		t.Fatalf("past the delay: %v", err)
	}
	_, err := s.Authenticate(ctx, "ada", good, "10.0.0.1:1")
	var th *ThrottledError
	if !errors.As(err, &th) || time.Until(th.Until) < time.Second || time.Until(th.Until) > 3*time.Second {
		t.Fatalf("after one more failure: %v, want a delay of two seconds", err)
	}
	// The window passes: ada may log in, and the good login starts the count again.
	if _, err := pool.Exec(ctx, `UPDATE login_throttle SET last_at = last_at - interval '16 minutes'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, "ada", good, "10.0.0.1:1"); err != nil {
		t.Fatalf("after the window: %v", err)
	}
	for range MaxLoginFailures - 1 {
		if _, err := s.Authenticate(ctx, "ada", "wrong password here", "10.0.0.1:1"); !errors.Is(err, ErrBadLogin) {
			t.Fatal(err)
		}
	}
	if _, err := s.Authenticate(ctx, "ada", good, "10.0.0.1:1"); err != nil {
		t.Fatalf("one failure short of the limit: %v", err)
	}
	if err := s.PruneThrottle(ctx); err != nil {
		t.Fatal(err)
	}
}

// 40 wrong tries at once from one address: no more than the limit are checked (each
// checked one leaves a login_refused event), the rest refused unchecked; the operator logs
// in from another address meanwhile.
func TestParallelTriesGetNoMoreChecksThanTheLimit(t *testing.T) {
	s, pool := newStore(t)
	// Past the limit a try is checked again once the first delay (1 s) has passed since
	// the last one; 40 tries "at once" on a loaded machine (or with the pool dialling its
	// connections meanwhile) can spread over more than that. Here the delay is a minute,
	// so every try after the limit is one the throttle must refuse unchecked.
	s.firstDelay = time.Minute
	ctx := context.Background()
	if err := s.Add(ctx, "admin", good, "root"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var throttled, refused atomic.Int32
	for range 40 {
		wg.Go(func() {
			_, err := s.Authenticate(ctx, "admin", "wrong password here", "203.0.113.9:5000")
			switch {
			case errors.Is(err, ErrThrottled):
				throttled.Add(1)
			case errors.Is(err, ErrBadLogin):
				refused.Add(1)
			default:
				t.Errorf("a try: %v", err)
			}
		})
	}
	if _, err := s.Authenticate(ctx, "admin", good, "198.51.100.1:443"); err != nil {
		t.Errorf("the operator from elsewhere, meanwhile: %v", err)
	}
	wg.Wait()
	var checked int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM operator_events WHERE operator = 'admin' AND kind = 'login_refused'`).Scan(&checked); err != nil {
		t.Fatal(err)
	}
	if refused.Load() != MaxLoginFailures || checked != MaxLoginFailures || throttled.Load() != 40-MaxLoginFailures {
		t.Fatalf("%d refused after a check (%d events), %d throttled; want %d checked of 40", refused.Load(), checked, throttled.Load(), MaxLoginFailures)
	}
}
