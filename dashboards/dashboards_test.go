package dashboards

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"hermeshost/pg/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type fixture struct {
	store *Store
	pool  *pgxpool.Pool
	reg   *prometheus.Registry
}

// newFixture is a store on a fresh schema, on a channel of its own: tests of other
// packages request dashboards on the default channel at the same time.
func newFixture(t *testing.T) fixture {
	t.Helper()
	_, pool := pgtest.Schema(t)
	reg := prometheus.NewRegistry()
	s := New(pool, Options{Registerer: reg, Channel: "hermes_dashboards_test_" + strings.ToLower(rand.Text())})
	t.Cleanup(s.Close)
	return fixture{store: s, pool: pool, reg: reg}
}

func (f fixture) get(t *testing.T, org string) Dashboard {
	t.Helper()
	d, err := f.store.Get(context.Background(), org)
	if err != nil {
		t.Fatalf("Get(%s): %v", org, err)
	}
	return d
}

func (f fixture) transitions(state State) float64 {
	return testutil.ToFloat64(f.store.metrics.transitions.WithLabelValues(string(state)))
}

// running takes org's fresh request to running for instance at url.
func (f fixture) running(t *testing.T, org, instance, url string) Dashboard {
	t.Helper()
	ctx := context.Background()
	if _, err := f.store.Request(ctx, org, "ada"); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.store.Start(ctx, org, instance); err != nil || !ok {
		t.Fatalf("Start(%s, %s) = %v, %v", org, instance, ok, err)
	}
	if err := f.store.Running(ctx, org, instance, url); err != nil {
		t.Fatal(err)
	}
	return f.get(t, org)
}

func TestRequestStartsALifeAndLeavesALiveOneAlone(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.store.Get(ctx, "acme"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get before any request: %v, want ErrNotFound", err)
	}
	d, err := f.store.Request(ctx, "acme", "ada")
	if err != nil || d.State != Requested || d.RequestedBy != "ada" || d.Instance != "" || d.URL != "" || d.StartedAt != nil {
		t.Fatalf("first request = %+v, %v", d, err)
	}
	first := d.RequestedAt
	// Asked again while requested, starting or running: nothing moves, whoever asks.
	if d, err = f.store.Request(ctx, "acme", "bob"); err != nil || d.State != Requested || d.RequestedBy != "ada" || !d.RequestedAt.Equal(first) {
		t.Fatalf("repeated request = %+v, %v; want the first one untouched", d, err)
	}
	if pending, err := f.store.Pending(ctx); err != nil || len(pending) != 1 || pending[0].Org != "acme" {
		t.Fatalf("Pending = %+v, %v", pending, err)
	}
	if ok, err := f.store.Start(ctx, "acme", "host-a"); err != nil || !ok {
		t.Fatalf("Start = %v, %v", ok, err)
	}
	if d, _ = f.store.Request(ctx, "acme", "bob"); d.State != Starting || d.Instance != "host-a" {
		t.Fatalf("request while starting = %+v, want it left starting for host-a", d)
	}
	if pending, _ := f.store.Pending(ctx); len(pending) != 0 {
		t.Fatalf("Pending while starting = %+v", pending)
	}
	if err := f.store.Running(ctx, "acme", "host-a", "http://127.0.0.1:4100"); err != nil {
		t.Fatal(err)
	}
	d = f.get(t, "acme")
	if d.State != Running || d.URL != "http://127.0.0.1:4100" || d.StartedAt == nil || d.LastSeenAt == nil {
		t.Fatalf("running row = %+v", d)
	}
	if again, _ := f.store.Request(ctx, "acme", "bob"); again.State != Running || again.URL != d.URL || !again.UpdatedAt.Equal(d.UpdatedAt) {
		t.Fatalf("request while running = %+v, want the running row as it was", again)
	}

	// Failed and stopped rows become requested again, with the old run's traces cleared.
	if err := f.store.Fail(ctx, "acme", "host-a", "the dashboard exited: exit 1"); err != nil {
		t.Fatal(err)
	}
	if d = f.get(t, "acme"); d.State != Failed || d.Error != "the dashboard exited: exit 1" || d.URL != "" || d.Instance != "host-a" {
		t.Fatalf("failed row = %+v", d)
	}
	if d, err = f.store.Request(ctx, "acme", "bob"); err != nil || d.State != Requested || d.RequestedBy != "bob" ||
		d.Error != "" || d.Instance != "" || d.StartedAt != nil || d.LastSeenAt != nil || !d.RequestedAt.After(first) {
		t.Fatalf("request after a failure = %+v, %v", d, err)
	}
	f.running(t, "acme", "host-b", "http://127.0.0.1:4101")
	if err := f.store.Stopped(ctx, "acme", "host-b"); err != nil {
		t.Fatal(err)
	}
	if d = f.get(t, "acme"); d.State != Stopped || d.URL != "" {
		t.Fatalf("stopped row = %+v", d)
	}
	if d, _ = f.store.Request(ctx, "acme", "ada"); d.State != Requested {
		t.Fatalf("request after a stop = %+v", d)
	}
	for state, want := range map[State]float64{Requested: 3, Starting: 2, Running: 2, Failed: 1, Stopped: 1} {
		if got := f.transitions(state); got != want {
			t.Errorf("transitions to %s = %v, want %v", state, got, want)
		}
	}
}

