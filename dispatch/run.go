package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"hermeshost/lease"
)

// RunOptions are the timings of Run; zero values take the defaults.
type RunOptions struct {
	Poll time.Duration // between cycles (5s)
	// Grace is how long jobs in flight may run on after ctx ends (20s); then their workers
	// are asked to release them, and given ReleaseWait (15s) before they are killed.
	Grace       time.Duration
	ReleaseWait time.Duration
	// Reap is how often idle workers are stopped and exited units removed (30s); Sweep
	// how often silently expired leases become expiry events (10s).
	Reap  time.Duration
	Sweep time.Duration
	// Cycled, when set, hears of every cycle's result (for logs and tests).
	Cycled func(started int, err error)
}

func (o *RunOptions) defaults() {
	for _, f := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&o.Poll, 5 * time.Second}, {&o.Grace, 20 * time.Second}, {&o.ReleaseWait, 15 * time.Second}, {&o.Reap, 30 * time.Second}, {&o.Sweep, 10 * time.Second}} {
		if *f.v <= 0 {
			*f.v = f.def
		}
	}
}

// Run cycles every Poll until ctx ends, keeping its org leases, reaping idle workers and
// sweeping expired leases on the side; then it shuts down as Shutdown says.
func (d *Dispatcher) Run(ctx context.Context, o RunOptions) {
	o.defaults()
	// The side work outlives ctx until the shutdown is over: org leases must stay fresh
	// while jobs finish in the grace period.
	side, stopSide := context.WithCancel(context.WithoutCancel(ctx))
	var sideWork sync.WaitGroup
	sideWork.Go(func() { d.KeepOwnership(side) })
	sideWork.Go(func() { d.leases.RunSweeper(side, o.Sweep) })
	sideWork.Go(func() { d.reap(side, o.Reap) })
	defer func() {
		stopSide()
		sideWork.Wait()
	}()

	// The ready loop takes an org's next step as soon as its run here ends, beside the
	// cycles, which poll every org's jobs each tick. It stops before the shutdown begins.
	ready, stopReady := context.WithCancel(ctx)
	readyDone := make(chan struct{})
	go func() {
		defer close(readyDone)
		d.readyLoop(ready)
	}()

	t := time.NewTicker(o.Poll)
	defer t.Stop()
	for {
		n, err := d.Cycle(ctx)
		if o.Cycled != nil {
			o.Cycled(n, err)
		}
		select {
		case <-ctx.Done():
			stopReady()
			<-readyDone
			d.Shutdown(o.Grace, o.ReleaseWait)
			return
		case <-t.C:
		}
	}
}

// readyLoop takes each org kicked here, in the order they were kicked, as soon as one of
// stepConcurrency slots is free, until ctx ends; then it waits for the steps under way. An
// org kicked while others' steps are slow starts at once beside them, not after them (taken
// as batches, an org waited for the whole batch before it: about 24 s at the scale run's
// load, where a step took 2-3 s).
func (d *Dispatcher) readyLoop(ctx context.Context) {
	slots := make(chan struct{}, stepConcurrency)
	var steps sync.WaitGroup
	defer steps.Wait()
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		org, ok := d.nextReady()
		if !ok {
			<-slots
			select {
			case <-ctx.Done():
				return
			case <-d.wake:
			}
			continue
		}
		steps.Go(func() {
			defer func() { <-slots }()
			if err := d.readyStep(ctx, org); err != nil && ctx.Err() == nil {
				d.cfg.Log.Warn("next step for an org whose run ended", "org", org, "err", err)
			}
		})
	}
}

func (d *Dispatcher) reap(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		reaped, err := d.cfg.Runtime.Reap(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			d.cfg.Log.Warn("reap workers", "err", err)
		case reaped.Idle+reaped.Exited > 0:
			d.cfg.Log.Info("reaped workers", "idle_stopped", reaped.Idle, "exited_removed", reaped.Exited)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Shutdown stops claiming and lets the jobs in flight run on for grace; then it asks their
// workers to release them (a release is not counted as an attempt) and waits releaseWait
// more before killing what is left. Last, it gives up its org leases so another replica
// takes the orgs over at once.
func (d *Dispatcher) Shutdown(grace, releaseWait time.Duration) {
	d.mu.Lock()
	d.stopping = true
	n := len(d.inFlight)
	d.mu.Unlock()
	done := make(chan struct{})
	go func() {
		d.wg.Wait()
		close(done)
	}()
	if n > 0 {
		d.cfg.Log.Info("dispatcher stopping: no more claims; jobs in flight may finish", "jobs", n, "grace", grace.String())
	}
	select {
	case <-done:
	case <-time.After(grace):
		d.mu.Lock()
		for _, dl := range d.inFlight {
			dl.askToStop()
		}
		n = len(d.inFlight)
		d.mu.Unlock()
		d.cfg.Log.Warn("grace period over: asking the workers to release their jobs", "jobs", n)
		select {
		case <-done:
		case <-time.After(releaseWait):
			d.cfg.Log.Error("workers did not release in time: killing them; their jobs go stale and are re-claimed")
			d.hardStop()
			<-done
		}
	}
	d.mu.Lock()
	held := make([]lease.Lease, 0, len(d.owned))
	for org, o := range d.owned {
		held = append(held, o.lease)
		delete(d.owned, org)
	}
	d.metrics.owned.Set(0)
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, l := range held {
		if err := d.leases.Release(ctx, l); err != nil && !errors.Is(err, lease.ErrLost) {
			d.cfg.Log.Warn("release org lease", "key", l.Key, "err", err)
		}
	}
	d.hardStop()
}
