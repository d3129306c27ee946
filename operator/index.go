package operator

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"hermeshost/mirror"
)

// OrgEntry is one org on the launcher's index, as the host's own records show it: the job
// mirror and the subagent handles, never the backend.
type OrgEntry struct {
	Org            string
	Queued         int // claimed and waiting for its worker to start
	Running        int
	Completed      int
	Failed         int
	LiveSubagents  int
	LastActivityAt *time.Time
}

// Index is what operator name may see on the launcher: each org granted to them with its
// activity, by org id, and how many other orgs the host knows of (without naming them).
// A disabled or unknown operator sees nothing.
func (s *Store) Index(ctx context.Context, name string) (entries []OrgEntry, others int, err error) {
	if err := CheckName(name); err != nil {
		return nil, 0, err
	}
	// Jobs are counted by the mirror, their owner; a read-only mirror Store starts no
	// listener, so it needs no Close.
	jobs := mirror.New(s.pool, mirror.Options{})
	rows, err := s.pool.Query(ctx, `
WITH mine AS (
    SELECT g.org FROM operator_grants g JOIN operators o ON o.name = g.operator
     WHERE g.operator = $1 AND o.disabled_at IS NULL
)
SELECT m.org,
       (SELECT count(*) FROM subagents s WHERE s.org = m.org AND s.status IN ('running', 'cancelling')),
       (SELECT max(updated_at) FROM subagents s WHERE s.org = m.org)
  FROM mine m
 ORDER BY m.org`, name)
	if err != nil {
		return nil, 0, fmt.Errorf("index for %s: %w", name, err)
	}
	entries, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (OrgEntry, error) {
		var e OrgEntry
		err := row.Scan(&e.Org, &e.LiveSubagents, &e.LastActivityAt)
		return e, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("index for %s: %w", name, err)
	}
	orgs := make([]string, len(entries))
	for i, e := range entries {
		orgs[i] = e.Org
	}
	counts, err := jobs.CountsOf(ctx, orgs)
	if err != nil {
		return nil, 0, fmt.Errorf("index for %s: %w", name, err)
	}
	for i := range entries {
		e := &entries[i]
		c := counts[e.Org]
		e.Queued, e.Running, e.Completed, e.Failed = c.Claimed, c.Running, c.Completed, c.Failed
		if c.LastUpdatedAt != nil && (e.LastActivityAt == nil || c.LastUpdatedAt.After(*e.LastActivityAt)) {
			e.LastActivityAt = c.LastUpdatedAt
		}
	}
	// Every org the host knows of, from its own records, less the ones listed.
	known := map[string]bool{}
	withJobs, err := jobs.Orgs(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("index for %s: %w", name, err)
	}
	for _, org := range withJobs {
		known[org] = true
	}
	rows, err = s.pool.Query(ctx, `SELECT org FROM subagents UNION SELECT org FROM operator_grants`)
	if err != nil {
		return nil, 0, fmt.Errorf("index for %s: %w", name, err)
	}
	rest, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, 0, fmt.Errorf("index for %s: %w", name, err)
	}
	for _, org := range rest {
		known[org] = true
	}
	return entries, len(known) - len(entries), nil
}
