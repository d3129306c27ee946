package lease

import (
	"context"
	"slices"
	"testing"
	"time"
)

// Changes are an org's own home: and session: events after an id, woken by the trigger's
// notification (the poll is an hour here); org: keys, other orgs' keys and keys of an org
// whose name only starts like this one's are left out.
func TestChangesAreTheOrgsLeaseEventsWokenByTheirNotification(t *testing.T) {
	f := newFixture(t, Options{Poll: time.Hour})
	ctx := context.Background()
	head, err := f.store.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"org:acme", "home:globex", "session:globex.s1", "session:acme2.s1", "session:acme-x.s1", "home:acme2"} {
		if _, err := f.store.TryAcquire(ctx, key, "someone", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if evs, err := f.store.Changes(ctx, "acme", head, 100, 0); err != nil || len(evs) != 0 {
		t.Fatalf("acme's changes hold others' events: %+v %v", evs, err)
	}
	done := make(chan []Event, 1)
	go func() {
		evs, err := f.store.Changes(ctx, "acme", head, 100, 20*time.Second)
		if err != nil {
			t.Error(err)
		}
		done <- evs
	}()
	for l := f.store.ensureEventsListener(ctx); !l.Subscribed("acme"); {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	home, err := f.store.TryAcquire(ctx, "home:acme", "worker-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	evs := <-done
	if len(evs) != 1 || evs[0].Key != "home:acme" || evs[0].Kind != KindAcquire || evs[0].Epoch != home.Epoch {
		t.Fatalf("woken with %+v", evs)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("woken after %s: by the poll, not the notification", waited)
	}
	s, err := f.store.TryAcquire(ctx, "session:acme.s1", "chat-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.store.Release(ctx, s); err != nil {
		t.Fatal(err)
	}
	evs, err = f.store.Changes(ctx, "acme", head, 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, e.Key+" "+e.Kind)
	}
	if want := []string{"home:acme acquire", "session:acme.s1 acquire", "session:acme.s1 release"}; !slices.Equal(got, want) {
		t.Fatalf("acme's changes %q, want %q", got, want)
	}
	if evs, _ = f.store.Changes(ctx, "acme", evs[1].ID, 100, 0); len(evs) != 1 || evs[0].Kind != KindRelease {
		t.Fatalf("after the second: %+v", evs)
	}
	if now, err := f.store.Head(ctx); err != nil || now <= head {
		t.Fatalf("the head after the writes: %d (was %d), %v", now, head, err)
	}
	for _, bad := range []struct {
		limit int
		wait  time.Duration
	}{{0, 0}, {MaxChanges + 1, 0}, {1, -time.Second}, {1, MaxChangesWait + time.Second}} {
		if _, err := f.store.Changes(ctx, "acme", 0, bad.limit, bad.wait); err == nil {
			t.Errorf("limit %d wait %s accepted", bad.limit, bad.wait)
		}
	}
}
