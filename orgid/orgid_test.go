package orgid

import (
	"errors"
	"strings"
	"testing"
)

func TestTheRule(t *testing.T) {
	for _, ok := range []string{"acme", "a", "0-9", strings.Repeat("a", 63)} {
		if !Valid(ok) || Check(ok) != nil {
			t.Errorf("%q refused", ok)
		}
	}
	for _, bad := range []string{"", "-acme", "Acme", "ac_me", "ac.me", "a/b", strings.Repeat("a", 64), "acme\n"} {
		if Valid(bad) || !errors.Is(Check(bad), ErrInvalid) {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A key names its org, verifies under its secret and use only, and refuses tampering.
func TestKeysVerifyForTheirOrgUseAndSecretOnly(t *testing.T) {
	k, err := Key("hx_", "use-a:", "secret-1", "acme")
	if err != nil || !strings.HasPrefix(k, "hx_acme_") {
		t.Fatalf("%q %v", k, err)
	}
	if org, ok := KeyOrg("hx_", "use-a:", "secret-1", k); !ok || org != "acme" {
		t.Fatalf("own key: %q %v", org, ok)
	}
	for name, bad := range map[string][4]string{
		"other use":    {"hx_", "use-b:", "secret-1", k},
		"other secret": {"hx_", "use-a:", "secret-2", k},
		"other prefix": {"hy_", "use-a:", "secret-1", k},
		"other org":    {"hx_", "use-a:", "secret-1", strings.Replace(k, "acme", "acmf", 1)},
		"no secret":    {"hx_", "use-a:", "", k},
		"cut":          {"hx_", "use-a:", "secret-1", k[:len(k)-1]},
	} {
		if _, ok := KeyOrg(bad[0], bad[1], bad[2], bad[3]); ok {
			t.Errorf("%s: verified", name)
		}
	}
	if _, err := Key("hx_", "use-a:", "", "acme"); err == nil {
		t.Error("a key under an empty secret")
	}
	if _, err := Key("hx_", "use-a:", "s", "ac_me"); !errors.Is(err, ErrInvalid) {
		t.Errorf("a key for a bad id: %v", err)
	}
}
