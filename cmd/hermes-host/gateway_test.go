package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"hermeshost/gateway"
)

func TestGatewayRefusesACorruptAuthFileWithOneLine(t *testing.T) {
	for name, content := range map[string]string{"empty": "", "truncated": `{"version":1,"identity":"a`, "garbage": "not json at all"} {
		path := filepath.Join(t.TempDir(), "auth.json")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		env := map[string]string{"GATEWAY_SECRET": "s", "GATEWAY_OAUTH_TOKEN_URL": "http://127.0.0.1:1/token"}
		r := run(t, env, "gateway", "--upstream", "http://127.0.0.1:1/v1", "--auth-file", path, "--addr", "127.0.0.1:0")
		line := strings.TrimSpace(r.stderr)
		if r.code != 1 || strings.Count(line, "\n") != 0 || !strings.Contains(line, path) || !strings.HasPrefix(line, "hermes-host gateway: ") {
			t.Errorf("%s auth.json: want exit 1 and one line naming the file, got %+v", name, r)
		}
		if now, _ := os.ReadFile(path); string(now) != content {
			t.Errorf("%s auth.json was changed", name)
		}
		if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
			t.Errorf("%s: something was written beside auth.json: %v", name, entries)
		}
	}
	r := run(t, map[string]string{"GATEWAY_SECRET": "s", "GATEWAY_OAUTH_TOKEN_URL": "http://127.0.0.1:1/token"},
		"gateway", "--upstream", "http://127.0.0.1:1/v1", "--auth-file", filepath.Join(t.TempDir(), "missing.json"), "--addr", "127.0.0.1:0")
	if r.code != 1 || !strings.Contains(r.stderr, "gateway login") {
		t.Fatalf("missing auth.json: %+v", r)
	}
	if r := run(t, nil, "gateway", "--upstream", "demo"); r.code != 1 || !strings.Contains(r.stderr, "GATEWAY_SECRET: is required") {
		t.Fatalf("no secret: %+v", r)
	}
}

func TestGatewayDemoServesOrgKeysAndStopsOnSIGTERM(t *testing.T) {
	cmd := exec.Command(binary, "gateway", "--upstream", "demo", "--addr", "127.0.0.1:0")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GATEWAY_SECRET=cmd-test-secret"}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()                                                  //nolint:errcheck // cleanup after a failed assertion
	deadline := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() }) //nolint:errcheck
	defer deadline.Stop()
	url := ""
	var logs strings.Builder
	lines := bufio.NewScanner(stderr)
	for url == "" && lines.Scan() {
		logs.WriteString(lines.Text() + "\n")
		var ev struct {
			Msg        string `json:"msg"`
			GatewayURL string `json:"gateway_url"`
		}
		if json.Unmarshal(lines.Bytes(), &ev) == nil && ev.Msg == "hermes-host gateway is up" {
			url = ev.GatewayURL
		}
	}
	if url == "" {
		t.Fatalf("the gateway never came up:\n%s", logs.String())
	}
	key, err := gateway.OrgKey("cmd-test-secret", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if err := gateway.Gate(t.Context(), http.DefaultClient, url, key, gateway.DemoWorkerModel, gateway.DemoVisionModel); err != nil {
		t.Fatalf("gate against the demo gateway: %v", err)
	}
	drained := make(chan struct{})
	go func() { io.Copy(io.Discard, stderr); close(drained) }() //nolint:errcheck
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-drained
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the gateway did not exit cleanly on SIGTERM: %v", err)
	}
}

// tokenEndpoint is a test double of a provider's token endpoint that answers any
// refresh-token grant for the identity in the refresh token ("rt-for-<identity>").
func tokenEndpoint(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ParseForm() != nil || r.PostForm.Get("grant_type") != "refresh_token" {
			http.Error(w, `{"error":"invalid_request"}`, http.StatusBadRequest)
			return
		}
		who := strings.TrimPrefix(r.PostForm.Get("refresh_token"), "rt-for-")
		enc := base64.RawURLEncoding.EncodeToString
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{ //nolint:errcheck
			"access_token": "at-" + who, "refresh_token": "rt2-for-" + who, "expires_in": 3600,
			"id_token": enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(`{"sub":"`+who+`"}`)) + ".x",
		})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// runInput is run with stdin.
func runInput(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{code, out.String(), errb.String()}
}

func TestGatewayLoginFromStdinRefusesAnotherIdentity(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	env := map[string]string{"GATEWAY_OAUTH_TOKEN_URL": tokenEndpoint(t), "GATEWAY_AUTH_FILE": path}

	r := runInput(t, env, "rt-for-alice\n", "gateway", "login", "--refresh-token-stdin")
	if r.code != 0 || !strings.Contains(r.stdout, "logged in as alice") {
		t.Fatalf("login: %+v", r)
	}
	first, err := os.ReadFile(path)
	if err != nil || !bytes.Contains(first, []byte(`"identity": "alice"`)) || !bytes.Contains(first, []byte("rt2-for-alice")) {
		t.Fatalf("auth.json %s %v", first, err)
	}
	if info, _ := os.Stat(path); info.Mode().Perm() != 0o600 {
		t.Fatalf("auth.json mode %v", info.Mode())
	}
	r = runInput(t, env, "rt-for-mallory\n", "gateway", "login", "--refresh-token-stdin")
	if r.code != 1 || !strings.Contains(r.stderr, "--replace") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Fatalf("another identity without --replace: %+v", r)
	}
	if now, _ := os.ReadFile(path); !bytes.Equal(now, first) {
		t.Fatal("the refused login changed auth.json")
	}
	if r := runInput(t, env, "rt-for-mallory\n", "gateway", "login", "--refresh-token-stdin", "--replace"); r.code != 0 {
		t.Fatalf("--replace: %+v", r)
	}
	if r := runInput(t, env, "", "gateway", "login", "--refresh-token-stdin"); r.code != 1 || !strings.Contains(r.stderr, "no refresh token on stdin") {
		t.Fatalf("empty stdin: %+v", r)
	}
	if r := run(t, env, "gateway", "login", "rt-for-alice"); r.code != 2 {
		t.Fatalf("a token as an argument must be refused: %+v", r)
	}
}

func TestGatewayHelpListsFlagsSubcommandAndEnvironment(t *testing.T) {
	r := run(t, nil, "gateway", "--help")
	for _, want := range []string{"--upstream", "--auth-file", "--addr", "login", "GATEWAY_SECRET", "GATEWAY_ORG_RPS", "default 5"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("gateway --help lacks %q:\n%s", want, r.stdout)
		}
	}
	if r := run(t, nil, "gateway", "login", "--help"); r.code != 0 || !strings.Contains(r.stdout, "--refresh-token-stdin") || !strings.Contains(r.stdout, "GATEWAY_OAUTH_DEVICE_URL") {
		t.Fatalf("gateway login --help: %+v", r)
	}
}
