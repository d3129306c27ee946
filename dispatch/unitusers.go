package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// UnitUsers gives each org a uid of its own from [First, Last] (its gid the same), for
// the runtime's units (runtime.Config.Users): recorded in unit_users, so that every
// dispatcher gives an org the same uid and never two orgs one. An org keeps its uid when
// the range later changes. Known uids are remembered by the process.
type UnitUsers struct {
	db          *pgxpool.Pool
	first, last int

	mu   sync.Mutex
	uids map[string]int
}

// keeperUID is the workers' keeper's (runtime's keeperUser), never an org's.
const keeperUID = 65534

// NewUnitUsers checks the range: above root, and not only the keeper's uid.
func NewUnitUsers(db *pgxpool.Pool, first, last int) (*UnitUsers, error) {
	switch {
	case db == nil:
		return nil, errors.New("unit users: no database")
	case first < 1 || last < first:
		return nil, fmt.Errorf("unit users: range %d-%d is empty or includes root", first, last)
	case first == keeperUID && last == keeperUID:
		return nil, fmt.Errorf("unit users: range %d-%d holds only the workers' keeper", first, last)
	}
	return &UnitUsers{db: db, first: first, last: last, uids: map[string]int{}}, nil
}

// UserOf is org's uid and gid, allocated on first use: the lowest free uid of the range.
func (u *UnitUsers) UserOf(ctx context.Context, org string) (uid, gid int, err error) {
	u.mu.Lock()
	uid, ok := u.uids[org]
	u.mu.Unlock()
	if ok {
		return uid, uid, nil
	}
	// Two dispatchers may pick the same free uid for two orgs at once: the loser's insert
	// breaks the uid's uniqueness, and it looks again.
	for try := 0; ; try++ {
		uid, err = u.allocate(ctx, org)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "23505" || try == 10 {
			break
		}
	}
	if err != nil {
		return 0, 0, err
	}
	u.mu.Lock()
	u.uids[org] = uid
	u.mu.Unlock()
	return uid, uid, nil
}

func (u *UnitUsers) allocate(ctx context.Context, org string) (int, error) {
	existing := func() (int, bool, error) {
		var uid int
		err := u.db.QueryRow(ctx, `SELECT uid FROM unit_users WHERE org = $1`, org).Scan(&uid)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, false, nil
		}
		if err != nil {
			return 0, false, fmt.Errorf("unit users: look up org %s: %w", org, err)
		}
		return uid, true, nil
	}
	if uid, ok, err := existing(); ok || err != nil {
		return uid, err
	}
	var uid int
	err := u.db.QueryRow(ctx, `
		WITH free AS (
			SELECT g AS uid FROM generate_series($2::int, $3::int) g
			WHERE g <> $4 AND NOT EXISTS (SELECT 1 FROM unit_users WHERE uid = g)
			ORDER BY g LIMIT 1
		)
		INSERT INTO unit_users (org, uid) SELECT $1, uid FROM free
		ON CONFLICT (org) DO NOTHING
		RETURNING uid`, org, u.first, u.last, keeperUID).Scan(&uid)
	if errors.Is(err, pgx.ErrNoRows) {
		// Nothing inserted: another dispatcher gave the org its uid meanwhile (the conflict,
		// or the last free uid taken by it), or the range is full.
		if uid, ok, err := existing(); ok || err != nil {
			return uid, err
		}
		return 0, fmt.Errorf("unit users: no uid of %d-%d is free for org %s (UNIT_UIDS)", u.first, u.last, org)
	}
	if err != nil {
		return 0, fmt.Errorf("unit users: allocate org %s: %w", org, err)
	}
	return uid, nil
}
