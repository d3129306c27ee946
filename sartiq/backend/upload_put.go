package backend

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"hermeshost/sartiq"
)

// putUpload stores the artifact of a presigned URL: once, before it expires, at most the
// declared size, with the declared content type. The key in the URL is the credential.
func (h *Handler) putUpload(w http.ResponseWriter, r *http.Request, c *call) error {
	hash := hashSecret(c.uploadKey)
	var contentType string
	var maxBytes int64
	var expires time.Time
	var uploaded *time.Time
	err := h.db.QueryRow(r.Context(), `SELECT content_type, max_bytes, expires_at, uploaded_at FROM uploads WHERE key_hash = $1`,
		hash).Scan(&contentType, &maxBytes, &expires, &uploaded)
	if errors.Is(err, pgx.ErrNoRows) {
		return notFound("no such upload")
	}
	if err != nil {
		return fmt.Errorf("read upload slot: %w", err)
	}
	switch {
	case !h.now().Before(expires):
		return failf(http.StatusGone, "upload_expired", "this upload URL has expired")
	case uploaded != nil:
		return conflict("already_uploaded", "this upload URL was used already")
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != contentType {
		return failf(http.StatusUnsupportedMediaType, "unsupported_media_type", "send Content-Type: %s, as presigned", contentType)
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBytes+1))
	if err != nil {
		return badRequest("could not read the upload")
	}
	if int64(len(data)) > maxBytes {
		return failf(http.StatusRequestEntityTooLarge, "body_too_large", "the upload is larger than the %d bytes presigned", maxBytes)
	}
	sum := sha256.Sum256(data)
	out := sartiq.Upload{Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	err = h.db.QueryRow(r.Context(), `
		UPDATE uploads SET data = $2, size = $3, sha256 = $4, uploaded_at = $5
		WHERE key_hash = $1 AND uploaded_at IS NULL AND expires_at > $5
		RETURNING filename`, hash, data, out.Size, out.SHA256, h.now()).Scan(&out.Filename)
	if errors.Is(err, pgx.ErrNoRows) {
		return conflict("already_uploaded", "this upload URL was used already")
	}
	if err != nil {
		return fmt.Errorf("store upload: %w", err)
	}
	return writeJSON(w, http.StatusCreated, out)
}
