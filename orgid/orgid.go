// Package orgid is the one home of what the host derives from an organization id: the id's
// rule (a path element, a container name, a metric label and a key field, so lower-case
// letters, digits and hyphens, 63 at most) and the keys minted per org from one secret
// without a table of keys: `<prefix><org>_<base64url(HMAC-SHA256(secret, purpose+org))>`
// (the gateway's and the control API's keys), and the raw MAC a dashboard verifies its
// assertions with. Each use has its own purpose string, so a key of one use never verifies
// as another's, even under the same secret.
package orgid

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Rule is the organization id's rule, as text for messages.
const Rule = `^[a-z0-9][a-z0-9-]{0,62}$`

var pattern = regexp.MustCompile(Rule)

// ErrInvalid is an organization id that does not match Rule.
var ErrInvalid = errors.New("organization id must match " + Rule)

// Valid reports whether org is a well-formed organization id.
func Valid(org string) bool { return pattern.MatchString(org) }

// Check is nil for a well-formed id and an error wrapping ErrInvalid that quotes it
// otherwise (cut to 70 bytes).
func Check(org string) error {
	if Valid(org) {
		return nil
	}
	if len(org) > 70 {
		org = org[:70] + "..."
	}
	return fmt.Errorf("%w: %q", ErrInvalid, org)
}

// MAC is HMAC-SHA256(secret, purpose+org).
func MAC(secret, purpose, org string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(purpose + org))
	return m.Sum(nil)
}

// Key is org's key for one use: prefix, org, an underscore and the base64url MAC of
// purpose+org under secret. Org ids hold no underscore, so the first one ends the org.
func Key(prefix, purpose, secret, org string) (string, error) {
	if err := Check(org); err != nil {
		return "", err
	}
	if secret == "" {
		return "", errors.New("the secret keys derive from is empty")
	}
	return prefix + org + "_" + base64.RawURLEncoding.EncodeToString(MAC(secret, purpose, org)), nil
}

// KeyOrg is the org a presented key of that use belongs to, or false when it is not a
// valid key under secret (compared in constant time).
func KeyOrg(prefix, purpose, secret, key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok || secret == "" {
		return "", false
	}
	org, mac, ok := strings.Cut(rest, "_")
	if !ok || !Valid(org) {
		return "", false
	}
	want := base64.RawURLEncoding.EncodeToString(MAC(secret, purpose, org))
	if subtle.ConstantTimeCompare([]byte(mac), []byte(want)) != 1 {
		return "", false
	}
	return org, true
}
