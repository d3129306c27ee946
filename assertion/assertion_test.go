package assertion

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

const secret = "test-dashboard-secret-0123456789"

func verifier(t *testing.T, org string, now func() time.Time) *Verifier {
	t.Helper()
	key, err := OrgKey(secret, org)
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerifier(org, key, now)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestAnAssertionIsGoodForItsOrgOnlyAndBriefly(t *testing.T) {
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return at }
	s, err := NewSigner(secret, clock)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := s.Sign("ada", "acme")
	if err != nil {
		t.Fatal(err)
	}
	c, err := verifier(t, "acme", clock).Verify(tok)
	if err != nil || c.Operator != "ada" || c.Org != "acme" || !c.Expires.Equal(at.Add(TTL)) {
		t.Fatalf("claims %+v, %v", c, err)
	}
	// Another org's dashboard has another key: the signature does not verify there.
	if _, err := verifier(t, "globex", clock).Verify(tok); !errors.Is(err, ErrInvalid) {
		t.Fatalf("globex verified acme's assertion: %v", err)
	}
	later := func() time.Time { return at.Add(TTL) }
	if _, err := verifier(t, "acme", later).Verify(tok); !errors.Is(err, ErrExpired) {
		t.Fatalf("an expired assertion: %v", err)
	}
}

func TestForgedAssertionsAreRefused(t *testing.T) {
	s, _ := NewSigner(secret, nil)
	tok, _ := s.Sign("ada", "acme")
	v := verifier(t, "acme", nil)
	p, sig, _ := strings.Cut(tok, ".")
	other, _ := NewSigner("another-secret-0123456789abcdef", nil)
	forged, _ := other.Sign("ada", "acme")
	for name, bad := range map[string]string{
		"empty":          "",
		"no signature":   p,
		"flipped sig":    p + "." + strings.ToUpper(sig),
		"other secret":   forged,
		"payload edited": p[:len(p)-1] + string("AB"[len(p)%2]) + "." + sig,
		"garbage":        "not.an.assertion",
	} {
		if _, err := v.Verify(bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A dashboard holds its own org's key, so it could mint assertions with it, but only
	// ones its own org's dashboard accepts: a token naming another org is refused.
	acmeKey, _ := OrgKey(secret, "acme")
	other64 := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"v":1,"u":"ada","o":"globex","e":%d}`, time.Now().Add(time.Minute).Unix())))
	if _, err := v.Verify(other64 + "." + mac(acmeKey, other64)); !errors.Is(err, ErrWrongOrg) {
		t.Fatalf("another org's claim under acme's key: %v", err)
	}
	far := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"v":1,"u":"ada","o":"acme","e":%d}`, time.Now().Add(time.Hour).Unix())))
	if _, err := v.Verify(far + "." + mac(acmeKey, far)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("an assertion good for an hour: %v", err)
	}
	if _, err := NewVerifier("acme", "zz", nil); err == nil {
		t.Fatal("a key that is not hex was taken")
	}
}

func TestTheSignerRefusesBadInput(t *testing.T) {
	if _, err := NewSigner("short", nil); err == nil {
		t.Fatal("a short secret was taken")
	}
	s, _ := NewSigner(secret, nil)
	for _, c := range [][2]string{{"", "acme"}, {"ada", "../x"}, {"ada", ""}} {
		if _, err := s.Sign(c[0], c[1]); err == nil {
			t.Errorf("signed %q for %q", c[0], c[1])
		}
	}
}
