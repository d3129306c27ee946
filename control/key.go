package control

import (
	"fmt"

	"hermeshost/orgid"
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
	k, err := orgid.Key(keyPrefix, keyPurpose, secret.Reveal(), org)
	if err != nil {
		return "", fmt.Errorf("control key: %w", err)
	}
	return k, nil
}

// keyOrg is the org a presented key belongs to, or false when it is not a valid key under
// secret.
func keyOrg(secret service.Secret, key string) (string, bool) {
	return orgid.KeyOrg(keyPrefix, keyPurpose, secret.Reveal(), key)
}
