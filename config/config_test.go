package config

import (
	"errors"
	"os"
	"path/filepath"
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

func TestSecretsReadFromNAME_FILE(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const secret = "s3cret-value-never-printed"
	unreadable := file("unreadable", secret+"\n", 0o000)
	rootReadsIt := false
	if f, err := os.Open(unreadable); err == nil {
		f.Close()
		rootReadsIt = true
	}
	type secretCase struct {
		name    string
		env     map[string]string
		want    string
		wantErr string // the error's text, one line; "" for none
	}
	cases := []secretCase{
		{name: "file", env: map[string]string{"GATEWAY_KEY_FILE": file("plain", secret, 0o600)}, want: secret},
		{name: "one trailing newline trimmed", env: map[string]string{"GATEWAY_KEY_FILE": file("lf", secret+"\n", 0o600)}, want: secret},
		{name: "CRLF trimmed", env: map[string]string{"GATEWAY_KEY_FILE": file("crlf", secret+"\r\n", 0o600)}, want: secret},
		{name: "only one newline trimmed", env: map[string]string{"GATEWAY_KEY_FILE": file("lflf", secret+"\n\n", 0o600)}, want: secret + "\n"},
		{name: "inner spaces kept", env: map[string]string{"GATEWAY_KEY_FILE": file("spaces", " "+secret+" \n", 0o600)}, want: " " + secret + " "},
		{name: "blank variable beside the file is unset", env: map[string]string{"GATEWAY_KEY": " ", "GATEWAY_KEY_FILE": file("beside", secret, 0o600)}, want: secret},
		{name: "the variable itself", env: map[string]string{"GATEWAY_KEY": secret}, want: secret},
		{name: "both set", env: map[string]string{"GATEWAY_KEY": secret, "GATEWAY_KEY_FILE": file("both", secret, 0o600)},
			wantErr: "config: GATEWAY_KEY: is set and so is GATEWAY_KEY_FILE: set only one of them"},
		{name: "missing file", env: map[string]string{"GATEWAY_KEY_FILE": filepath.Join(dir, "absent")},
			wantErr: "config: GATEWAY_KEY_FILE: cannot read " + filepath.Join(dir, "absent") + ": no such file or directory"},
		{name: "empty file", env: map[string]string{"GATEWAY_KEY_FILE": file("empty", "", 0o600)},
			wantErr: "config: GATEWAY_KEY_FILE: " + filepath.Join(dir, "empty") + " is empty"},
		{name: "only a newline", env: map[string]string{"GATEWAY_KEY_FILE": file("newline", "\r\n", 0o600)},
			wantErr: "config: GATEWAY_KEY_FILE: " + filepath.Join(dir, "newline") + " is empty"},
		{name: "a folder", env: map[string]string{"GATEWAY_KEY_FILE": dir},
			wantErr: "config: GATEWAY_KEY_FILE: cannot read " + dir + ": is a directory"},
		{name: "too large", env: map[string]string{"GATEWAY_KEY_FILE": file("large", strings.Repeat(secret, 4<<10), 0o600)},
			wantErr: "config: GATEWAY_KEY_FILE: " + filepath.Join(dir, "large") + " is over 64 KiB, too large for a secret's value"},
	}
	if !rootReadsIt {
		cases = append(cases, secretCase{name: "unreadable file", env: map[string]string{"GATEWAY_KEY_FILE": unreadable},
			wantErr: "config: GATEWAY_KEY_FILE: cannot read " + unreadable + ": permission denied"})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := FromMap(c.env)
			got := env.String(GatewayKey)
			err := env.Err()
			if c.wantErr == "" {
				if err != nil || got != c.want {
					t.Fatalf("got %q, %v; want %q", got, err, c.want)
				}
				return
			}
			if err == nil || err.Error() != c.wantErr {
				t.Fatalf("got error %v; want %q", err, c.wantErr)
			}
			if got != "" || strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("a failed read gives %q and error %q: want no value, and no secret in one line", got, err)
			}
		})
	}
}

func TestRequiredSecretNamesItsFileForm(t *testing.T) {
	env := FromMap(nil)
	env.Required(DatabaseURL)
	if err := env.Err(); err == nil || err.Error() != "config: DATABASE_URL: is required and not set (nor is DATABASE_URL_FILE)" {
		t.Fatalf("got %v", err)
	}
}

// A file that cannot be read stops start-up, even for a variable with a default: never a
// silent fallback.
func TestUnreadableSecretFileIsNotTheDefault(t *testing.T) {
	v := Var{Name: "SOME_TOKEN", Default: "fallback", Secret: true}
	env := FromMap(map[string]string{"SOME_TOKEN_FILE": filepath.Join(t.TempDir(), "absent")})
	if got := env.String(v); got != "" || env.Err() == nil {
		t.Fatalf("got %q, %v; want no value and an error", got, env.Err())
	}
}

func TestOnlySecretsHaveAFileForm(t *testing.T) {
	env := FromMap(map[string]string{"GATEWAY_URL_FILE": "/nonexistent", "LOG_LEVEL_FILE": "/nonexistent"})
	if env.String(GatewayURL) != "" || env.String(LogLevel) != "info" || env.Err() != nil {
		t.Fatalf("a non-secret variable read a _FILE form: %v", env.Err())
	}
	names := map[string]bool{}
	for _, v := range All() {
		names[v.Name] = true
		if !v.Secret && v.FileVar() != "" {
			t.Errorf("%s is not secret and has a file form", v.Name)
		}
	}
	for _, v := range All() {
		if v.Secret && names[v.FileVar()] {
			t.Errorf("%s, the file form of %s, is declared as a variable of its own", v.FileVar(), v.Name)
		}
	}
}

// A value from a file is as secret as one from the environment: a bad one is not echoed.
func TestSecretFromFileIsNotEchoed(t *testing.T) {
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte("hunter2-is-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := FromMap(map[string]string{"SOME_TOKEN_FILE": p})
	env.Duration(Var{Name: "SOME_TOKEN", Secret: true})
	if err := env.Err(); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("want an error that hides the value, got %v", err)
	}
}

// The README's paragraph on NAME_FILE names every secret, which is every variable that has one.
func TestREADMEListsEverySecretWithAFileForm(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, para, _ := strings.Cut(string(readme), "**Secrets from files.**")
	para, _, _ = strings.Cut(para, "\n\n")
	for _, v := range All() {
		if v.Secret && !strings.Contains(para, "`"+v.Name+"`") {
			t.Errorf("README.md's paragraph on secrets from files lacks `%s`", v.Name)
		}
	}
}
