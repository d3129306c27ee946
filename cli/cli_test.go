package cli

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"

	"hermeshost/config"
)

func helpOf(t *testing.T, env ...config.Var) string {
	t.Helper()
	root := &Command{Name: "hermes-host", Subcommands: []*Command{{
		Name: "serve", Summary: "serve", Env: env,
		Setup: func(*flag.FlagSet) func(context.Context, []string) error { return nil },
	}}}
	var out, errb bytes.Buffer
	if code := Run(context.Background(), root, []string{"serve", "--help"}, &out, &errb); code != 0 {
		t.Fatalf("serve --help: exit %d: %s", code, errb.String())
	}
	return out.String()
}

func TestHelpSaysSecretsAcceptAFile(t *testing.T) {
	t.Setenv(config.DatabaseURL.Name, "postgres://u:pw-not-printed@h/db")
	out := helpOf(t, config.DatabaseURL, config.LogLevel)
	if !strings.Contains(out, "secret, set)") || strings.Contains(out, "pw-not-printed") || !strings.Contains(out, "DATABASE_URL_FILE=/run/secrets/") {
		t.Errorf("help of a command reading DATABASE_URL:\n%s", out)
	}
	if out := helpOf(t, config.LogLevel); strings.Contains(out, "_FILE") {
		t.Errorf("help of a command reading no secret mentions a file form:\n%s", out)
	}
}

func TestHelpSaysWhenASecretIsSetFromItsFile(t *testing.T) {
	t.Setenv(config.DatabaseURL.Name, " ") // blank: unset
	t.Setenv("DATABASE_URL_FILE", "/run/secrets/database_url")
	out := helpOf(t, config.DatabaseURL)
	if !strings.Contains(out, "secret, set from DATABASE_URL_FILE)") {
		t.Errorf("help with DATABASE_URL_FILE set:\n%s", out)
	}
}
