package backend

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"time"

	"hermeshost/sartiq"
)

var (
	jobTypes    = set(sartiq.TypeProductIngest, sartiq.TypeGuidelinesExtraction)
	jobStatuses = set(sartiq.StatusQueued, sartiq.StatusClaimed, sartiq.StatusRunning, sartiq.StatusCompleted, sartiq.StatusFailed)
)

// listAgentJobs pages through one type's jobs, oldest first, by a keyset cursor.
func (h *Handler) listAgentJobs(w http.ResponseWriter, r *http.Request, c *call) error {
	q := r.URL.Query()
	typ := q.Get("type")
	if typ == "" {
		typ = sartiq.TypeProductIngest
	}
	if !jobTypes[typ] {
		return badRequest("type %q is not a job type", clip(typ))
	}
	var statuses []string
	if s := q.Get("status"); s != "" {
		for _, st := range strings.Split(s, ",") {
			if !jobStatuses[st] {
				return badRequest("status %q is not a job status", clip(st))
			}
			statuses = append(statuses, st)
		}
	}
	var org *string
	if o := q.Get("organization_id"); o != "" {
		if !orgPattern.MatchString(o) {
			return badRequest("organization_id %q is not valid", clip(o))
		}
		org = &o
	}
	limit, err := queryInt(r, "limit", 100, 500)
	if err != nil {
		return err
	}
	var afterAt *time.Time
	var afterID *string
	if cur := q.Get("cursor"); cur != "" {
		at, id, err := parseJobCursor(cur)
		if err != nil {
			return err
		}
		afterAt, afterID = &at, &id
	}
	rows, err := h.db.Query(r.Context(), `
		SELECT `+jobColumns+` FROM agent_jobs
		WHERE type = $1
		  AND ($2::text[] IS NULL OR status = ANY($2))
		  AND ($3::text IS NULL OR organization_id = $3)
		  AND ($4::timestamptz IS NULL OR (created_at, id) > ($4, $5::uuid))
		ORDER BY created_at, id
		LIMIT $6`, typ, statuses, org, afterAt, afterID, limit+1)
	if err != nil {
		return fmt.Errorf("list %s jobs: %w", typ, err)
	}
	defer rows.Close()
	page := sartiq.JobPage{Jobs: []sartiq.Job{}}
	for rows.Next() {
		j, err := h.scanJob(r, rows)
		if err != nil {
			return fmt.Errorf("list %s jobs: %w", typ, err)
		}
		page.Jobs = append(page.Jobs, j)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list %s jobs: %w", typ, err)
	}
	if len(page.Jobs) > limit {
		page.Jobs = page.Jobs[:limit]
		last := page.Jobs[limit-1]
		page.NextCursor = jobCursor(last.CreatedAt, last.ID)
	}
	return writeJSON(w, http.StatusOK, page)
}

// A job cursor is the last job's creation time and id, opaque to clients.
func jobCursor(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(at.UTC().Format(time.RFC3339Nano) + "|" + id))
}

func parseJobCursor(s string) (time.Time, string, error) {
	bad := badRequest("cursor is not one this server handed out")
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return time.Time{}, "", bad
	}
	at, id, ok := strings.Cut(string(raw), "|")
	if !ok || !uuidPattern.MatchString(id) {
		return time.Time{}, "", bad
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return time.Time{}, "", bad
	}
	return t, id, nil
}
