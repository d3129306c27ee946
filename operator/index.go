package operator

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
	rows, err := s.pool.Query(ctx, `
WITH mine AS (
    SELECT g.org FROM operator_grants g JOIN operators o ON o.name = g.operator
     WHERE g.operator = $1 AND o.disabled_at IS NULL
)
SELECT m.org,
       count(j.job_id) FILTER (WHERE j.status = 'CLAIMED'),
       count(j.job_id) FILTER (WHERE j.status = 'RUNNING'),
       count(j.job_id) FILTER (WHERE j.status = 'COMPLETED'),
       count(j.job_id) FILTER (WHERE j.status = 'FAILED'),
       (SELECT count(*) FROM subagents s WHERE s.org = m.org AND s.status IN ('running', 'cancelling')),
       greatest(max(j.updated_at), (SELECT max(updated_at) FROM subagents s WHERE s.org = m.org))
  FROM mine m LEFT JOIN mirror_jobs j ON j.org = m.org
 GROUP BY m.org
 ORDER BY m.org`, name)
	if err != nil {
		return nil, 0, fmt.Errorf("index for %s: %w", name, err)
	}
	entries, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (OrgEntry, error) {
		var e OrgEntry
		err := row.Scan(&e.Org, &e.Queued, &e.Running, &e.Completed, &e.Failed, &e.LiveSubagents, &e.LastActivityAt)
		return e, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("index for %s: %w", name, err)
	}
	// Every org the host knows of, from its own records, less the ones listed.
	if err := s.pool.QueryRow(ctx, `
SELECT count(*) FROM (SELECT org FROM mirror_jobs UNION SELECT org FROM subagents UNION SELECT org FROM operator_grants) k`).Scan(&others); err != nil {
		return nil, 0, fmt.Errorf("index for %s: %w", name, err)
	}
	others -= len(entries)
	return entries, others, nil
}
