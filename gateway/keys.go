package gateway

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"strings"

	"hermeshost/orgid"
)

// keyPrefix starts every per-org key, so a leaked key is recognisable in a scan.
const keyPrefix = "hgw_"

// hostCaller is the caller name of the internal key. Its leading underscore is outside the
// org id alphabet, so no org can be mistaken for the host.
const hostCaller = "_host"

// keyPurpose labels the MAC input of a gateway key (orgid.Key).
const keyPurpose = "org:"

// OrgKey is the gateway key of org's containers: hgw_<org>_<base64url(HMAC-SHA256(secret,
// "org:"+org))> (orgid.Key). The dispatcher mints it when it starts an org's container; the
// gateway recomputes it on each request, so it keeps no table of keys.
func OrgKey(secret, org string) (string, error) {
	k, err := orgid.Key(keyPrefix, keyPurpose, secret, org)
	if err != nil {
		return "", fmt.Errorf("gateway key: %w", err)
	}
	return k, nil
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
	org, ok := orgid.KeyOrg(keyPrefix, keyPurpose, k.secret, token)
	if !ok {
		return "", errBadKey
	}
	return org, nil
}
