package backend

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/jackc/pgx/v5"

	"hermeshost/sartiq"
)

// proposeGuidelinesSQL stores one category's guidelines for human review, only while the
// token is the RUNNING job's live one. Writing a category this job wrote before replaces
// that proposal and bumps its revision, so a resumed or re-claimed run is idempotent.
const proposeGuidelinesSQL = `
	WITH j AS (
		SELECT id, attempt, organization_id FROM agent_jobs
		WHERE id = $1 AND token_hash = $2 AND token_expires_at > $3 AND status = 'RUNNING'
		FOR SHARE
	), p AS (
		INSERT INTO guidelines_proposals (organization_id, job_id, attempt, category, content, sources, created_at, updated_at)
		SELECT organization_id, id, attempt, $4, $5, $6::jsonb, $3, $3 FROM j
		ON CONFLICT (job_id, category) DO UPDATE
		SET content = EXCLUDED.content, sources = EXCLUDED.sources, attempt = EXCLUDED.attempt,
		    status = 'pending_review', revision = guidelines_proposals.revision + 1, updated_at = EXCLUDED.updated_at
		RETURNING id::text, organization_id, job_id::text, category, status, revision, updated_at
	), e AS (
		INSERT INTO agent_job_events (job_id, attempt, kind, message, data, at)
		SELECT j.id, j.attempt, 'proposal', 'proposed guidelines for ' || p.category,
		       jsonb_build_object('surface', 'guidelines', 'category', p.category, 'revision', p.revision), $3
		FROM j, p
	)
	SELECT * FROM p`

// proposeGuidelines is guidelines_extraction's write surface, one category at a time; the
// category must be one the job's manifest names.
func (h *Handler) proposeGuidelines(w http.ResponseWriter, r *http.Request, c *call) error {
	var req sartiq.GuidelinesRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if err := validateGuidelines(&req); err != nil {
		return err
	}
	var categories []string
	if err := h.db.QueryRow(r.Context(), `SELECT coalesce(manifest->'categories', '[]') FROM agent_jobs WHERE id = $1`,
		c.token.jobID).Scan(&categories); err != nil {
		return fmt.Errorf("read categories of job %s: %w", c.token.jobID, err)
	}
	if !slices.Contains(categories, c.category) {
		return failf(http.StatusUnprocessableEntity, "unknown_category", "category %q is not one this job's manifest names", c.category)
	}
	sources := req.Sources
	if sources == nil {
		sources = []string{}
	}
	var p sartiq.GuidelinesProposal
	err := h.db.QueryRow(r.Context(), proposeGuidelinesSQL, c.token.jobID, c.token.hash, h.now(), c.category, req.Content, sources).
		Scan(&p.ID, &p.OrganizationID, &p.JobID, &p.Category, &p.Status, &p.Revision, &p.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return h.refusal(r.Context(), c, "propose guidelines for")
	}
	if err != nil {
		return fmt.Errorf("propose guidelines %s for job %s: %w", c.category, c.token.jobID, err)
	}
	return writeJSON(w, http.StatusOK, sartiq.GuidelinesProposalResponse{Proposal: p})
}