func TestTransitionsOfAnotherInstanceChangeNothing(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.store.Running(ctx, "acme", "host-a", "http://127.0.0.1:4100"); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Running with no row: %v, want ErrNotHeld", err)
	}
	if _, err := f.store.Request(ctx, "acme", "ada"); err != nil {
		t.Fatal(err)
	}
	// Nobody took the request yet: no dispatcher transition applies to it.
	for name, err := range map[string]error{
		"running": f.store.Running(ctx, "acme", "host-a", "http://127.0.0.1:4100"),
		"fail":    f.store.Fail(ctx, "acme", "host-a", "boom"),
		"stopped": f.store.Stopped(ctx, "acme", "host-a"),
		"requeue": f.store.Requeue(ctx, "acme", "host-a"),
	} {
		if !errors.Is(err, ErrNotHeld) {
			t.Errorf("%s of a requested row: %v, want ErrNotHeld", name, err)
		}
	}
	if ok, err := f.store.Start(ctx, "acme", "host-a"); err != nil || !ok {
		t.Fatalf("Start = %v, %v", ok, err)
	}
	if ok, err := f.store.Start(ctx, "acme", "host-b"); err != nil || ok {
		t.Fatalf("a second Start = %v, %v; want false", ok, err)
	}
	for name, err := range map[string]error{
		"running": f.store.Running(ctx, "acme", "host-b", "http://127.0.0.1:4100"),
		"fail":    f.store.Fail(ctx, "acme", "host-b", "boom"),
		"stopped": f.store.Stopped(ctx, "acme", "host-b"),
		"requeue": f.store.Requeue(ctx, "acme", "host-b"),
	} {
		if !errors.Is(err, ErrNotHeld) || !strings.Contains(err.Error(), "starting for host-a") {
			t.Errorf("%s by host-b of host-a's start: %v, want ErrNotHeld naming host-a", name, err)
		}
	}
	if d := f.get(t, "acme"); d.State != Starting || d.Instance != "host-a" || d.Error != "" {
		t.Fatalf("after host-b's attempts the row is %+v, want host-a's start untouched", d)
	}
	if mine, err := f.store.OfInstance(ctx, "host-a"); err != nil || len(mine) != 1 || mine[0].State != Starting {
		t.Fatalf("OfInstance(host-a) = %+v, %v", mine, err)
	}
	if theirs, err := f.store.OfInstance(ctx, "host-b"); err != nil || len(theirs) != 0 {
		t.Fatalf("OfInstance(host-b) = %+v, %v", theirs, err)
	}
	if err := f.store.Running(ctx, "acme", "host-a", "http://127.0.0.1:4100"); err != nil {
		t.Fatal(err)
	}
	if idle, err := f.store.StopIfIdle(ctx, "acme", "host-b", time.Nanosecond); err != nil || idle {
		t.Fatalf("StopIfIdle by host-b = %v, %v; want false", idle, err)
	}
	// A running row is not a start to give back, nor running twice.
	if err := f.store.Requeue(ctx, "acme", "host-a"); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Requeue of a running row: %v", err)
	}
	if err := f.store.Running(ctx, "acme", "host-a", "http://127.0.0.1:4101"); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Running twice: %v", err)
	}
	if err := f.store.Stopped(ctx, "acme", "host-a"); err != nil {
		t.Fatal(err)
	}
	if err := f.store.Stopped(ctx, "acme", "host-a"); !errors.Is(err, ErrNotHeld) || !strings.Contains(err.Error(), "is stopped") {
		t.Fatalf("Stopped twice: %v, want ErrNotHeld saying it is stopped", err)
	}
	if mine, _ := f.store.OfInstance(ctx, "host-a"); len(mine) != 0 {
		t.Fatalf("OfInstance(host-a) after the stop = %+v", mine)
	}
}

func TestOneOfManyRacingStartsWins(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for round := range 5 {
		if _, err := f.store.Request(ctx, "acme", "ada"); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		won := make([]bool, 8)
		errs := make([]error, 8)
		for i := range won {
			wg.Go(func() { won[i], errs[i] = f.store.Start(ctx, "acme", "host-"+string(rune('a'+i))) })
		}
		wg.Wait()
		winners := 0
		winner := ""
		for i, ok := range won {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if ok {
				winners++
				winner = "host-" + string(rune('a'+i))
			}
		}
		if d := f.get(t, "acme"); winners != 1 || d.State != Starting || d.Instance != winner {
			t.Fatalf("round %d: %d winners (%s), row %+v; want exactly one, holding the row", round, winners, winner, d)
		}
		if err := f.store.Stopped(ctx, "acme", winner); err != nil {
			t.Fatal(err)
		}
	}
}

