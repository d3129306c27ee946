package control

import (
	"regexp"
	"strings"
	"testing"

	"hermeshost/gateway"
)

func TestKeyIsPerOrgAndVerifiesOnlyUnderItsSecret(t *testing.T) {
	a, err := Key(testSecret, orgA)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^hck_acme_[A-Za-z0-9_-]{43}$`).MatchString(a) {
		t.Fatalf("key format: %s", a)
	}
	if org, ok := keyOrg(testSecret, a); !ok || org != orgA {
		t.Fatalf("own key: %q %v", org, ok)
	}
	b, _ := Key(testSecret, orgB)
	if a == b || strings.TrimPrefix(b, "hck_globex_") == strings.TrimPrefix(a, "hck_acme_") {
		t.Fatalf("two orgs share a MAC: %s %s", a, b)
	}
	if _, ok := keyOrg("another-secret", a); ok {
		t.Fatal("a key verified under another secret")
	}
	if _, ok := keyOrg("", a); ok {
		t.Fatal("a key verified under an empty secret")
	}
	if again, _ := Key(testSecret, orgA); again != a {
		t.Fatal("the key is not deterministic")
	}
}

func TestKeyRefusesEmptySecretAndBadOrgs(t *testing.T) {
	if _, err := Key("", orgA); err == nil {
		t.Fatal("empty secret minted a key")
	}
	for _, org := range []string{"", "Acme", "ac.me", "ac_me", "-acme", "../x", strings.Repeat("a", 64)} {
		if k, err := Key(testSecret, org); err == nil {
			t.Errorf("org %q got key %s", org, k)
		}
	}
	if _, err := Key(testSecret, strings.Repeat("a", 63)); err != nil {
		t.Errorf("a 63-character org: %v", err)
	}
}

func TestGatewayKeyNeverVerifiesAsControlKey(t *testing.T) {
	gw, err := gateway.OrgKey(testSecret.Reveal(), orgA)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := keyOrg(testSecret, gw); ok {
		t.Fatal("a gateway key verified as a control key")
	}
	// Even with the control prefix, the gateway's MAC is over a different label.
	if _, ok := keyOrg(testSecret, "hck_"+strings.TrimPrefix(gw, "hgw_")); ok {
		t.Fatal("the gateway's MAC verified under the control label")
	}
}
