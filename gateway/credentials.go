package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// credentialsVersion is the auth.json format this code reads and writes.
const credentialsVersion = 1

// Credentials is auth.json: the gateway's one OAuth login.
//
//	{"version":1,"identity":"user-123","access_token":"...","refresh_token":"...",
//	 "expires_at":"2026-01-02T15:04:05Z","updated_at":"2026-01-02T14:04:05Z"}
//
// Identity is the id token's subject: the account the login belongs to. A refresh or a
// new login for another identity is refused, so nothing silently swaps accounts.
type Credentials struct {
	Version      int       `json:"version"`
	Identity     string    `json:"identity"`
	AccessToken  string    `json:"access_token,omitempty"`
	RefreshToken string    `json:"refresh_token"`
	ExpiresAt    time.Time `json:"expires_at,omitzero"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// ErrInvalidCredentials is an auth.json that parses but cannot be a login.
var ErrInvalidCredentials = errors.New("invalid gateway credentials")

// Validate rejects a file that parses but is not a usable login, so a half-written or
// hand-edited auth.json is a loud error rather than "not logged in".
func (c Credentials) Validate() error {
	switch {
	case c.Version != credentialsVersion:
		return fmt.Errorf("%w: version %d, want %d", ErrInvalidCredentials, c.Version, credentialsVersion)
	case c.Identity == "":
		return fmt.Errorf("%w: no identity", ErrInvalidCredentials)
	case c.RefreshToken == "":
		return fmt.Errorf("%w: no refresh token", ErrInvalidCredentials)
	}
	return nil
}

// fresh reports whether the access token can still be used at now, leaving a margin so a
// token does not expire on its way to the provider. A zero expiry means the provider did
// not say; the token is then used until the provider rejects it.
func (c Credentials) fresh(now time.Time) bool {
	return c.AccessToken != "" && (c.ExpiresAt.IsZero() || now.Add(expiryMargin).Before(c.ExpiresAt))
}

const expiryMargin = 30 * time.Second

// String keeps tokens out of anything that formats Credentials with %v.
func (c Credentials) String() string {
	return fmt.Sprintf("gateway login of %q (access token expires %s)", c.Identity, c.ExpiresAt.Format(time.RFC3339))
}

// GoString masks %#v too.
func (c Credentials) GoString() string { return c.String() }

// LogValue logs who and until when, never a token.
func (c Credentials) LogValue() slog.Value {
	return slog.GroupValue(slog.String("identity", c.Identity), slog.Time("expires_at", c.ExpiresAt))
}
