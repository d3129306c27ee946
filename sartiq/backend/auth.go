package backend

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
)

// call is one authorized API request: the operation, who makes it, and the validated path.
type call struct {
	op string
	pathParams
	// bot is true for the bot token; otherwise token is the job token presented.
	bot   bool
	token *jobToken
}

// jobToken is a presented job token as the database knows it.
type jobToken struct {
	hash       []byte
	jobID      string
	org        string
	capability string
	attempt    int
	live       bool
	expiresAt  time.Time
}

// endpoint is a handler of one operation.
type endpoint func(w http.ResponseWriter, r *http.Request, c *call) error

// api registers an operation behind the token gate.
func (h *Handler) api(r chi.Router, method, pattern, op string, fn endpoint) {
	h.register(r, method, pattern, op, fn, true)
}

// public registers an operation that needs no token (the document; presigned uploads,
// whose URL is the credential).
func (h *Handler) public(r chi.Router, method, pattern, op string, fn endpoint) {
	h.register(r, method, pattern, op, fn, false)
}

func (h *Handler) register(r chi.Router, method, pattern, op string, fn endpoint, gated bool) {
	h.operations[method+" "+pattern] = op
	r.Method(method, pattern, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		c, err := h.gate(req, op, gated)
		if err == nil {
			err = fn(w, req, c)
		}
		if err != nil {
			h.writeError(w, req, op, err)
		}
	}))
}

// gate authenticates the request, validates its path parameters and decides, by the
// allowlist and the token's job and organization, whether it may proceed.
func (h *Handler) gate(r *http.Request, op string, gated bool) (*call, error) {
	c := &call{op: op}
	if gated {
		if err := h.authenticate(r, c); err != nil {
			return nil, err
		}
	}
	if rc := chi.RouteContext(r.Context()); rc != nil {
		for i, name := range rc.URLParams.Keys {
			if name == "*" {
				continue
			}
			if err := c.pathParams.set(name, rc.URLParams.Values[i]); err != nil {
				return nil, err
			}
		}
	}
	if !gated {
		return c, nil
	}
	if c.bot {
		if !botOperations[op] {
			return nil, h.deny("not_allowed", "the bot token may not call %s", op)
		}
		return c, nil
	}
	t := c.token
	if !jobTokenAllowlist[t.capability][op] {
		return nil, h.deny("not_allowed", "a %s job token may not call %s", t.capability, op)
	}
	if c.jobID != "" && c.jobID != t.jobID {
		return nil, h.deny("other_job", "this job token belongs to another job")
	}
	if c.org != "" && c.org != t.org {
		return nil, h.deny("other_org", "this job token belongs to another organization")
	}
	return c, nil
}

func (h *Handler) deny(reason, format string, a ...any) *apiError {
	h.metrics.denials.WithLabelValues(reason).Inc()
	status := http.StatusForbidden
	switch reason {
	case "missing_token", "invalid_token", "token_expired":
		status = http.StatusUnauthorized
	case "token_revoked":
		status = http.StatusConflict
	}
	return failf(status, reason, format, a...)
}

// authenticate reads the bearer token: the bot token, or a job token known to the
// database. A superseded token is 409 token_revoked (the worker must stop), an expired one 401.
func (h *Handler) authenticate(r *http.Request, c *call) error {
	raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	raw = strings.TrimSpace(raw)
	if !ok || raw == "" {
		return h.deny("missing_token", "send Authorization: Bearer <token>")
	}
	presented := sha256.Sum256([]byte(raw))
	bot := sha256.Sum256([]byte(h.cfg.BotToken.Reveal()))
	if subtle.ConstantTimeCompare(presented[:], bot[:]) == 1 {
		c.bot = true
		return nil
	}
	t, err := h.lookupToken(r.Context(), presented[:])
	if errors.Is(err, pgx.ErrNoRows) {
		return h.deny("invalid_token", "the token is not valid")
	}
	if err != nil {
		return fmt.Errorf("look up job token: %w", err)
	}
	if !t.live {
		return h.deny("token_revoked", "this job token was revoked; stop working on the job")
	}
	if !h.now().Before(t.expiresAt) {
		return h.deny("token_expired", "this job token has expired")
	}
	c.token = t
	return nil
}

func (h *Handler) lookupToken(ctx context.Context, hash []byte) (*jobToken, error) {
	t := &jobToken{hash: hash}
	var expires *time.Time
	err := h.db.QueryRow(ctx, `
		SELECT t.job_id::text, t.organization_id, t.capability, t.attempt,
		       j.token_hash IS NOT DISTINCT FROM t.hash, j.token_expires_at
		FROM job_tokens t JOIN agent_jobs j ON j.id = t.job_id
		WHERE t.hash = $1`, hash).Scan(&t.jobID, &t.org, &t.capability, &t.attempt, &t.live, &expires)
	if err != nil {
		return nil, err
	}
	if expires != nil {
		t.expiresAt = *expires
	}
	return t, nil
}

// newSecret is a random credential (32 bytes, base64url) and its SHA-256, which is all
// the database keeps.
func newSecret() (string, []byte, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", nil, fmt.Errorf("random token: %w", err)
	}
	s := base64.RawURLEncoding.EncodeToString(b[:])
	sum := sha256.Sum256([]byte(s))
	return s, sum[:], nil
}

func hashSecret(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

func routePattern(r *http.Request) string {
	if rc := chi.RouteContext(r.Context()); rc != nil {
		return rc.RoutePattern()
	}
	return ""
}
