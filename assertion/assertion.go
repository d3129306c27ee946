// Package assertion is how the launcher vouches for an operator to one org's dashboard. The
// launcher checks the login and the grant, then adds to the proxied request a short-lived
// assertion (operator, org, expiry) signed with that org's key; the dashboard trusts nothing
// else (no cookie, no Authorization reaches it).
//
// Each org's key derives from the secret the launcher and the dispatcher share
// (DASHBOARD_SECRET): the launcher signs for any org, the dispatcher hands a dashboard its own
// org's key on stdin, and no dashboard can verify, or mint, another org's assertion.
package assertion

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"hermeshost/orgid"
)

// Header carries the assertion on a proxied request.
const Header = "X-Hermes-Assertion"

// TTL is how long an assertion is good for: one request's trip through the proxy.
const TTL = time.Minute

// maxAhead bounds an expiry's distance from now, so that a leaked signing path cannot mint
// long-lived assertions and clocks may differ a little.
const maxAhead = 5 * time.Minute

// Errors a dashboard tells apart (all are refusals).
var (
	ErrMissing  = errors.New("no assertion: the dashboard is reached only through the launcher")
	ErrInvalid  = errors.New("assertion is not valid")
	ErrExpired  = errors.New("assertion has expired")
	ErrWrongOrg = errors.New("assertion is for another organization")
)

// OrgKey is org's verification key, hex, derived from the shared secret.
func OrgKey(secret, org string) (string, error) {
	if secret == "" {
		return "", errors.New("dashboard assertion key: the secret is empty")
	}
	if err := orgid.Check(org); err != nil {
		return "", fmt.Errorf("dashboard assertion key: %w", err)
	}
	return hex.EncodeToString(orgid.MAC(secret, "hermes-dashboard-assertion/v1/", org)), nil
}

// Claims is what an assertion says.
type Claims struct {
	Operator string    `json:"u"`
	Org      string    `json:"o"`
	Expires  time.Time `json:"-"`
}

type wire struct {
	Version  int    `json:"v"`
	Operator string `json:"u"`
	Org      string `json:"o"`
	Expires  int64  `json:"e"` // Unix seconds
}

// Signer makes assertions for any org (the launcher's side).
type Signer struct {
	secret string
	now    func() time.Time
}

// NewSigner signs with keys derived from secret; now is the clock (nil: time.Now).
func NewSigner(secret string, now func() time.Time) (*Signer, error) {
	if len(secret) < 16 {
		return nil, errors.New("dashboard assertion secret: want at least 16 characters")
	}
	if now == nil {
		now = time.Now
	}
	return &Signer{secret: secret, now: now}, nil
}

// Sign is an assertion that operator may use org's dashboard for the next TTL.
func (s *Signer) Sign(operator, org string) (string, error) {
	key, err := OrgKey(s.secret, org)
	if err != nil {
		return "", err
	}
	if operator == "" {
		return "", errors.New("dashboard assertion: no operator")
	}
	payload, _ := json.Marshal(wire{Version: 1, Operator: operator, Org: org, Expires: s.now().Add(TTL).Unix()})
	p := base64.RawURLEncoding.EncodeToString(payload)
	return p + "." + mac(key, p), nil
}

func mac(hexKey, payload string) string {
	key, _ := hex.DecodeString(hexKey)
	m := hmac.New(sha256.New, key)
	m.Write([]byte(payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Verifier checks assertions for one org (a dashboard's side).
type Verifier struct {
	org string
	key string
	now func() time.Time
}

// NewVerifier checks assertions for org with its hex key (OrgKey); now is the clock.
func NewVerifier(org, hexKey string, now func() time.Time) (*Verifier, error) {
	if !orgid.Valid(org) {
		return nil, fmt.Errorf("dashboard assertion: invalid organization id %q", org)
	}
	if b, err := hex.DecodeString(hexKey); err != nil || len(b) != sha256.Size {
		return nil, errors.New("dashboard assertion key: want 64 hex digits")
	}
	if now == nil {
		now = time.Now
	}
	return &Verifier{org: org, key: hexKey, now: now}, nil
}

// Verify checks token and returns what it says.
func (v *Verifier) Verify(token string) (Claims, error) {
	if token == "" {
		return Claims{}, ErrMissing
	}
	p, sig, ok := strings.Cut(token, ".")
	if !ok || len(token) > 4096 || !hmac.Equal([]byte(sig), []byte(mac(v.key, p))) {
		return Claims{}, ErrInvalid
	}
	raw, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return Claims{}, ErrInvalid
	}
	var w wire
	if err := json.Unmarshal(raw, &w); err != nil || w.Version != 1 || w.Operator == "" {
		return Claims{}, ErrInvalid
	}
	if w.Org != v.org {
		return Claims{}, ErrWrongOrg
	}
	exp := time.Unix(w.Expires, 0)
	now := v.now()
	switch {
	case !now.Before(exp):
		return Claims{}, ErrExpired
	case exp.Sub(now) > maxAhead:
		return Claims{}, ErrInvalid
	}
	return Claims{Operator: w.Operator, Org: w.Org, Expires: exp}, nil
}
