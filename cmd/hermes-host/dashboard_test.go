package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"hermeshost/assertion"
	"hermeshost/control"
)

const testDashboardSecret = "dashboard-secret-for-cmd-tests-0123"

// dashboardStdin is the five lines the dispatcher writes, with extra appended.
func dashboardStdin(t *testing.T, extra ...string) string {
	t.Helper()
	ck, err := control.Key("control-secret-for-cmd-tests", "acme")
	if err != nil {
		t.Fatal(err)
	}
	ak, err := assertion.OrgKey(testDashboardSecret, "acme")
	if err != nil {
		t.Fatal(err)
	}
	lines := []string{"CONTROL_URL=http://127.0.0.1:1", "CONTROL_KEY=" + ck, "GATEWAY_URL=http://127.0.0.1:1",
		"GATEWAY_KEY=hgw_acme_do-not-print-me", "DASHBOARD_ASSERTION_KEY=" + ak}
	return strings.Join(append(lines, extra...), "\n") + "\n"
}

func TestDashboardSecretsAreExactlyTheDispatchersLines(t *testing.T) {
	s, err := readDashboardSecrets(strings.NewReader(dashboardStdin(t) + "\n\r\n"))
	if err != nil || s.controlURL != "http://127.0.0.1:1" || s.gatewayKey != "hgw_acme_do-not-print-me" || s.assertionKey == "" {
		t.Fatalf("%+v %v", s, err)
	}
	good := strings.Split(strings.TrimSpace(dashboardStdin(t)), "\n")
	without := func(key string) string {
		var out []string
		for _, l := range good {
			if !strings.HasPrefix(l, key+"=") {
				out = append(out, l)
			}
		}
		return strings.Join(out, "\n")
	}
	for input, want := range map[string]string{
		dashboardStdin(t, "DATABASE_URL=postgres://secret-password@db/x"):                                                "stdin line 6: unknown key DATABASE_URL",
		dashboardStdin(t, "GATEWAY_KEY=hgw_acme_second-secret"):                                                          "stdin line 6: GATEWAY_KEY is given twice",
		dashboardStdin(t, "hgw_acme_a-value-without-a-key"):                                                              "stdin line 6 is not a KEY=VALUE line",
		dashboardStdin(t, "lower=case-secret-value"):                                                                     "stdin line 6 is not a KEY=VALUE line",
		without("CONTROL_KEY") + "\nCONTROL_KEY=":                                                                        "stdin line 5: CONTROL_KEY is empty",
		without("DASHBOARD_ASSERTION_KEY"):                                                                               "stdin: DASHBOARD_ASSERTION_KEY is missing",
		strings.Replace(dashboardStdin(t), "GATEWAY_URL=http://127.0.0.1:1", "GATEWAY_URL=file:///etc/passwd-secret", 1): "stdin: GATEWAY_URL is neither an http(s) URL nor unix:/path",
		strings.Replace(dashboardStdin(t), "CONTROL_URL=http://127.0.0.1:1", "CONTROL_URL=unix:relative-secret", 1):      "stdin: CONTROL_URL is neither an http(s) URL nor unix:/path",
		strings.Repeat("x", maxSecretsInput+1):                                                                           "over",
	} {
		_, err := readDashboardSecrets(strings.NewReader(input))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.40q: %v, want %q", input, err, want)
			continue
		}
		for _, secret := range []string{"secret-password", "second-secret", "case-secret", "passwd-secret", "hgw_", "hck_", "do-not-print"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("the error shows a value: %v", err)
			}
		}
	}
}