// wakes drains w for d and counts what it received.
func wakes(w <-chan struct{}, d time.Duration) int {
	n := 0
	timeout := time.After(d)
	for {
		select {
		case <-w:
			n++
		case <-timeout:
			return n
		}
	}
}

func waitWake(t *testing.T, w <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-w:
	case <-time.After(10 * time.Second):
		t.Fatalf("no wake-up within 10s after %s", what)
	}
}

func TestWakeHearsEveryRequestAndNothingElse(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// The launcher's store only writes; the dispatcher's listens on its own connection.
	launcher := New(f.pool, Options{Channel: f.store.channel})
	w := f.store.Wake()
	waitWake(t, w, "the listener connected")
	if f.store.Wake() != w {
		t.Fatal("Wake handed out a second channel")
	}

	if _, err := launcher.Request(ctx, "acme", "ada"); err != nil {
		t.Fatal(err)
	}
	waitWake(t, w, "a request")
	if _, err := launcher.Request(ctx, "acme", "bob"); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.store.Start(ctx, "acme", "host-a"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := f.store.Running(ctx, "acme", "host-a", "http://127.0.0.1:4100"); err != nil {
		t.Fatal(err)
	}
	if err := launcher.Unreachable(ctx, "acme", "http://127.0.0.1:9999"); err != nil {
		t.Fatal(err)
	}
	if n := wakes(w, 300*time.Millisecond); n != 0 {
		t.Fatalf("%d wake-ups for a repeated request, a start, a running row and an unreachable stale URL; want none", n)
	}
	if d := f.get(t, "acme"); d.State != Running {
		t.Fatalf("an unreachable report of another URL moved the row: %+v", d)
	}

	if err := launcher.Unreachable(ctx, "acme", "http://127.0.0.1:4100"); err != nil {
		t.Fatal(err)
	}
	waitWake(t, w, "the running dashboard's URL reported unreachable")
	if d := f.get(t, "acme"); d.State != Requested || d.URL != "" || d.Instance != "" || d.RequestedBy != "ada" {
		t.Fatalf("after Unreachable the row is %+v, want requested again, nobody's", d)
	}
	if pending, _ := f.store.Pending(ctx); len(pending) != 1 {
		t.Fatalf("Pending after Unreachable = %+v", pending)
	}

	// A start given back is announced too, for another dispatcher to take.
	if ok, err := f.store.Start(ctx, "acme", "host-a"); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := f.store.Requeue(ctx, "acme", "host-a"); err != nil {
		t.Fatal(err)
	}
	waitWake(t, w, "a requeued start")
	if d := f.get(t, "acme"); d.State != Requested || d.Instance != "" {
		t.Fatalf("requeued row = %+v", d)
	}

	// Many requests at once coalesce into at most a few wake-ups, never a queue of them.
	for _, org := range []string{"o1", "o2", "o3", "o4", "o5", "o6"} {
		if _, err := launcher.Request(ctx, org, "ada"); err != nil {
			t.Fatal(err)
		}
	}
	if n := wakes(w, 500*time.Millisecond); n < 1 || n > 6 {
		t.Fatalf("%d wake-ups for six requests", n)
	}
}

func TestSeenKeepsADashboardFromGoingIdle(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.running(t, "acme", "host-a", "http://127.0.0.1:4100")
	backdate := func(ago string) {
		t.Helper()
		if _, err := f.pool.Exec(ctx, `UPDATE dashboards SET last_seen_at = now() - $1::interval WHERE org = 'acme'`, ago); err != nil {
			t.Fatal(err)
		}
	}
	if idle, err := f.store.StopIfIdle(ctx, "acme", "host-a", 30*time.Minute); err != nil || idle {
		t.Fatalf("StopIfIdle of a dashboard just started = %v, %v", idle, err)
	}
	backdate("31 minutes")
	if err := f.store.Seen(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	seen := f.get(t, "acme").LastSeenAt
	if seen == nil || time.Since(*seen) > time.Minute {
		t.Fatalf("last_seen_at after Seen = %v", seen)
	}
	if idle, _ := f.store.StopIfIdle(ctx, "acme", "host-a", 30*time.Minute); idle {
		t.Fatal("a dashboard seen just now was stopped as idle")
	}
	// Within a second the proxy's uses are one write.
	if err := f.store.Seen(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if again := f.get(t, "acme").LastSeenAt; !again.Equal(*seen) {
		t.Fatalf("a second Seen within a second wrote %v over %v", again, seen)
	}

	backdate("31 minutes")
	if idle, err := f.store.StopIfIdle(ctx, "acme", "host-a", 30*time.Minute); err != nil || !idle {
		t.Fatalf("StopIfIdle of a dashboard unseen for 31m = %v, %v", idle, err)
	}
	d := f.get(t, "acme")
	if d.State != Stopped || d.URL != "" {
		t.Fatalf("idle row = %+v", d)
	}
	// Seen leaves a dashboard that is not running alone.
	if err := f.store.Seen(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if after := f.get(t, "acme"); !after.LastSeenAt.Equal(*d.LastSeenAt) || after.State != Stopped {
		t.Fatalf("Seen of a stopped dashboard changed it: %+v", after)
	}
	if idle, err := f.store.StopIfIdle(ctx, "acme", "host-a", 0); !errors.Is(err, ErrInvalid) || idle {
		t.Fatalf("StopIfIdle with no timeout = %v, %v", idle, err)
	}
}

func TestPendingIsOldestRequestFirst(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, org := range []string{"zeta", "alpha", "mid"} {
		if _, err := f.store.Request(ctx, org, "ada"); err != nil {
			t.Fatal(err)
		}
	}
	pending, err := f.store.Pending(ctx)
	if err != nil || len(pending) != 3 || pending[0].Org != "zeta" || pending[1].Org != "alpha" || pending[2].Org != "mid" {
		t.Fatalf("Pending = %+v, %v; want the order of the requests", pending, err)
	}
}

func TestFailureReasonsAreKeptStorable(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.running(t, "acme", "host-a", "http://127.0.0.1:4100")
	long := strings.Repeat("é", MaxReasonLen+50) + "\x00\xff"
	if err := f.store.Fail(ctx, "acme", "host-a", long); err != nil {
		t.Fatal(err)
	}
	d := f.get(t, "acme")
	if n := utf8.RuneCountInString(d.Error); d.State != Failed || n != MaxReasonLen || !strings.HasSuffix(d.Error, "...") {
		t.Fatalf("failed with a long reason: state %s, %d characters stored", d.State, n)
	}
	f.running(t, "acme", "host-a", "http://127.0.0.1:4100")
	if err := f.store.Fail(ctx, "acme", "host-a", "bad\x00byte \xff"); err != nil {
		t.Fatal(err)
	}
	if d := f.get(t, "acme"); d.Error != "badbyte ?" {
		t.Fatalf("reason stored as %q", d.Error)
	}
}

func TestBadInputIsRefusedBeforeSQL(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// Ids that would be a path, a name on the engine or an injection elsewhere.
	for _, org := range []string{"", "Acme", "-acme", "acme/../x", "acme'; DROP TABLE dashboards; --", strings.Repeat("a", 64), "acme\n"} {
		calls := map[string]error{}
		_, calls["get"] = f.store.Get(ctx, org)
		_, calls["request"] = f.store.Request(ctx, org, "ada")
		calls["unreachable"] = f.store.Unreachable(ctx, org, "http://127.0.0.1:1")
		calls["seen"] = f.store.Seen(ctx, org)
		_, calls["start"] = f.store.Start(ctx, org, "host-a")
		calls["running"] = f.store.Running(ctx, org, "host-a", "http://127.0.0.1:1")
		calls["fail"] = f.store.Fail(ctx, org, "host-a", "boom")
		calls["stopped"] = f.store.Stopped(ctx, org, "host-a")
		calls["requeue"] = f.store.Requeue(ctx, org, "host-a")
		_, calls["stop idle"] = f.store.StopIfIdle(ctx, org, "host-a", time.Minute)
		for name, err := range calls {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s(%q): %v, want ErrInvalid", name, org, err)
			}
		}
	}
	for name, err := range map[string]error{
		"instance":      func() error { _, err := f.store.Start(ctx, "acme", "a b"); return err }(),
		"empty inst":    func() error { _, err := f.store.OfInstance(ctx, ""); return err }(),
		"url scheme":    f.store.Running(ctx, "acme", "host-a", "ftp://127.0.0.1:1"),
		"url relative":  f.store.Unreachable(ctx, "acme", "127.0.0.1:1"),
		"requester":     func() error { _, err := f.store.Request(ctx, "acme", ""); return err }(),
		"requester nl":  func() error { _, err := f.store.Request(ctx, "acme", "ada\nadmin"); return err }(),
		"empty reason":  f.store.Fail(ctx, "acme", "host-a", "  "),
		"stop idle neg": func() error { _, err := f.store.StopIfIdle(ctx, "acme", "host-a", -time.Second); return err }(),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	var n int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM dashboards`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows after refused calls (%v)", n, err)
	}
}
