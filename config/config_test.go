package config

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestDefaultsApplyWhenUnsetOrBlank(t *testing.T) {
	env := FromMap(map[string]string{StaleAfter.Name: "  "})
	if got := env.Duration(StaleAfter); got != 45*time.Second {
		t.Fatalf("STALE_AFTER default: got %v, want 45s", got)
	}
	if got := env.Int(MaxAttempts); got != 3 {
		t.Fatalf("MAX_ATTEMPTS default: got %d", got)
	}
	if env.Bool(ClaimEnabled) {
		t.Fatal("CLAIM_ENABLED must default to false")
	}
	if err := env.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestBadValuesNameTheVariableOnOneLine(t *testing.T) {
	cases := []struct {
		v    Var
		raw  string
		read func(*Env, Var)
		want string
	}{
		{StaleAfter, "abc", func(e *Env, v Var) { e.Duration(v) }, `config: STALE_AFTER: "abc" is not a positive duration`},
		{StaleAfter, "-5s", func(e *Env, v Var) { e.Duration(v) }, `STALE_AFTER: "-5s" is not a positive duration`},
		{MaxAttempts, "three", func(e *Env, v Var) { e.Int(v) }, `MAX_ATTEMPTS: "three" is not a whole number`},
		{MaxAttempts, "0", func(e *Env, v Var) { e.Int(v) }, `MAX_ATTEMPTS: "0" is not a whole number of at least 1`},
		{ClaimEnabled, "maybe", func(e *Env, v Var) { e.Bool(v) }, `CLAIM_ENABLED: "maybe" is not true or false`},
		{SartiqAPIURL, "localhost:8080", func(e *Env, v Var) { e.URL(v) }, `SARTIQ_API_URL: "localhost:8080" is not an absolute http or https URL`},
		{DatabaseURL, "", func(e *Env, v Var) { e.Required(v) }, `DATABASE_URL: is required and not set`},
	}
	for _, c := range cases {
		env := FromMap(map[string]string{c.v.Name: c.raw})
		c.read(env, c.v)
		err := env.Err()
		var ce *Error
		if !errors.As(err, &ce) || ce.Var != c.v.Name {
			t.Fatalf("%s=%q: want a config error naming it, got %v", c.v.Name, c.raw, err)
		}
		if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s=%q: error %q does not read %q on one line", c.v.Name, c.raw, err, c.want)
		}
	}
}

func TestSecretValuesAreNotEchoed(t *testing.T) {
	secret := Var{Name: "SOME_TOKEN", Secret: true}
	env := FromMap(map[string]string{"SOME_TOKEN": "hunter2-is-secret"})
	env.Duration(secret)
	if err := env.Err(); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("want an error that hides the value, got %v", err)
	}
}

func TestFirstErrorWins(t *testing.T) {
	env := FromMap(map[string]string{StaleAfter.Name: "x", MaxAttempts.Name: "y"})
	env.Duration(StaleAfter)
	env.Int(MaxAttempts)
	if err := env.Err(); err == nil || !strings.Contains(err.Error(), "STALE_AFTER") {
		t.Fatalf("want the first bad variable, got %v", err)
	}
}

func TestURLTrimsTrailingSlash(t *testing.T) {
	env := FromMap(map[string]string{SartiqAPIURL.Name: "http://127.0.0.1:9000/"})
	if got := env.URL(SartiqAPIURL); got != "http://127.0.0.1:9000" {
		t.Fatalf("got %q", got)
	}
}

// The README's configuration table is the operator's reference: every variable is in it.
func TestREADMEListsEveryVariable(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range All() {
		if !strings.Contains(string(readme), "`"+v.Name+"`") {
			t.Errorf("README.md's configuration table lacks `%s`", v.Name)
		}
	}
}
