package backend

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"

	"hermeshost/sartiq"
)

// presignUpload hands out a short-lived URL, served by this backend, that accepts one PUT
// of the declared artifact. The slot belongs to the token's job and organization.
func (h *Handler) presignUpload(w http.ResponseWriter, r *http.Request, c *call) error {
	var req sartiq.PresignRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if err := validatePresign(&req); err != nil {
		return err
	}
	key, hash, err := newSecret()
	if err != nil {
		return err
	}
	now := h.now()
	expires := now.Add(uploadTTL)
	var filename string
	err = h.db.QueryRow(r.Context(), `
		WITH j AS (
			SELECT id, organization_id FROM agent_jobs
			WHERE id = $1 AND token_hash = $2 AND token_expires_at > $3 AND status IN ('CLAIMED', 'RUNNING')
			FOR SHARE
		)
		INSERT INTO uploads (key_hash, organization_id, job_id, filename, content_type, max_bytes, expires_at)
		SELECT $4, organization_id, id, $5, $6, $7, $8 FROM j
		RETURNING filename`,
		c.token.jobID, c.token.hash, now, hash, req.Filename, req.ContentType, req.Size, expires).Scan(&filename)
	if errors.Is(err, pgx.ErrNoRows) {
		return h.refusal(r.Context(), c, "upload for")
	}
	if err != nil {
		return fmt.Errorf("presign an upload for job %s: %w", c.token.jobID, err)
	}
	return writeJSON(w, http.StatusCreated, sartiq.Presigned{
		URL:       h.baseURL(r) + "/uploads/" + key,
		Method:    http.MethodPut,
		Headers:   map[string]string{"Content-Type": req.ContentType},
		MaxBytes:  req.Size,
		ExpiresAt: expires,
	})
}
