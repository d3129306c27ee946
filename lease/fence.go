package lease

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Fence makes the rest of tx a fenced write under l: it checks that l's holder and epoch
// are still current and not expired, and share-locks the lease row until tx ends, so no
// takeover or forced release can commit between the check and tx's commit. When l is
// stale it returns ErrLost and the caller must roll back.
func (s *Store) Fence(ctx context.Context, tx pgx.Tx, l Lease) error {
	var one int
	err := tx.QueryRow(ctx, `
SELECT 1 FROM leases
 WHERE key = $1 AND holder = $2 AND epoch = $3 AND expires_at > clock_timestamp()
   FOR SHARE`, l.Key, l.Holder, l.Epoch).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		s.metrics.refused.WithLabelValues("fenced_write", Namespace(l.Key)).Inc()
		return fmt.Errorf("fenced write under %s as %s (epoch %d): %w", l.Key, l.Holder, l.Epoch, ErrLost)
	}
	if err != nil {
		return fmt.Errorf("fence %s: %w", l.Key, err)
	}
	return nil
}

// WithFence runs fn in a transaction fenced by l and commits it; if l is stale nothing fn
// would have written is kept.
func (s *Store) WithFence(ctx context.Context, l Lease, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.Fence(ctx, tx, l); err != nil {
			return err
		}
		return fn(tx)
	})
}