// The subcommand as the dispatcher runs it: its keys on stdin, its home in HERMES_HOME, up
// when /healthz answers, the pages only for its own org's assertion, gone on SIGTERM.
func TestDashboardServesItsOrgFromStdinSecretsAndStopsOnSIGTERM(t *testing.T) {
	home := t.TempDir()
	if err := os.WriteFile(home+"/SOUL.md", []byte("Plain free text.\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "dashboard", "--org", "acme", "--addr", "127.0.0.1:0")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HERMES_HOME=" + home, "HERMES_BUNDLED_SKILLS=" + t.TempDir()}
	cmd.Stdin = strings.NewReader(dashboardStdin(t))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })                      //nolint:errcheck // ends a process already stopped, or a failed one
	deadline := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() }) //nolint:errcheck
	defer deadline.Stop()
	lines := bufio.NewScanner(stderr)
	var logs bytes.Buffer
	base := ""
	for base == "" && lines.Scan() {
		logs.Write(append(lines.Bytes(), '\n'))
		var ev struct {
			Msg, URL, Server string
		}
		if json.Unmarshal(lines.Bytes(), &ev) == nil && ev.Msg == "listening" && ev.Server == "dashboard" {
			base = ev.URL
		}
	}
	if base == "" {
		t.Fatalf("the dashboard never listened:\n%s", logs.String())
	}
	rest := make(chan string)
	go func() { b, _ := io.ReadAll(stderr); rest <- string(b) }()

	get := func(path, token string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if token != "" {
			req.Header.Set(assertion.Header, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz", ""); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
	if code, body := get("/orgs/acme/", ""); code != http.StatusUnauthorized || strings.Contains(body, "Plain free text") {
		t.Fatalf("without an assertion: %d", code)
	}
	signer, _ := assertion.NewSigner(testDashboardSecret, nil)
	tok, _ := signer.Sign("ada", "acme")
	code, body := get("/orgs/acme/", tok)
	// The control API and the gateway are unreachable here: the page says so and shows the rest.
	if code != http.StatusOK || !strings.Contains(body, "Plain free text") || !strings.Contains(body, `data-testid="jobs-error"`) ||
		!strings.Contains(body, `data-testid="gateway-error"`) || !strings.Contains(body, `data-testid="operator">ada<`) {
		t.Fatalf("overview: %d\n%s", code, body)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the dashboard did not exit cleanly on SIGTERM: %v", err)
	}
	all := logs.String() + <-rest
	for _, secret := range []string{"do-not-print-me", "hck_acme_", tok} {
		if strings.Contains(all, secret) {
			t.Fatalf("the log holds %q:\n%s", secret, all)
		}
	}
}

func TestDashboardRefusesBadStdinAndFlagsInOneLine(t *testing.T) {
	env := []string{"PATH=" + os.Getenv("PATH"), "HERMES_HOME=" + t.TempDir()}
	for name, c := range map[string]struct {
		args  []string
		stdin string
		code  int
		want  string
	}{
		"an unknown key":   {[]string{"--org", "acme"}, dashboardStdin(t, "SARTIQ_BOT_TOKEN=bot-do-not-print"), 1, "stdin line 6: unknown key SARTIQ_BOT_TOKEN"},
		"nothing":          {[]string{"--org", "acme"}, "", 1, "stdin: CONTROL_URL is missing"},
		"another's keys":   {[]string{"--org", "globex"}, dashboardStdin(t), 1, "CONTROL_KEY is not a control key of org globex"},
		"no org":           {nil, dashboardStdin(t), 2, "--org"},
		"an invalid org":   {[]string{"--org", "../acme"}, dashboardStdin(t), 2, "--org"},
		"a bad prefix":     {[]string{"--org", "acme", "--prefix", "orgs/acme/"}, dashboardStdin(t), 1, "prefix"},
		"a stray argument": {[]string{"--org", "acme", "extra"}, dashboardStdin(t), 2, "no arguments"},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(binary, append([]string{"dashboard", "--addr", "127.0.0.1:0"}, c.args...)...)
			cmd.Env, cmd.Stdin = env, strings.NewReader(c.stdin)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != c.code {
				t.Fatalf("exit %v, want %d:\n%s", err, c.code, stderr.String())
			}
			out := strings.TrimSpace(stderr.String())
			if strings.Count(out, "\n") > 0 && c.code == 1 || !strings.Contains(out, c.want) || strings.Contains(out, "do-not-print") {
				t.Fatalf("stderr:\n%s", out)
			}
		})
	}
}
