package main

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"hermeshost/lease"
	"hermeshost/pg/pgtest"
)

func TestLeaseListShowAndForcedRelease(t *testing.T) {
	url, pool := pgtest.Schema(t)
	store := lease.New(pool, lease.Options{})
	defer store.Close()
	ctx := context.Background()
	held, err := store.TryAcquire(ctx, "home:acme", "worker-7", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.TryAcquire(ctx, "session:chat-1", "turn-1", time.Hour); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DATABASE_URL": url}

	r := run(t, env, "lease", "list", "--prefix", "home:")
	if r.code != 0 || !regexp.MustCompile(`(?m)^home:acme\s+worker-7\s+1\s+held\s`).MatchString(r.stdout) || strings.Contains(r.stdout, "session:") {
		t.Fatalf("list: %+v", r)
	}
	r = run(t, env, "lease", "release", "home:acme")
	if r.code != 2 || !strings.Contains(r.stderr, "refusing without --force") {
		t.Fatalf("release without --force: %+v", r)
	}
	r = run(t, env, "lease", "release", "--force", "--as", "ops@console", "--reason", "wedged", "home:acme")
	if r.code != 0 || !strings.Contains(r.stdout, "released home:acme held by worker-7 (epoch 1)") {
		t.Fatalf("forced release: %+v", r)
	}
	if _, err := store.Refresh(ctx, held, time.Hour); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("the old holder's refresh after a forced release: %v", err)
	}
	r = run(t, env, "lease", "show", "home:acme")
	if r.code != 0 || !strings.Contains(r.stdout, "epoch:    2") || !strings.Contains(r.stdout, "state:    free") ||
		!regexp.MustCompile(`force_release\s+worker-7\s+1\s+by ops@console: wedged`).MatchString(r.stdout) {
		t.Fatalf("show: %+v", r)
	}
	for _, bad := range [][]string{{"lease", "show", "table:x"}, {"lease", "release", "--force", "home:nobody"}} {
		if r := run(t, env, bad...); r.code != 1 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%v: want a one-line error, got %+v", bad, r)
		}
	}
}
