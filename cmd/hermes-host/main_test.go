package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"hermeshost/gateway"
	"hermeshost/pg/pgtest"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hermes-host-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "hermes-host")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build hermes-host:", err)
		os.Exit(1)
	}
	pgtest.Main(m)
	os.RemoveAll(dir)
}

type result struct {
	code           int
	stdout, stderr string
}

// run runs the built binary with only the given environment (plus PATH).
func run(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
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

func TestHelpListsFlagsAndEnvironmentWithDefaults(t *testing.T) {
	r := run(t, nil, "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "dev") || !strings.Contains(r.stdout, "migrate") {
		t.Fatalf("top-level help: %+v", r)
	}
	r = run(t, nil, "dev", "--help")
	for _, want := range []string{"--addr", "127.0.0.1:8080", "DATABASE_URL", "SHUTDOWN_GRACE", "default 10s", "LOG_LEVEL", "secret, not set"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dev --help lacks %q:\n%s", want, r.stdout)
		}
	}
	r = run(t, map[string]string{"DATABASE_URL": "postgres://u:pw-do-not-print@h/db"}, "migrate", "up", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "--set") || !strings.Contains(r.stdout, "secret, set") || strings.Contains(r.stdout, "pw-do-not-print") {
		t.Fatalf("migrate up --help: %+v", r)
	}
}

func TestUnknownCommandAndArguments(t *testing.T) {
	if r := run(t, nil, "frobnicate"); r.code != 2 || !strings.Contains(r.stderr, `unknown command "frobnicate"`) {
		t.Fatalf("%+v", r)
	}
	if r := run(t, nil, "migrate", "sideways"); r.code != 2 {
		t.Fatalf("%+v", r)
	}
	if r := run(t, nil, "migrate", "up", "--set", "nope"); r.code != 2 || !strings.Contains(r.stderr, `unknown migration set "nope"`) {
		t.Fatalf("%+v", r)
	}
}

func TestBadConfigStopsStartupWithOneLine(t *testing.T) {
	r := run(t, map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x", "SHUTDOWN_GRACE": "soon"}, "dev", "--addr", "127.0.0.1:0")
	if r.code != 1 {
		t.Fatalf("want exit 1, got %+v", r)
	}
	line := strings.TrimSpace(r.stderr)
	if strings.Count(line, "\n") != 0 || !strings.Contains(line, `SHUTDOWN_GRACE: "soon" is not a positive duration`) {
		t.Fatalf("want one line naming SHUTDOWN_GRACE, got %q", r.stderr)
	}
	r = run(t, nil, "migrate", "status")
	if r.code != 1 || strings.TrimSpace(r.stderr) != "hermes-host migrate status: config: DATABASE_URL: is required and not set" {
		t.Fatalf("missing DATABASE_URL: %+v", r)
	}
	r = run(t, map[string]string{"DATABASE_URL": "postgres://x/y", "LOG_LEVEL": "loud"}, "migrate", "status")
	if r.code != 1 || !strings.Contains(r.stderr, "LOG_LEVEL") {
		t.Fatalf("bad LOG_LEVEL: %+v", r)
	}
}

func TestUnreachableDatabaseIsOneLineWithoutPassword(t *testing.T) {
	r := run(t, map[string]string{"DATABASE_URL": "postgres://u:pw-do-not-print@127.0.0.1:1/db?connect_timeout=2"}, "migrate", "up")
	if r.code != 1 || strings.Contains(r.stderr, "pw-do-not-print") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Fatalf("%+v", r)
	}
}

