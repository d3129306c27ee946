package main

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"hermeshost/operator"
	"hermeshost/pg/pgtest"
)

func TestOperatorAccountsAndGrantsFromTheShell(t *testing.T) {
	url, pool := pgtest.Schema(t)
	env := map[string]string{"DATABASE_URL": url}
	ctx := context.Background()
	check, err := operator.New(pool, bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}

	r := runInput(t, env, "a long enough passphrase\n", "operator", "add", "--password-stdin", "--as", "root@console", "ada")
	if r.code != 0 || !strings.Contains(r.stdout, "added operator ada") || strings.Contains(r.stdout, "passphrase") {
		t.Fatalf("add: %+v", r)
	}
	if _, err := check.Authenticate(ctx, "ada", "a long enough passphrase", "test"); err != nil {
		t.Fatalf("ada's piped password does not log in: %v", err)
	}
	// Without --password-stdin a password is made and shown once.
	r = run(t, env, "operator", "add", "bob")
	m := regexp.MustCompile(`(?m)^password \(shown once\): (\S+)$`).FindStringSubmatch(r.stdout)
	if r.code != 0 || m == nil {
		t.Fatalf("add with a made password: %+v", r)
	}
	if _, err := check.Authenticate(ctx, "bob", m[1], "test"); err != nil {
		t.Fatalf("bob's made password does not log in: %v", err)
	}
	if r = run(t, env, "operator", "grant", "ada", "acme", "globex"); r.code != 0 {
		t.Fatalf("grant: %+v", r)
	}
	if r = run(t, env, "operator", "revoke", "ada", "globex"); r.code != 0 {
		t.Fatalf("revoke: %+v", r)
	}
	if r = run(t, env, "operator", "disable", "bob"); r.code != 0 || !strings.Contains(r.stdout, "bob is disabled") {
		t.Fatalf("disable: %+v", r)
	}
	r = run(t, env, "operator", "list")
	if r.code != 0 || !regexp.MustCompile(`(?m)^ada\s+enabled\s+\S+\s+\S+\s+acme$`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^bob\s+disabled\s+\S+\s+\S+\s+-$`).MatchString(r.stdout) {
		t.Fatalf("list: %+v", r)
	}
	r = run(t, env, "operator", "show", "ada")
	if r.code != 0 || !strings.Contains(r.stdout, "orgs:     acme") ||
		!regexp.MustCompile(`revoke\s+globex\s+\S+`).MatchString(r.stdout) || !regexp.MustCompile(`add\s+-\s+root@console`).MatchString(r.stdout) {
		t.Fatalf("show: %+v", r)
	}
	if r = runInput(t, env, "another long passphrase\n", "operator", "passwd", "--password-stdin", "ada"); r.code != 0 {
		t.Fatalf("passwd: %+v", r)
	}
	if _, err := check.Authenticate(ctx, "ada", "a long enough passphrase", "test"); !errors.Is(err, operator.ErrBadLogin) {
		t.Fatalf("the old password still logs in: %v", err)
	}
	if r = run(t, env, "operator", "remove", "bob"); r.code != 0 {
		t.Fatalf("remove: %+v", r)
	}
	for _, c := range []struct {
		stdin string
		args  []string
		code  int
		says  string
	}{
		{"", []string{"operator", "add"}, 2, "want exactly one operator NAME"},
		{"short\n", []string{"operator", "add", "--password-stdin", "carol"}, 1, "at least 12"},
		{"", []string{"operator", "add", "--password-stdin", "carol"}, 1, "no password on stdin"},
		{"", []string{"operator", "add", "Carol"}, 1, "must be 1 to 64 lower-case"},
		{"", []string{"operator", "add", "ada"}, 1, "exists already"},
		{"", []string{"operator", "grant", "ada"}, 2, "at least one ORG"},
		{"", []string{"operator", "grant", "ada", "Acme Corp"}, 1, "is not one"},
		{"", []string{"operator", "grant", "nobody", "acme"}, 1, "no such operator"},
		{"", []string{"operator", "show", "bob"}, 1, "no such operator"},
	} {
		r := runInput(t, env, c.stdin, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.says) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%v: want exit %d saying %q in one line, got %+v", c.args, c.code, c.says, r)
		}
	}
	if ok, err := check.Allowed(ctx, "ada", "acme"); err != nil || !ok {
		t.Fatalf("ada's grant for acme: %v %v", ok, err)
	}
}
