package backend

import (
	"encoding/json"
	"fmt"
	"net/http"

	"hermeshost/sartiq"
)

// proposeProductsSQL stores a batch of product proposals for human review, only while
// the token is the RUNNING job's live one (the row lock orders it against a re-claim). A
// SKU this job proposed before is replaced and its revision bumped. The proposal event
// goes into the job's log in the same statement.
const proposeProductsSQL = `
	WITH j AS (
		SELECT id, attempt, organization_id FROM agent_jobs
		WHERE id = $1 AND token_hash = $2 AND token_expires_at > $3 AND status = 'RUNNING'
		FOR SHARE
	), p AS (
		INSERT INTO product_proposals (organization_id, job_id, attempt, sku, name, description, attributes, created_at, updated_at)
		SELECT j.organization_id, j.id, j.attempt, x.sku, x.name, coalesce(x.description, ''), coalesce(x.attributes, '{}'), $3, $3
		FROM j, jsonb_to_recordset($4::jsonb) AS x(sku text, name text, description text, attributes jsonb)
		ON CONFLICT (job_id, sku) DO UPDATE
		SET name = EXCLUDED.name, description = EXCLUDED.description, attributes = EXCLUDED.attributes,
		    attempt = EXCLUDED.attempt, status = 'pending_review', revision = product_proposals.revision + 1,
		    updated_at = EXCLUDED.updated_at
		RETURNING id::text, organization_id, job_id::text, sku, name, status, revision, updated_at
	), e AS (
		INSERT INTO agent_job_events (job_id, attempt, kind, message, data, at)
		SELECT j.id, j.attempt, 'proposal', 'proposed products',
		       jsonb_build_object('surface', 'products', 'skus', (SELECT jsonb_agg(sku ORDER BY sku) FROM p)), $3
		FROM j
	)
	SELECT * FROM p ORDER BY sku`

// proposeProducts is product_ingest's write surface.
func (h *Handler) proposeProducts(w http.ResponseWriter, r *http.Request, c *call) error {
	var req sartiq.ProductProposalsRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if err := validateProductProposals(&req); err != nil {
		return err
	}
	batch, err := json.Marshal(req.Products)
	if err != nil {
		return fmt.Errorf("propose products for job %s: %w", c.token.jobID, err)
	}
	rows, err := h.db.Query(r.Context(), proposeProductsSQL, c.token.jobID, c.token.hash, h.now(), string(batch))
	if err != nil {
		return fmt.Errorf("propose products for job %s: %w", c.token.jobID, err)
	}
	defer rows.Close()
	out := sartiq.ProductProposals{Proposals: []sartiq.ProductProposal{}}
	for rows.Next() {
		var p sartiq.ProductProposal
		if err := rows.Scan(&p.ID, &p.OrganizationID, &p.JobID, &p.SKU, &p.Name, &p.Status, &p.Revision, &p.UpdatedAt); err != nil {
			return fmt.Errorf("propose products for job %s: %w", c.token.jobID, err)
		}
		out.Proposals = append(out.Proposals, p)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("propose products for job %s: %w", c.token.jobID, err)
	}
	if len(out.Proposals) == 0 {
		return h.refusal(r.Context(), c, "propose products for")
	}
	return writeJSON(w, http.StatusCreated, out)
}
