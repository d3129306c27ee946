package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/lease"
	"hermeshost/pg"
	"hermeshost/pg/pgtest"
)

// The dispatcher's own leases are refreshed on the keep pool and the agents' (the control
// API's) on the main pool: each goes on while the other pool is exhausted, and waits when
// its own is.
func TestTheDispatchersLeasesAndTheAgentsAreKeptOnPoolsOfTheirOwn(t *testing.T) {
	ctx := context.Background()
	url, _ := pgtest.Schema(t)
	main, _, err := pg.OpenWith(ctx, url, "", pg.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer main.Close()
	keepPool, _, err := pg.OpenWith(ctx, url, "", pg.Options{MaxConns: 1, Name: pg.LeasePool})
	if err != nil {
		t.Fatal(err)
	}
	defer keepPool.Close()
	own, agents := leaseStores(main, keepPool, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	defer own.Close()
	defer agents.Close()

	const ttl = 30 * time.Second
	mine, err := own.TryAcquire(ctx, "org:acme", "dispatcher-a", ttl)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := agents.TryAcquire(ctx, "session:20261207_090000_acme01", "agent-acme", ttl)
	if err != nil {
		t.Fatal(err)
	}
	// refresh asks store to refresh l within a second, and says whether it could.
	refresh := func(store *lease.Store, l lease.Lease) (lease.Lease, error) {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return store.Refresh(ctx, l, ttl)
	}
	// exhausted runs fn with pool's one connection taken, given back before any check fails.
	exhausted := func(pool *pgxpool.Pool, fn func()) {
		held, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release()
		fn()
	}
	var agentErr, ownErr error
	exhausted(keepPool, func() {
		theirs, agentErr = refresh(agents, theirs)
		_, ownErr = refresh(own, mine)
	})
	if agentErr != nil {
		t.Fatalf("an agent's lease could not be refreshed while the keep pool was exhausted: %v", agentErr)
	}
	if !errors.Is(ownErr, context.DeadlineExceeded) {
		t.Fatalf("the dispatcher's refresh with the keep pool exhausted: %v, want it to wait (it ran elsewhere)", ownErr)
	}
	exhausted(main, func() {
		mine, ownErr = refresh(own, mine)
		_, agentErr = refresh(agents, theirs)
	})
	if ownErr != nil {
		t.Fatalf("the dispatcher's lease could not be refreshed while the main pool was exhausted: %v", ownErr)
	}
	if !errors.Is(agentErr, context.DeadlineExceeded) {
		t.Fatalf("an agent's refresh with the main pool exhausted: %v, want it to wait (it ran on the keep pool)", agentErr)
	}
	if err := own.Release(ctx, mine); err != nil {
		t.Fatal(err)
	}
}
