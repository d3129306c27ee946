package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"hermeshost/pg"
)

// Bounds of Changes.
const (
	MaxChanges     = 500
	MaxChangesWait = 30 * time.Second
)

// eventsChannel is the channel every lease event of this schema notifies on (migration
// 00006's trigger), with the org its key belongs to as the payload.
func (s *Store) eventsChannel() string {
	schema := s.pool.Config().ConnConfig.RuntimeParams["search_path"]
	return "hermes_lease_events_" + schema[:min(len(schema), 40)]
}

func (s *Store) ensureEventsListener(ctx context.Context) *pg.Listener {
	s.eventsOnce.Do(func() {
		s.eventsListener = pg.Listen(s.pool.Config().ConnConfig, s.eventsChannel(), s.log)
	})
	s.eventsListener.Started(ctx)
	return s.eventsListener
}

// Head is the newest lease event id of the database, from which a watcher that wants only
// what happens next reads on.
func (s *Store) Head(ctx context.Context) (int64, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('lease_events', 'id')), 0)`).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("lease events head: %w", err)
	}
	return id, nil
}

// Changes are org's home: and session: lease events after id after, oldest first, at most
// limit; with none yet it waits up to wait for one, woken by the event's notification
// (and looking again every poll interval in case one is missed). Never org: leases: those
// are the dispatcher's.
func (s *Store) Changes(ctx context.Context, org string, after int64, limit int, wait time.Duration) ([]Event, error) {
	switch {
	case limit < 1 || limit > MaxChanges:
		return nil, invalid("limit %d is not from 1 to %d", limit, MaxChanges)
	case wait < 0 || wait > MaxChangesWait:
		return nil, invalid("wait %s is not from 0 to %s", wait, MaxChangesWait)
	}
	var wakeups <-chan struct{}
	if wait > 0 {
		// Subscribed before the first look, so an event committed between the look and the
		// wait still wakes it.
		ch, unsubscribe := s.ensureEventsListener(ctx).Subscribe(org)
		defer unsubscribe()
		wakeups = ch
	}
	var evs []Event
	err := pg.Await(ctx, wakeups, wait, s.poll, func() (bool, error) {
		var err error
		evs, err = s.changes(ctx, org, after, limit)
		return len(evs) > 0, err
	})
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("wait for the lease events of %s: %w", org, err)
	}
	return evs, err
}

func (s *Store) changes(ctx context.Context, org string, after int64, limit int) ([]Event, error) {
	// The org's session keys are the range session:<org>. up to session:<org>/ ('/' sorts
	// right after '.'), which the key's index serves.
	rows, err := s.pool.Query(ctx, `
SELECT id, key, kind, holder, epoch, coalesce(previous_holder, ''), coalesce(actor, ''), coalesce(reason, ''), at
  FROM lease_events
 WHERE id > $2 AND (key = 'home:' || $1 OR (key > 'session:' || $1 || '.' AND key < 'session:' || $1 || '/'))
 ORDER BY id LIMIT $3`, org, after, limit)
	if err != nil {
		return nil, fmt.Errorf("lease events of %s: %w", org, err)
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.ID, &e.Key, &e.Kind, &e.Holder, &e.Epoch, &e.PreviousHolder, &e.Actor, &e.Reason, &e.At)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("lease events of %s: %w", org, err)
	}
	return evs, nil
}
