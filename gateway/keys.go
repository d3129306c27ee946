package gateway

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

// keyPrefix starts every per-org key, so a leaked key is recognisable in a scan.
const keyPrefix = "hgw_"

// hostCaller is the caller name of the internal key. Its leading underscore is outside the
// org id alphabet, so no org can be mistaken for the host.
const hostCaller = "_host"

var orgPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ValidOrg reports whether org is a well-formed organization id. Only such ids get keys
// and metric labels, which keeps both bounded and free of separators.
func ValidOrg(org string) bool { return orgPattern.MatchString(org) }

// ErrBadOrg is an organization id that does not match ^[a-z0-9][a-z0-9-]{0,62}$.
var ErrBadOrg = errors.New("organization id must match ^[a-z0-9][a-z0-9-]{0,62}$")

// OrgKey is the gateway key of org's containers: hgw_<org>_<base64url(HMAC-SHA256(secret,
// "org:"+org))>. The dispatcher mints it when it starts an org's container; the gateway
// recomputes it on each request, so it keeps no table of keys.
func OrgKey(secret, org string) (string, error) {
	if !ValidOrg(org) {
		return "", fmt.Errorf("gateway key for %q: %w", org, ErrBadOrg)
	}
	if secret == "" {
		return "", errors.New("gateway key: the gateway secret is empty")
	}
	return keyPrefix + org + "_" + orgMAC(secret, org), nil
}

func orgMAC(secret, org string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("org:" + org))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// errBadKey covers every unusable Authorization header; the client learns only that.
var errBadKey = errors.New("invalid gateway key")

// keyring checks presented keys: per-org keys against the secret, and the host's internal key.
type keyring struct {
	secret   string
	internal string
}

// caller names who presented the Authorization header value: an org id or hostCaller.
func (k keyring) caller(authorization string) (string, error) {
	scheme, token, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", errBadKey
	}
	if k.internal != "" && subtle.ConstantTimeCompare([]byte(token), []byte(k.internal)) == 1 {
		return hostCaller, nil
	}
	rest, ok := strings.CutPrefix(token, keyPrefix)
	if !ok || k.secret == "" {
		return "", errBadKey
	}
	// Org ids have no underscore, so the first one ends the org even though the
	// base64url MAC may contain more.
	org, mac, ok := strings.Cut(rest, "_")
	if !ok || !ValidOrg(org) {
		return "", errBadKey
	}
	if subtle.ConstantTimeCompare([]byte(mac), []byte(orgMAC(k.secret, org))) != 1 {
		return "", errBadKey
	}
	return org, nil
}
