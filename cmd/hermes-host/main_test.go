package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/cookiejar"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"hermeshost/internal/testio"

	"github.com/jackc/pgx/v5"

	"hermeshost/gateway"
	"hermeshost/migrations"
	"hermeshost/pg"
	"hermeshost/pg/pgtest"
	"hermeshost/sartiq/backend"
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
	// Beside it, as make build puts it: the agent dev's workers and dashboards run.
	agent := exec.Command("go", "build", "-o", filepath.Join(dir, "scripted-agent"), "../scripted-agent")
	agent.Stderr = os.Stderr
	if err := agent.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build scripted-agent:", err)
		os.Exit(1)
	}
	code := pgtest.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
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
	if r.code != 1 || strings.TrimSpace(r.stderr) != "hermes-host migrate status: config: DATABASE_URL: is required and not set (nor is DATABASE_URL_FILE)" {
		t.Fatalf("missing DATABASE_URL: %+v", r)
	}
	r = run(t, map[string]string{"DATABASE_URL": "postgres://x/y", "LOG_LEVEL": "loud"}, "migrate", "status")
	if r.code != 1 || !strings.Contains(r.stderr, "LOG_LEVEL") {
		t.Fatalf("bad LOG_LEVEL: %+v", r)
	}
}

// DATABASE_URL_FILE, as a Docker secret gives it: the URL with a trailing newline; setting
// both forms, or naming a file that is not there, stops start-up on one line.
func TestSecretFileStandsInForTheVariable(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "absent")
	r := run(t, map[string]string{"DATABASE_URL_FILE": missing}, "migrate", "status")
	if r.code != 1 || strings.TrimSpace(r.stderr) != "hermes-host migrate status: config: DATABASE_URL_FILE: cannot read "+missing+": no such file or directory" {
		t.Fatalf("missing file: %+v", r)
	}
	file := filepath.Join(dir, "database_url")
	if err := os.WriteFile(file, []byte("postgres://u:pw-do-not-print@127.0.0.1:1/db\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = run(t, map[string]string{"DATABASE_URL_FILE": file, "DATABASE_URL": "postgres://x/y"}, "migrate", "status")
	if r.code != 1 || strings.TrimSpace(r.stderr) != "hermes-host migrate status: config: DATABASE_URL: is set and so is DATABASE_URL_FILE: set only one of them" {
		t.Fatalf("both set: %+v", r)
	}
	url, _ := pgtest.EmptySchema(t)
	if err := os.WriteFile(file, []byte(url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r = run(t, map[string]string{"DATABASE_URL_FILE": file}, "migrate", "status"); r.code != 0 || !strings.Contains(r.stdout, "pending") {
		t.Fatalf("status with DATABASE_URL_FILE: %+v", r)
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
	files, err := fs.Glob(migrations.Host.FS, "*.sql")
	if err != nil || len(files) < 2 {
		t.Fatalf("embedded migrations: %v %v", files, err)
	}
	slices.Reverse(files)
	up := tablesIn(t, pgtest.URL(t), schema)
	r = run(t, env, "migrate", "down")
	if r.code != 0 || !strings.Contains(r.stdout, "rolled back "+files[0]) {
		t.Fatalf("down: %+v", r)
	}
	// The newest migration is pending again (it may add a column rather than a table), the
	// older ones' tables stay.
	if got := tablesIn(t, pgtest.URL(t), schema); !contains(got, "leases") || !contains(got, "claim_attempts") {
		t.Fatalf("after one down the older migrations' tables stay: %v, from %v", got, up)
	}
	if r = run(t, env, "migrate", "status"); r.code != 0 || !regexp.MustCompile(`(?m)\s+pending\s+-\s+`+regexp.QuoteMeta(files[0])).MatchString(r.stdout) {
		t.Fatalf("status after one down: %+v", r)
	}
	for _, m := range files[1:] {
		if r = run(t, env, "migrate", "down"); r.code != 0 || !strings.Contains(r.stdout, "rolled back "+m) {
			t.Fatalf("down to before %s: %+v", m, r)
		}
	}
	if got := tablesIn(t, pgtest.URL(t), schema); contains(got, "leases") || contains(got, "claim_attempts") {
		t.Fatalf("tables still there after every down: %v", got)
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
		applied += strings.Count(r.stdout, "applied 00001_leases.sql") + strings.Count(r.stdout, "applied 00002_dispatch.sql")
	}
	if applied != 2 {
		t.Fatalf("the two migrations were applied %d times in all", applied)
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
	backendURL, _ := pgtest.EmptySchema(t)
	cmd := exec.Command(binary, "dev", "--addr", "127.0.0.1:0", "--backend-addr", "127.0.0.1:0", "--gateway-addr", "127.0.0.1:0",
		"--launcher-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0", "--orgs-root", t.TempDir())
	var stdout testio.Buffer
	cmd.Stdout = &stdout
	// Claiming off (the job flow is the dispatcher's own test), and no Docker engine, so the
	// dispatcher takes the process runtime whatever runs on this machine.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + url, "BACKEND_DATABASE_URL=" + backendURL,
		"GATEWAY_SECRET=dev-test-secret", "CLAIM_ENABLED=false", "DOCKER_HOST=unix:///nonexistent/docker.sock"}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck // cleanup after a failed assertion

	statusURL, backendBase, gatewayURL, launcherURL := "", "", "", ""
	var logs strings.Builder
	lines := bufio.NewScanner(stderr)
	deadline := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() }) //nolint:errcheck
	defer deadline.Stop()
	for statusURL == "" && lines.Scan() {
		logs.WriteString(lines.Text() + "\n")
		var ev struct {
			Msg        string `json:"msg"`
			StatusURL  string `json:"status_url"`
			BackendURL string `json:"backend_url"`
			GatewayURL string `json:"gateway_url"`
			Launcher   string `json:"launcher_url"`
		}
		if json.Unmarshal(lines.Bytes(), &ev) == nil && ev.Msg == "hermes-host dev is up" {
			statusURL, backendBase, gatewayURL, launcherURL = ev.StatusURL, ev.BackendURL, ev.GatewayURL, ev.Launcher
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
	// dev seeds the reference backend, which needs a token for its jobs.
	resp, err = http.Get(backendBase + "/agent-jobs")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("dev's backend answered an anonymous list with %d", resp.StatusCode)
	}
	key, err := gateway.OrgKey("dev-test-secret", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if err := gateway.Gate(t.Context(), http.DefaultClient, gatewayURL, key, gateway.DemoWorkerModel, gateway.DemoVisionModel); err != nil {
		t.Fatalf("dev's gateway (%q) does not serve the demo models: %v", gatewayURL, err)
	}
	// The launcher, with the login dev printed for it.
	var printed []string
	waitUntil(t, 10*time.Second, func() bool {
		printed = regexp.MustCompile(`(?m)^Launcher: (\S+)\nLog in as (\S+) with password (\S+)`).FindStringSubmatch(stdout.String())
		return printed != nil
	})
	if printed[1] != launcherURL {
		t.Fatalf("printed launcher %s, logged %s", printed[1], launcherURL)
	}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	resp, err = browser.PostForm(launcherURL+"/login", neturl.Values{"name": {printed[2]}, "password": {printed[3]}})
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), `data-testid="org-acme"`) || !strings.Contains(string(page), `data-testid="org-globex"`) {
		t.Fatalf("logging in with the printed login: %d\n%s", resp.StatusCode, page)
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

// startBackend runs `hermes-host backend --seed-demo` on a fresh schema until the test
// ends and returns its URL.
func startBackend(t *testing.T, env map[string]string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(binary, "backend", "--addr", "127.0.0.1:0", "--seed-demo")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
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
	var logs strings.Builder
	for lines.Scan() {
		logs.WriteString(lines.Text() + "\n")
		var ev struct {
			Msg string `json:"msg"`
			URL string `json:"url"`
		}
		if json.Unmarshal(lines.Bytes(), &ev) == nil && ev.Msg == "reference backend is up" {
			go io.Copy(io.Discard, stderr) //nolint:errcheck
			return ev.URL, cmd
		}
	}
	t.Fatalf("backend never came up:\n%s", logs.String())
	return "", nil
}

func TestBackendServesSeedsOnceAndStopsOnSIGTERM(t *testing.T) {
	url, _ := pgtest.EmptySchema(t)
	env := map[string]string{"BACKEND_DATABASE_URL": url, "SARTIQ_BOT_TOKEN": "bot-secret-do-not-print"}
	for range 2 { // the second start finds the demo seeded and adds nothing
		base, cmd := startBackend(t, env)
		req, _ := http.NewRequest(http.MethodGet, base+"/agent-jobs?type=guidelines_extraction", nil)
		req.Header.Set("Authorization", "Bearer bot-secret-do-not-print")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var page struct{ Jobs []json.RawMessage }
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || len(page.Jobs) != 2 {
			t.Fatalf("list: %d %v %d jobs", resp.StatusCode, err, len(page.Jobs))
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("backend did not exit cleanly on SIGTERM: %v", err)
		}
	}
}

func TestBackendNeedsTheBotToken(t *testing.T) {
	r := run(t, map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x"}, "backend", "--addr", "127.0.0.1:0")
	if r.code != 1 || !strings.Contains(r.stderr, "SARTIQ_BOT_TOKEN: is required and not set") {
		t.Fatalf("%+v", r)
	}
}

func TestMigrateTheBackendSet(t *testing.T) {
	url, schema := pgtest.EmptySchema(t)
	r := run(t, map[string]string{"DATABASE_URL": url}, "migrate", "up", "--set", "backend")
	if r.code != 0 || !strings.Contains(r.stdout, "applied 00001_agent_jobs.sql") {
		t.Fatalf("%+v", r)
	}
	if got := tablesIn(t, pgtest.URL(t), schema); !contains(got, "agent_jobs") || !contains(got, "job_tokens") || contains(got, "leases") {
		t.Fatalf("tables: %v", got)
	}
}

func TestBackendSchemaOfDatabaseURL(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:p@h:5432/db?sslmode=disable&search_path=hermes_host": "postgres://u:p@h:5432/db?search_path=sartiq_backend&sslmode=disable",
		"host=h dbname=db": "host=h dbname=db search_path=sartiq_backend",
		"":                 "",
	} {
		if got := backendSchemaOf(in); got != want {
			t.Errorf("backendSchemaOf(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestWorkerIdleStopsOnSIGTERM(t *testing.T) {
	cmd := exec.Command(binary, "worker", "idle")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stderr)
	if !lines.Scan() || !strings.Contains(lines.Text(), "jobs are executed beside this process") {
		cmd.Process.Kill() //nolint:errcheck
		t.Fatalf("worker idle did not start: %q", lines.Text())
	}
	drained := make(chan struct{})
	go func() { io.Copy(io.Discard, stderr); close(drained) }() //nolint:errcheck
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-drained
	if err := cmd.Wait(); err != nil {
		t.Fatalf("worker idle did not exit cleanly: %v", err)
	}
}

func TestImagesBuildWantsBinaries(t *testing.T) {
	if r := run(t, nil, "images", "build"); r.code != 2 || !strings.Contains(r.stderr, "name the static binaries") {
		t.Fatalf("%+v", r)
	}
}

// waitUntil polls ok until it holds, failing the test after within.
func waitUntil(t *testing.T, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not so after %s", within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SIGTERM to dev while jobs run: its dispatcher asks their workers to release them once
// JOB_GRACE is over, and the backend and the gateway those releases need stop only after
// it, so every job in flight goes back to the queue, released, none left running or
// counted as a crash.
func TestDevStopsItsBackendAndGatewayAfterTheJobsInFlight(t *testing.T) {
	url, _ := pgtest.EmptySchema(t)
	backendURL, _ := pgtest.EmptySchema(t)
	cmd := exec.Command(binary, "dev", "--addr", "127.0.0.1:0", "--backend-addr", "127.0.0.1:0", "--gateway-addr", "127.0.0.1:0",
		"--launcher-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0", "--orgs-root", t.TempDir())
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + url, "BACKEND_DATABASE_URL=" + backendURL,
		"GATEWAY_SECRET=dev-test-secret", "JOB_GRACE=200ms", "DOCKER_HOST=unix:///nonexistent/docker.sock", "LOG_FORMAT=json"}
	var logs testio.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck // cleanup after a failed assertion
	ctx := t.Context()
	// The backend's own schema, as the backend opens it.
	db, _, err := pg.Open(ctx, backendURL, backend.Migrations.DefaultSchema)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	running := func() int {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM agent_jobs WHERE status IN ('CLAIMED', 'RUNNING')`).Scan(&n); err != nil {
			return 0 // not migrated yet
		}
		return n
	}
	// The demo homes pace their agents (a step every 2.5 s): a job runs for a while.
	waitUntil(t, 90*time.Second, func() bool {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM agent_job_events WHERE kind = 'progress'`).Scan(&n)
		return err == nil && n > 0 && running() > 0
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dev did not exit cleanly on SIGTERM: %v\n%s", err, logs.String())
	}
	if n := running(); n != 0 {
		t.Errorf("%d jobs left claimed or running after dev stopped:\n%s", n, logs.String())
	}
	var released, crashed int
	if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'release'), count(*) FILTER (WHERE kind = 'crash') FROM agent_job_events`).Scan(&released, &crashed); err != nil {
		t.Fatal(err)
	}
	if released == 0 || crashed != 0 {
		t.Errorf("dev's jobs in flight: %d released, %d crashed; want them released, none crashed\n%s", released, crashed, logs.String())
	}
}