func tablesIn(t *testing.T, base, schema string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY tablename`, schema)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestMigrateUpStatusDown(t *testing.T) {
	url, schema := pgtest.EmptySchema(t)
	env := map[string]string{"DATABASE_URL": url}

	r := run(t, env, "migrate", "status")
	if r.code != 0 || !regexp.MustCompile(`(?m)^1\s+pending\s+-\s+00001_leases.sql`).MatchString(r.stdout) {
		t.Fatalf("status before up: %+v", r)
	}
	r = run(t, env, "migrate", "up")
	if r.code != 0 || !strings.Contains(r.stdout, "applied 00001_leases.sql") {
		t.Fatalf("up: %+v", r)
	}
	if got := tablesIn(t, pgtest.URL(t), schema); !contains(got, "leases") || !contains(got, "goose_db_version") {
		t.Fatalf("tables after up: %v", got)
	}
	if r = run(t, env, "migrate", "up"); r.code != 0 || !strings.Contains(r.stdout, "is up to date") {
		t.Fatalf("second up: %+v", r)
	}
	r = run(t, env, "migrate", "status")
	if r.code != 0 || !regexp.MustCompile(`(?m)^1\s+applied\s+\d{4}-`).MatchString(r.stdout) {
		t.Fatalf("status after up: %+v", r)
	}
	r = run(t, env, "migrate", "down")
	if r.code != 0 || !strings.Contains(r.stdout, "rolled back 00001_leases.sql") {
		t.Fatalf("down: %+v", r)
	}
	if got := tablesIn(t, pgtest.URL(t), schema); contains(got, "leases") {
		t.Fatalf("leases still there after down: %v", got)
	}
}

func TestConcurrentUpEndsWithOneSchema(t *testing.T) {
	url, schema := pgtest.EmptySchema(t)
	var wg sync.WaitGroup
	results := make([]result, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = run(t, map[string]string{"DATABASE_URL": url}, "migrate", "up")
		}()
	}
	wg.Wait()
	applied := 0
	for _, r := range results {
		if r.code != 0 {
			t.Fatalf("a concurrent up failed: %+v", r)
		}
		applied += strings.Count(r.stdout, "applied 00001_leases.sql")
	}
	if applied != 1 {
		t.Fatalf("the migration was applied %d times", applied)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var versions int
	if err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.goose_db_version WHERE version_id = 1`, schema)).Scan(&versions); err != nil {
		t.Fatal(err)
	}
	if versions != 1 {
		t.Fatalf("version 1 recorded %d times", versions)
	}
}

func TestDevServesHealthAndStopsOnSIGTERM(t *testing.T) {
	url, _ := pgtest.EmptySchema(t)
	cmd := exec.Command(binary, "dev", "--addr", "127.0.0.1:0")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + url, "GATEWAY_SECRET=dev-test-secret"}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck // cleanup after a failed assertion

	statusURL, gatewayURL := "", ""
	var logs strings.Builder
	lines := bufio.NewScanner(stderr)
	deadline := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() }) //nolint:errcheck
	defer deadline.Stop()
	for statusURL == "" && lines.Scan() {
		logs.WriteString(lines.Text() + "\n")
		var ev struct {
			Msg        string `json:"msg"`
			StatusURL  string `json:"status_url"`
			GatewayURL string `json:"gateway_url"`
		}
		if json.Unmarshal(lines.Bytes(), &ev) == nil && ev.Msg == "hermes-host dev is up" {
			statusURL, gatewayURL = ev.StatusURL, ev.GatewayURL
		}
	}
	if statusURL == "" {
		t.Fatalf("dev never came up:\n%s", logs.String())
	}
	resp, err := http.Get(statusURL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"database"`) {
		t.Fatalf("healthz: %d %s", resp.StatusCode, body)
	}
	key, err := gateway.OrgKey("dev-test-secret", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if err := gateway.Gate(t.Context(), http.DefaultClient, gatewayURL, key, gateway.DemoWorkerModel, gateway.DemoVisionModel); err != nil {
		t.Fatalf("dev's gateway (%q) does not serve the demo models: %v", gatewayURL, err)
	}
	drained := make(chan struct{})
	go func() { io.Copy(io.Discard, stderr); close(drained) }() //nolint:errcheck
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-drained
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dev did not exit cleanly on SIGTERM: %v", err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
