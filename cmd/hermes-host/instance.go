package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"hermeshost/lease"
)

// instanceKey is the lease a running dispatcher holds for its HERMES_INSTANCE.
func instanceKey(instance string) string { return "instance:" + instance }

// holdInstance takes this dispatcher's instance lease and keeps it, or refuses to start
// when another dispatcher holds it: two under one name on one engine would adopt, sweep and
// remove each other's containers.
func holdInstance(ctx context.Context, leases *lease.Store, instance string, ttl time.Duration, log *slog.Logger) (*lease.Kept, error) {
	host, _ := os.Hostname()
	holder := fmt.Sprintf("dispatcher %s pid %d", host, os.Getpid())
	l, err := leases.TryAcquire(ctx, instanceKey(instance), holder, ttl)
	var held *lease.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("another dispatcher runs as HERMES_INSTANCE=%s (%s, until %s unless it goes on): give each dispatcher its own HERMES_INSTANCE",
			instance, held.Holder, held.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if err != nil {
		return nil, fmt.Errorf("hold HERMES_INSTANCE=%s: %w", instance, err)
	}
	log.Info("instance held", "instance", instance, "holder", holder, "epoch", l.Epoch)
	return leases.Keep(ctx, l, ttl), nil
}

// releaseInstance lets the instance's name go when the dispatcher stops.
func releaseInstance(leases *lease.Store, kept *lease.Kept, log *slog.Logger) {
	l := kept.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := leases.Release(ctx, l); err != nil && !errors.Is(err, lease.ErrLost) {
		log.Warn("release the instance's lease", "err", err)
	}
}

// instanceLive says whether a dispatcher holds instance's lease now: its containers are
// then its own, never a dead instance's to remove.
func instanceLive(ctx context.Context, leases *lease.Store, instance string) (bool, error) {
	info, err := leases.Holder(ctx, instanceKey(instance))
	if errors.Is(err, lease.ErrUnknownKey) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return info.Held(time.Now()), nil
}
