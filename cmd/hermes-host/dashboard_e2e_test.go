package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/gavv/httpexpect/v2"

	"hermeshost/assertion"
	"hermeshost/gateway"
	"hermeshost/internal/hosttest"
	"hermeshost/internal/testio"
	"hermeshost/orghome/hermesstate"
	"hermeshost/pg/pgtest"
)

// The dashboards end to end, as a newcomer's `make run` has them: `hermes-host dev` runs the
// launcher, the dispatcher and the rest; an operator logs in with the login it prints, opens
// an org's dashboard (the dispatcher starts `hermes-host dashboard` through its runtime) and
// reads every page through the launcher's proxy.

const (
	devGatewaySecret   = "dev-test-secret"
	devDashboardSecret = "dev-test-dashboard-secret-0123456789"
	fixtureSessions    = 30
	needle             = "zanzibar"
)

// fixtureHome fills acme's home with Hermes' own files: sessions in the pinned release's
// state.db shape (one with a transcript holding the search word and a tool call), memory, a
// skill two levels deep.
func fixtureHome(t *testing.T, home string) (transcriptID string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(home, "memories"), 0o700); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	db, err := hermesstate.Create(ctx, filepath.Join(home, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	base := float64(time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC).Unix())
	for i := range fixtureSessions {
		id := fmt.Sprintf("20261120_%06d_%06x", 90000+i, i)
		s := hermesstate.Session{ID: id, Source: "tool", Model: "demo-worker", StartedAt: base + float64(i*60), SystemPrompt: "You are acme's agent."}
		if i%3 == 0 {
			s.Source, s.Title = "cli", fmt.Sprintf("Planning round %d", i)
		}
		if err := hermesstate.InsertSession(ctx, db, s); err != nil {
			t.Fatal(err)
		}
		if err := hermesstate.InsertMessage(ctx, db, hermesstate.Message{SessionID: id, Role: "user", Content: fmt.Sprintf("Task %d", i), Timestamp: s.StartedAt + 1}); err != nil {
			t.Fatal(err)
		}
		if i == 7 {
			transcriptID = id
			for _, m := range []hermesstate.Message{
				{SessionID: id, Role: "assistant", ToolCalls: []hermesstate.ToolCall{{ID: "call_1", Name: "terminal", Arguments: `{"command": "sartiq call listProducts"}`}}, Timestamp: s.StartedAt + 2},
				{SessionID: id, Role: "tool", ToolName: "terminal", ToolCallID: "call_1", Content: `{"products": []}`, Timestamp: s.StartedAt + 3},
				{SessionID: id, Role: "assistant", Content: "The catalogue mentions " + needle + " twice.", Timestamp: s.StartedAt + 4},
			} {
				if err := hermesstate.InsertMessage(ctx, db, m); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	files := map[string]string{
		"memories/MEMORY.md":                   "Acme ships on Tuesdays.\n§\nThe brand colour is teal.",
		"skills/research/brand-voice/SKILL.md": "---\nname: brand-voice\ndescription: Write in acme's voice.\n---\nUse short sentences.\n",
	}
	for name, content := range files {
		p := filepath.Join(home, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return transcriptID
}

type devRun struct {
	launcher string
	login    [2]string
	// backendDB is the reference backend's database (its schema in the URL).
	backendDB string
	logs      *testio.Buffer
	stdout    *testio.Buffer
	cmd       *exec.Cmd
}

// startDev runs `hermes-host dev` on fresh schemas with env added, until the test ends.
func startDev(t *testing.T, orgsRoot string, env ...string) *devRun {
	t.Helper()
	return startDevAt(t, orgsRoot, nil, env...)
}

// startDevAt is startDev with some of its listen addresses given (flag to address).
func startDevAt(t *testing.T, orgsRoot string, addrs map[string]string, env ...string) *devRun {
	t.Helper()
	url, _ := pgtest.EmptySchema(t)
	backendURL, _ := pgtest.EmptySchema(t)
	args := []string{"dev", "--orgs-root", orgsRoot}
	for _, flag := range []string{"--addr", "--backend-addr", "--gateway-addr", "--launcher-addr", "--control-addr"} {
		addr := "127.0.0.1:0"
		if a, ok := addrs[flag]; ok {
			addr = a
		}
		args = append(args, flag, addr)
	}
	cmd := exec.Command(binary, args...)
	var stdout testio.Buffer
	logs := &testio.Buffer{}
	cmd.Stdout = &stdout
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + url, "BACKEND_DATABASE_URL=" + backendURL,
		"GATEWAY_SECRET=" + devGatewaySecret, "DASHBOARD_SECRET=" + devDashboardSecret, "CLAIM_ENABLED=false"}, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	run := &devRun{logs: logs, stdout: &stdout, cmd: cmd, backendDB: backendURL}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("dev's log:\n%s", logs.String())
		}
	})
	up := make(chan struct{})
	go func() {
		lines := bufio.NewScanner(stderr)
		lines.Buffer(make([]byte, 64<<10), 1<<20)
		signalled := false
		for lines.Scan() {
			logs.Write(append(lines.Bytes(), '\n'))
			var ev struct {
				Msg string `json:"msg"`
			}
			if !signalled && json.Unmarshal(lines.Bytes(), &ev) == nil && ev.Msg == "hermes-host dev is up" {
				signalled = true
				close(up)
			}
		}
	}()
	select {
	case <-up:
	case <-time.After(90 * time.Second):
		t.Fatalf("dev never came up:\n%s", logs.String())
	}
	var printed []string
	waitUntil(t, 10*time.Second, func() bool {
		printed = regexp.MustCompile(`(?m)^Launcher: (\S+)\nLog in as (\S+) with password (\S+)`).FindStringSubmatch(stdout.String())
		return printed != nil
	})
	run.launcher, run.login = printed[1], [2]string{printed[2], printed[3]}
	return run
}

// operatorBrowser is httpexpect as the logged-in operator, with a cookie jar, following
// no redirects (the tests read each answer).
func (d *devRun) operatorBrowser(t *testing.T) *httpexpect.Expect {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	e := httpexpect.WithConfig(httpexpect.Config{
		BaseURL:  d.launcher,
		Reporter: httpexpect.NewRequireReporter(t),
		Client: &http.Client{Jar: jar, Timeout: 30 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
	})
	e.POST("/login").WithFormField("name", d.login[0]).WithFormField("password", d.login[1]).
		Expect().Status(http.StatusSeeOther)
	return e
}

func parse(t *testing.T, html string) *goquery.Document {
	t.Helper()
	doc, err := goquery.NewDocumentFromReader(strings.NewReader(html))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func byTestID(doc *goquery.Document, id string) *goquery.Selection {
	return doc.Find(`[data-testid="` + id + `"]`)
}

// openDashboard asks for org's overview until the dashboard answers it (the first answers
// say it is starting) and returns the overview's HTML.
func openDashboard(t *testing.T, e *httpexpect.Expect, org string, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	sawStarting := false
	for {
		resp := e.GET("/orgs/" + org + "/").Expect()
		body := resp.Body().Raw()
		switch resp.Raw().StatusCode {
		case http.StatusOK:
			if !sawStarting {
				t.Logf("the dashboard of %s answered at once", org)
			}
			return body
		case http.StatusServiceUnavailable:
			doc := parse(t, body)
			if byTestID(doc, "dashboard-failed").Length() > 0 {
				t.Fatalf("the dashboard of %s failed to start: %s", org, byTestID(doc, "dashboard-failed").Text())
			}
			if byTestID(doc, "dashboard-starting").Length() == 0 {
				t.Fatalf("503 without the starting page:\n%s", body)
			}
			sawStarting = true
		default:
			t.Fatalf("GET /orgs/%s/: %d\n%s", org, resp.Raw().StatusCode, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dashboard of %s did not answer within %s", org, within)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// dashboardPIDs are the running `hermes-host dashboard --org org` processes whose home is
// home (as they see it), in a process or a container alike (a container's processes are the
// host's too). The home tells this test's dashboards from other packages' tests', which run
// beside it.
func dashboardPIDs(org, home string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	want := []byte("dashboard\x00--org\x00" + org + "\x00")
	mine := []byte("HERMES_HOME=" + home + "\x00")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, want) {
			continue
		}
		if env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ")); err == nil && bytes.Contains(env, mine) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func TestDevOpensDashboardsThroughTheLauncher(t *testing.T) {
	t.Run("process", func(t *testing.T) {
		testDashboardsThroughTheLauncher(t, "", "HERMES_RUNTIME=process", "DOCKER_HOST=unix:///nonexistent/docker.sock")
	})
	t.Run("docker", func(t *testing.T) {
		if err := exec.Command("docker", "info").Run(); err != nil {
			t.Skip("no Docker engine answers (make test starts one): ", err)
		}
		hosttest.LockDemoOrgContainers(t, 3*time.Minute)
		// The images are FROM scratch, of static binaries; the test's own hermes-host is not.
		bins := t.TempDir()
		if err := hosttest.BuildBinaries(bins); err != nil {
			t.Fatal(err)
		}
		tag := fmt.Sprintf("dash-e2e-%d", time.Now().UnixNano())
		images := []string{"HERMES_WORKER_IMAGE=hermes-host-worker:" + tag, "HERMES_DASHBOARD_IMAGE=hermes-host-dashboard:" + tag}
		build := exec.Command(filepath.Join(bins, "hermes-host"), "images", "build", filepath.Join(bins, "hermes-host"), filepath.Join(bins, "scripted-agent"))
		build.Env = append([]string{"PATH=" + os.Getenv("PATH")}, images...)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("images build: %v\n%s", err, out)
		}
		t.Cleanup(func() {
			_ = exec.Command("docker", "rmi", "-f", "hermes-host-worker:"+tag, "hermes-host-dashboard:"+tag).Run()
		})
		// Inside its container a dashboard's home is the runtime's mount point.
		testDashboardsThroughTheLauncher(t, "/home/hermes", append(images, "HERMES_RUNTIME=docker")...)
	})
}

// testDashboardsThroughTheLauncher runs the test on dev with env added; containerHome is
// where a dashboard sees its home ("": its own folder, on the process runtime).
func testDashboardsThroughTheLauncher(t *testing.T, containerHome string, env ...string) {
	orgs := t.TempDir()
	acmeHome := containerHome
	if acmeHome == "" {
		acmeHome = filepath.Join(orgs, "acme")
	}
	transcript := fixtureHome(t, filepath.Join(orgs, "acme"))
	dev := startDev(t, orgs, env...)
	e := dev.operatorBrowser(t)

	// The index links each org to its dashboard.
	index := parse(t, e.GET("/").Expect().Status(http.StatusOK).Body().Raw())
	if href, _ := byTestID(index, "open-acme").Attr("href"); href != "/orgs/acme/" {
		t.Fatalf("the index's link to acme's dashboard: %q", href)
	}

	var pages []string
	overview := openDashboard(t, e, "acme", 90*time.Second)
	pages = append(pages, overview)
	doc := parse(t, overview)
	if got := byTestID(doc, "dashboard-org").Text(); !strings.Contains(got, "acme") {
		t.Fatalf("overview of %q", got)
	}
	if got := strings.TrimSpace(byTestID(doc, "operator").Text()); got != dev.login[0] {
		t.Fatalf("the dashboard says the operator is %q, want %q", got, dev.login[0])
	}
	if byTestID(doc, "identity-version").Length() == 0 {
		t.Fatalf("no identity on the overview:\n%s", overview)
	}

	// Sessions, newest first, paged by keyset.
	first := e.GET("/orgs/acme/sessions").Expect().Status(http.StatusOK).Body().Raw()
	pages = append(pages, first)
	doc = parse(t, first)
	seen := map[string]bool{}
	collect := func(d *goquery.Document) {
		byTestID(d, "session-link").Each(func(_ int, s *goquery.Selection) {
			href, _ := s.Attr("href")
			seen[href] = true
		})
	}
	collect(doc)
	for range fixtureSessions {
		next, ok := byTestID(doc, "sessions-next").Attr("href")
		if !ok {
			break
		}
		if !strings.HasPrefix(next, "/orgs/acme/sessions?") {
			t.Fatalf("next page link %q leaves the prefix", next)
		}
		page := e.GET(next).Expect().Status(http.StatusOK).Body().Raw()
		doc = parse(t, page)
		collect(doc)
	}
	if len(seen) != fixtureSessions {
		t.Fatalf("paged through %d sessions, want %d", len(seen), fixtureSessions)
	}

	// Search through state.db's own index.
	found := parse(t, e.GET("/orgs/acme/sessions").WithQuery("q", needle).Expect().Status(http.StatusOK).Body().Raw())
	if href, _ := byTestID(found, "session-link").Attr("href"); byTestID(found, "session-link").Length() != 1 || href != "/orgs/acme/sessions/"+transcript {
		t.Fatalf("search for %q found %d sessions (%q)", needle, byTestID(found, "session-link").Length(), href)
	}

	// A transcript, with its tool call compact.
	tr := e.GET("/orgs/acme/sessions/" + transcript).Expect().Status(http.StatusOK).Body().Raw()
	pages = append(pages, tr)
	doc = parse(t, tr)
	if byTestID(doc, "tool-call-name").First().Text() != "terminal" || !strings.Contains(byTestID(doc, "transcript").Text(), needle) {
		t.Fatalf("transcript:\n%s", tr)
	}
	if byTestID(doc, "system-prompt").Length() != 0 {
		t.Fatal("the system prompt is shown without being asked for")
	}

	mem := e.GET("/orgs/acme/memory").Expect().Status(http.StatusOK).Body().Raw()
	pages = append(pages, mem)
	if n := byTestID(parse(t, mem), "memory-entry").Length(); n != 2 {
		t.Fatalf("%d memory entries, want 2", n)
	}
	skills := e.GET("/orgs/acme/skills").Expect().Status(http.StatusOK).Body().Raw()
	pages = append(pages, skills)
	if got := byTestID(parse(t, skills), "skill-name").Text(); !strings.Contains(got, "brand-voice") {
		t.Fatalf("skills: %q", got)
	}
	// The dashboard's static files come from the launcher under the prefix.
	e.GET("/orgs/acme/static/app.css").Expect().Status(http.StatusOK).HasContentType("text/css")

	// globex's home is empty: every page says what to do next.
	openDashboard(t, e, "globex", 90*time.Second)
	empty := parse(t, e.GET("/orgs/globex/sessions").Expect().Status(http.StatusOK).Body().Raw())
	if byTestID(empty, "sessions-no-state").Length() != 1 {
		t.Fatal("globex's sessions page lacks its empty state")
	}
	// acme's session is not globex's.
	e.GET("/orgs/globex/sessions/" + transcript).Expect().Status(http.StatusNotFound)

	// An org the operator holds no grant for: 403 for its pages and any proxied path.
	for _, p := range []string{"/orgs/initech/", "/orgs/initech/sessions", "/orgs/initech/anything/at/all"} {
		e.GET(p).Expect().Status(http.StatusForbidden)
	}

	// No key or secret in any page.
	gwKey, _ := gateway.OrgKey(devGatewaySecret, "acme")
	asKey, _ := assertion.OrgKey(devDashboardSecret, "acme")
	for _, p := range pages {
		for _, secret := range []string{devGatewaySecret, devDashboardSecret, gwKey, asKey, "hck_"} {
			if strings.Contains(p, secret) {
				t.Fatalf("a page holds a secret (%.8s...)", secret)
			}
		}
	}

	// The org's agent answers a chat, started by the dashboard the dispatcher runs (the agent
	// command and model reach it from the dispatcher as they reach workers).
	sent := e.POST("/orgs/acme/chat").WithHeader("Origin", dev.launcher).
		WithFormField("message", "What ships on Tuesdays?").Expect().Status(http.StatusSeeOther)
	turn := sent.Header("Location").Raw()
	if !strings.HasPrefix(turn, "/orgs/acme/chat/turns/") {
		t.Fatalf("the chat led to %q", turn)
	}
	var state, answer, reason string
	waitUntil(t, 60*time.Second, func() bool {
		doc := parse(t, e.GET(turn).Expect().Status(http.StatusOK).Body().Raw())
		state = strings.TrimSpace(byTestID(doc, "chat-state").Text())
		answer = strings.TrimSpace(byTestID(doc, "chat-answer").Text())
		reason = strings.TrimSpace(byTestID(doc, "chat-reason").Text())
		return answer != "" || strings.Contains(state, "failed") || strings.Contains(state, "stopped")
	})
	if !strings.Contains(answer, "demo reply") {
		t.Fatalf("the chat turn ended %q (%s) without the model's answer: %q", state, reason, answer)
	}

	// A dashboard that died is started again on the next request.
	pids := dashboardPIDs("acme", acmeHome)
	if len(pids) == 0 {
		t.Fatal("no hermes-host dashboard process for acme")
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	waitUntil(t, 30*time.Second, func() bool { return len(dashboardPIDs("acme", acmeHome)) == 0 })
	again := openDashboard(t, e, "acme", 90*time.Second)
	if byTestID(parse(t, again), "identity-version").Length() == 0 {
		t.Fatalf("the restarted dashboard's overview:\n%s", again)
	}
	if after := dashboardPIDs("acme", acmeHome); len(after) == 0 || after[0] == pids[0] {
		t.Fatalf("the dashboard was not started anew: %v then %v", pids, after)
	}
}
