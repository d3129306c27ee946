package control

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"hermeshost/gateway"
	"hermeshost/service"
)

// keyPrefix starts every control key, so a leaked one is recognisable in a scan.
const keyPrefix = "hck_"

// keyPurpose labels the MAC input. The gateway MACs "org:"+org; this label differs, so a
// gateway key never verifies as a control key even under the same secret.
const keyPurpose = "hermes-control:"

// Key is org's control-API key: hck_<org>_<base64url(HMAC-SHA256(secret,
// "hermes-control:"+org))>. The dispatcher mints it when it starts the org's processes; the
// server recomputes it on each request, so it keeps no table of keys.
func Key(secret service.Secret, org string) (string, error) {
	if !gateway.ValidOrg(org) {
		return "", fmt.Errorf("control key for %q: %w", org, gateway.ErrBadOrg)
	}
	if secret == "" {
		return "", errors.New("control key: the control secret is empty")
	}
	return keyPrefix + org + "_" + keyMAC(secret, org), nil
}

func keyMAC(secret service.Secret, org string) string {
	m := hmac.New(sha256.New, []byte(secret.Reveal()))
	m.Write([]byte(keyPurpose + org))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// keyOrg is the org a presented key belongs to, or false when it is not a valid key under
// secret.
func keyOrg(secret service.Secret, key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, keyPrefix)
	if !ok || secret == "" {
		return "", false
	}
	// Org ids have no underscore, so the first one ends the org even though the base64url
	// MAC may contain more.
	org, mac, ok := strings.Cut(rest, "_")
	if !ok || !gateway.ValidOrg(org) {
		return "", false
	}
	if subtle.ConstantTimeCompare([]byte(mac), []byte(keyMAC(secret, org))) != 1 {
		return "", false
	}
	return org, true
}
