package deploy

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/docker/go-connections/nat"
	"github.com/jackc/pgx/v5"

	"hermeshost/dispatch/runtime"
	"hermeshost/internal/hosttest"
)

// TestComposeTopologyRunsForReal starts what deploy/compose.yaml describes, service by
// service, from the file's own definitions (command, environment, secrets, volumes,
// networks, ports, user, capabilities, read-only root, healthchecks, restart policies,
// dependency order), translated to Engine API calls as `docker compose --profile demo up`
// would make them. The values come from an env file and the secrets from files in
// secrets/, as an operator writes them (README, "Secrets"), so every service reads its
// secrets through their _FILE forms, and none is in a container's environment. The only
// substitutions are the images (FROM scratch images of the project's static binaries, with the scripted agent as
// the org image's Hermes, since no registry is reachable here) and the postgres service: no
// Postgres image can be pulled either, so the host's own Postgres binaries run a private
// cluster that listens on the db network's gateway address, and `postgres` resolves to it
// in the containers. Then: every /healthz, the launcher's login page and a first login
// made as the README says, the dispatcher claiming and completing the reference backend's
// demo jobs in org units on the internal units network, and a dashboard opened through the
// launcher over the socket folder both share with the host.
func TestComposeTopologyRunsForReal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	began := time.Now()
	phase := func(what string) { t.Logf("%5.1fs %s", time.Since(began).Seconds(), what) }
	cli := requireEngine(t, ctx)
	pgBin := requirePostgres(t)
	// The demo orgs' containers (hermes-org-acme, ...) are one per engine, and a dispatcher
	// removes what another instance left in its scope: such tests take turns.
	hosttest.LockDemoOrgContainers(t, 5*time.Minute)
	phase("demo orgs' containers locked for this test")

	id := randomHex(t, 4)
	project := "hermes-deploy-" + id
	data, err := os.MkdirTemp("", project+"-data-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(data) })
	if err := os.Chmod(data, 0o755); err != nil {
		t.Fatal(err)
	}

	hostImage, orgImage := "hermes-deploy-host:"+id, "hermes-deploy-org:"+id
	buildImages(t, ctx, cli, hostImage, orgImage)

	launcherPort := hosttest.FreePort(t)
	env := map[string]string{
		"HERMES_HOST_IMAGE": hostImage,
		"HERMES_ORG_IMAGE":  orgImage,
		"HERMES_DATA":       data,
		"HERMES_INSTANCE":   project,
		"DOCKER_SOCKET":     dockerSocket(t),
		"SARTIQ_API_URL":    "http://backend:8090",
		"CLAIM_ENABLED":     "true",
		"POLL_INTERVAL":     "1s",
		"GATEWAY_UPSTREAM":  "demo",
		// The org image's agent: the scripted stand-in for Hermes.
		"HERMES_BIN":            "scripted-agent",
		"LAUNCHER_BIND":         "127.0.0.1",
		"LAUNCHER_PORT":         strconv.Itoa(launcherPort),
		"SESSION_COOKIE_SECURE": "false", // plain HTTP on loopback here
	}
	pgPassword := randomHex(t, 16)
	secrets := map[string]string{
		"postgres_password": pgPassword,
		"database_url":      "postgres://hermes:" + pgPassword + "@postgres:5432/hermes?sslmode=disable",
		"sartiq_bot_token":  randomHex(t, 16),
		"gateway_secret":    randomHex(t, 16),
		"gateway_key":       randomHex(t, 16),
		"control_secret":    randomHex(t, 16),
		"dashboard_secret":  randomHex(t, 16),
	}
	f, err := loadCompose(env)
	if err != nil {
		t.Fatal(err)
	}
	up := &topology{t: t, cli: cli, file: f, project: project, profiles: []string{"demo"}, containers: map[string]string{}}
	t.Cleanup(up.down)
	phase("images built")
	up.writeSecrets(secrets)
	up.networks(ctx)
	up.postgres(ctx, pgBin)
	phase("networks made, Postgres stand-in listening")
	for _, name := range up.order() {
		up.start(ctx, name)
	}
	for _, name := range up.order() {
		if f.Services[name].Healthcheck != nil {
			up.waitHealthy(ctx, name)
		}
	}
	phase("every service started and healthy")

	// Every server answers /healthz on its address in the hermes network.
	for name, port := range map[string]int{"gateway": 8091, "dispatcher": 8092, "launcher": 8093, "backend": 8090} {
		if code, body := get(t, fmt.Sprintf("http://%s:%d/healthz", up.ip(ctx, name, "hermes"), port)); code != http.StatusOK {
			t.Errorf("%s /healthz: %d %s", name, code, body)
		}
	}
	// Only the dispatcher holds the Docker socket, and no service has a secret in its
	// environment, which `docker inspect` shows: they came from the mounted files.
	for name, id := range up.containers {
		info, err := cli.ContainerInspect(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range info.Mounts {
			if strings.Contains(m.Source, "docker.sock") && name != "dispatcher" {
				t.Errorf("%s has the Docker socket mounted", name)
			}
		}
		for _, kv := range info.Config.Env {
			k, v, _ := strings.Cut(kv, "=")
			if secretVars()[k] {
				t.Errorf("%s has the secret %s in its environment", name, k)
			}
			for secret, value := range secrets {
				if strings.Contains(v, value) {
					t.Errorf("%s has the value of the secret %s in its environment (%s)", name, secret, k)
				}
			}
		}
	}

	// The launcher's login page, on its published port, and a first login made as the
	// README says: an operator added and granted with one-off runs of the migrate service.
	launcher := fmt.Sprintf("http://127.0.0.1:%d", launcherPort)
	if code, body := get(t, launcher+"/login"); code != http.StatusOK || !strings.Contains(body, `name="password"`) {
		t.Fatalf("launcher /login: %d\n%s", code, body)
	}
	added := up.run(ctx, "migrate", []string{"operator", "add", "admin"})
	password := regexp.MustCompile(`password \(shown once\): (\S+)`).FindStringSubmatch(added)
	if password == nil {
		t.Fatalf("operator add printed no password:\n%s", added)
	}
	up.run(ctx, "migrate", []string{"operator", "grant", "admin", "acme", "globex"})
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	resp, err := browser.PostForm(launcher+"/login", url.Values{"name": {"admin"}, "password": {password[1]}})
	if err != nil {
		t.Fatal(err)
	}
	index, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(index), `/orgs/acme/`) {
		t.Fatalf("after login: %d\n%s", resp.StatusCode, index)
	}

	// The dispatcher claims the demo jobs and completes them in the orgs' units.
	db := up.connect(ctx)
	deadline := time.Now().Add(4 * time.Minute)
	for {
		var total, done int
		err := db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'COMPLETED') FROM sartiq_backend.agent_jobs`).Scan(&total, &done)
		if err == nil && total > 0 && done == total {
			phase(fmt.Sprintf("%d demo jobs completed", done))
			break
		}
		if time.Now().After(deadline) {
			rows, _ := db.Query(ctx, `SELECT id::text, organization_id::text, status, attempt FROM sartiq_backend.agent_jobs`)
			jobs, _ := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
				var id, org, status string
				var attempt int
				err := r.Scan(&id, &org, &status, &attempt)
				return fmt.Sprintf("%s %s %s attempt %d", id, org, status, attempt), err
			})
			t.Fatalf("demo jobs not completed within 4 minutes (%d of %d, err %v): %v", done, total, err, jobs)
		}
		time.Sleep(time.Second)
	}
	var attempts int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM hermes_host.claim_attempts WHERE instance = $1 AND outcome = 'completed'`, project).Scan(&attempts); err != nil || attempts == 0 {
		t.Errorf("claim_attempts of %s completed: %d, %v", project, attempts, err)
	}

	// Each org's worker ran on the internal units network, started by this instance, with
	// nothing of the host's but its own folders and sockets.
	units, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", runtime.LabelInstance+"="+project), filters.Arg("label", runtime.LabelRole+"=worker"))})
	if err != nil {
		t.Fatal(err)
	}
	if len(units) < 2 {
		t.Fatalf("org workers of %s: %d", project, len(units))
	}
	for _, u := range units {
		info, err := cli.ContainerInspect(ctx, u.ID)
		if err != nil {
			t.Fatal(err)
		}
		if info.HostConfig.NetworkMode != "hermes-units" {
			t.Errorf("%s is on network %s", info.Name, info.HostConfig.NetworkMode)
		}
		for _, m := range info.Mounts {
			if m.Type == "bind" && !strings.HasPrefix(m.Source, data+"/") {
				t.Errorf("%s mounts %s from outside HERMES_DATA", info.Name, m.Source)
			}
		}
	}
	unitsNet, err := cli.NetworkInspect(ctx, "hermes-units", network.InspectOptions{})
	if err != nil || !unitsNet.Internal {
		t.Errorf("hermes-units: internal %v, %v", unitsNet.Internal, err)
	}

	// A dashboard opened through the launcher: the dispatcher starts it in a unit, it serves
	// on a socket under RUN_ROOT, and the launcher reaches that socket at the same path.
	deadline = time.Now().Add(90 * time.Second)
	for {
		resp, err := browser.Get(launcher + "/orgs/acme/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			if !strings.Contains(string(body), `data-testid="dashboard-org"`) {
				t.Fatalf("acme's dashboard through the launcher:\n%s", body)
			}
			break
		}
		if resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(string(body), `data-testid="dashboard-failed"`) || time.Now().After(deadline) {
			t.Fatalf("acme's dashboard through the launcher: %d\n%s", resp.StatusCode, body)
		}
		time.Sleep(500 * time.Millisecond)
	}
	phase("acme's dashboard answered through the launcher")

	// The dispatcher's /metrics, as Prometheus scrapes it on the hermes network, counts the
	// claims the alert rules watch.
	_, metrics := get(t, fmt.Sprintf("http://%s:8092/metrics", up.ip(ctx, "dispatcher", "hermes")))
	if !regexp.MustCompile(`(?m)^hermes_dispatch_claims_total\{kind="claim"\} [1-9]`).MatchString(metrics) {
		t.Errorf("dispatcher /metrics counts no claims:\n%s", grepLines(metrics, "hermes_dispatch_"))
	}
	// Its own leases are kept on a pool of their own beside the main one: the claim's
	// refresh of acme's org: lease and the release of its home: lease went through it
	// (beyond the ping that opened it).
	for _, want := range []string{`hermes_db_pool_max_conns{pool="main"} 16`, `hermes_db_pool_max_conns{pool="leases"} 4`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("dispatcher /metrics lacks %q:\n%s", want, grepLines(metrics, "hermes_db_pool_"))
		}
	}
	if m := regexp.MustCompile(`(?m)^hermes_db_pool_acquires_total\{pool="leases"\} (\d+)`).FindStringSubmatch(metrics); m == nil || m[1] == "0" || m[1] == "1" {
		t.Errorf("the dispatcher's lease pool served no refresh or release:\n%s", grepLines(metrics, "hermes_db_pool_"))
	}
	// acme's dashboard's own metrics, from its socket in its unit, with acme's label.
	_, dashMetrics := get(t, fmt.Sprintf("http://%s:8092/metrics/dashboards", up.ip(ctx, "dispatcher", "hermes")))
	for _, want := range []string{`hermes_dashboard_scrape_up{org="acme"} 1`, `http_requests_total{`} {
		if !strings.Contains(dashMetrics, want) {
			t.Errorf("dispatcher /metrics/dashboards lacks %q:\n%s", want, dashMetrics)
		}
	}
	if !regexp.MustCompile(`(?m)^http_requests_total\{[^}]*org="acme"`).MatchString(dashMetrics) {
		t.Errorf("the dashboard's request counts are not labelled acme:\n%s", grepLines(dashMetrics, "http_requests_total"))
	}

	// An upgrade: the dispatcher stopped as compose stops it (SIGTERM, within its
	// stop_grace_period) exits cleanly and leaves the org units running; a new one under the
	// same HERMES_INSTANCE adopts them.
	old := up.containers["dispatcher"]
	if err := cli.ContainerStop(ctx, old, container.StopOptions{}); err != nil {
		t.Fatal(err)
	}
	if code := up.wait(ctx, old); code != 0 {
		t.Fatalf("the dispatcher exited %d on SIGTERM:\n%s", code, up.logs(old))
	}
	for _, u := range units {
		info, err := cli.ContainerInspect(ctx, u.ID)
		if err != nil || !info.State.Running {
			t.Fatalf("org worker %s after the dispatcher stopped: %v", u.Names, err)
		}
	}
	phase("dispatcher stopped on SIGTERM, org units left running")
	if err := cli.ContainerRemove(ctx, old, container.RemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	up.start(ctx, "dispatcher")
	up.waitHealthy(ctx, "dispatcher")
	if logs := up.logsTail(up.containers["dispatcher"], "all"); !regexp.MustCompile(`"msg":"container adopted"[^\n]*"container":"hermes-org-acme"`).MatchString(logs) {
		t.Errorf("the new dispatcher did not adopt hermes-org-acme:\n%s", logs)
	}
	phase("a new dispatcher adopted them")
}

// requireEngine is a client of the local engine; without one the test skips, except under
// CI, which must run it.
func requireEngine(t *testing.T, ctx context.Context) *client.Client {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = cli.Ping(pctx)
		cancel()
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, so the deployment must run: no Docker engine answers: %v", err)
		}
		t.Skipf("no Docker engine answers (%v); start dockerd (scripts/docker.sh start) to run the deployment", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// requirePostgres finds the folder of the host's Postgres server binaries.
func requirePostgres(t *testing.T) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	if p, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("CI is set, so the deployment must run: no Postgres server binaries (initdb) here")
	}
	t.Skip("no Postgres server binaries (initdb) here to stand in for the postgres image")
	return ""
}

func pgVersion(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// buildImages builds the scratch stand-ins: the host image as deploy/Dockerfile.host's final
// stage lays it out (the binaries in /usr/local/bin, the gateway's login folder the nonroot
// user's, that user, hermes-host as the entry point), and the org image as the runtime's
// worker image of hermes-host and the scripted agent.
func buildImages(t *testing.T, ctx context.Context, cli *client.Client, hostTag, orgTag string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dockerfile := "FROM scratch\nCOPY bin/ /usr/local/bin/\nCOPY --chown=65532:65532 gateway/ /var/lib/hermes/gateway/\n" +
		"ENV PATH=/usr/local/bin\nUSER 65532:65532\nENTRYPOINT [\"hermes-host\"]\nCMD [\"--help\"]\n"
	epoch := time.Unix(0, 0)
	add := func(h *tar.Header, body []byte) {
		h.ModTime = epoch
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	add(&tar.Header{Name: "Dockerfile", Mode: 0o644}, []byte(dockerfile))
	add(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	add(&tar.Header{Name: "gateway/", Typeflag: tar.TypeDir, Mode: 0o700}, nil)
	for _, name := range []string{"hermes-host", "hermes-healthcheck"} {
		b, err := os.ReadFile(filepath.Join(bins, name))
		if err != nil {
			t.Fatal(err)
		}
		add(&tar.Header{Name: "bin/" + name, Mode: 0o755}, b)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.ImageBuild(ctx, &buf, build.ImageBuildOptions{Tags: []string{hostTag}, Dockerfile: "Dockerfile",
		Remove: true, ForceRemove: true, Version: build.BuilderV1})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if bytes.Contains(out, []byte(`"error"`)) {
		t.Fatalf("build %s: %s", hostTag, out)
	}
	t.Cleanup(func() { removeImage(cli, hostTag) })

	org := runtime.HostImages(orgTag, orgTag+"-unused", []string{filepath.Join(bins, "hermes-host"), filepath.Join(bins, "scripted-agent")})[0]
	if _, err := runtime.BuildScratchImage(ctx, cli, org); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeImage(cli, orgTag) })
}

func removeImage(cli *client.Client, tag string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = cli.ImageRemove(ctx, tag, image.RemoveOptions{Force: true, PruneChildren: true})
}

// topology is one run of the compose file's services on the engine.
type topology struct {
	t          *testing.T
	cli        *client.Client
	file       composeFile
	project    string
	profiles   []string
	containers map[string]string // service to container ID
	oneOffs    []string
	nets       map[string]network.Inspect
	vols       []string
	pg         *exec.Cmd
	pgDir      string
	pgGateway  string
	// secrets is where each declared secret's file is, as compose resolves ./secrets/<name>
	// beside the compose file.
	secrets map[string]string
}

// writeSecrets writes each secret the file declares into a folder standing in for deploy/,
// as README "Secrets" has operators write them: the value and a newline, owned by the host
// processes' user (65532), mode 0400. Compose bind-mounts such a file as it is, so a test
// that is not root, and cannot give it away, leaves it readable to all instead (in a 0700
// folder).
func (u *topology) writeSecrets(values map[string]string) {
	t := u.t
	dir, err := os.MkdirTemp("", u.project+"-compose-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	root := os.Geteuid() == 0
	u.secrets = map[string]string{}
	for name, decl := range u.file.Secrets {
		value, ok := values[name]
		if !ok {
			t.Fatalf("compose.yaml declares the secret %s, which the test has no value for", name)
		}
		p := filepath.Join(dir, decl.File)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o444)
		if root {
			mode = 0o400
		}
		if err := os.WriteFile(p, []byte(value+"\n"), mode); err != nil {
			t.Fatal(err)
		}
		if root {
			if err := os.Chown(p, 65532, 65532); err != nil {
				t.Fatal(err)
			}
		}
		u.secrets[name] = p
	}
}

// secretFile is the file on the host behind a service's NAME_FILE=/run/secrets/<name>.
func (u *topology) secretFile(service, fileVar string) string {
	name, ok := strings.CutPrefix(u.file.Services[service].Environment[fileVar], "/run/secrets/")
	if !ok || u.secrets[name] == "" || !slices.Contains(u.file.Services[service].Secrets, name) {
		u.t.Fatalf("%s: %s does not name a secret the service mounts", service, fileVar)
	}
	return u.secrets[name]
}

// active says whether a service runs with the topology's profiles.
func (u *topology) active(name string) bool {
	p := u.file.Services[name].Profiles
	return len(p) == 0 || slices.ContainsFunc(p, func(s string) bool { return slices.Contains(u.profiles, s) })
}

// order is the active services but postgres (which runs on the host here), dependencies
// first.
func (u *topology) order() []string {
	var out []string
	seen := map[string]bool{"postgres": true}
	var visit func(string)
	visit = func(name string) {
		if seen[name] || !u.active(name) {
			return
		}
		seen[name] = true
		deps := make([]string, 0, len(u.file.Services[name].DependsOn))
		for d := range u.file.Services[name].DependsOn {
			deps = append(deps, d)
		}
		sort.Strings(deps)
		for _, d := range deps {
			visit(d)
		}
		out = append(out, name)
	}
	names := make([]string, 0, len(u.file.Services))
	for n := range u.file.Services {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		visit(n)
	}
	return out
}

// networks makes the file's networks as compose names them (<project>_<name>).
func (u *topology) networks(ctx context.Context) {
	u.nets = map[string]network.Inspect{}
	for name, n := range u.file.Networks {
		full := u.project + "_" + name
		created, err := u.cli.NetworkCreate(ctx, full, network.CreateOptions{Driver: "bridge", Internal: n.Internal,
			Labels: map[string]string{"com.docker.compose.project": u.project, "com.docker.compose.network": name}})
		if err != nil {
			u.t.Fatalf("create network %s: %v", full, err)
		}
		info, err := u.cli.NetworkInspect(ctx, created.ID, network.InspectOptions{})
		if err != nil {
			u.t.Fatal(err)
		}
		u.nets[name] = info
	}
}

// postgres stands in for the postgres service: a private cluster of the host's binaries
// made as the official image makes its own from POSTGRES_USER, POSTGRES_PASSWORD_FILE
// (which its entrypoint reads as root, as the test does here) and POSTGRES_DB, listening on
// the gateway address of the service's network.
func (u *topology) postgres(ctx context.Context, bin string) {
	t := u.t
	svc := u.file.Services["postgres"]
	if len(svc.Networks) != 1 {
		t.Fatalf("postgres is on %v; the stand-in listens on one network", svc.Networks)
	}
	ipam := u.nets[svc.Networks[0]].IPAM.Config
	if len(ipam) == 0 || ipam[0].Gateway == "" {
		t.Fatalf("network %s has no gateway address", svc.Networks[0])
	}
	u.pgGateway = ipam[0].Gateway
	dir, err := os.MkdirTemp("", u.project+"-pg-")
	if err != nil {
		t.Fatal(err)
	}
	u.pgDir = dir
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	password, err := os.ReadFile(u.secretFile("postgres", "POSTGRES_PASSWORD_FILE"))
	if err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(dir, "pwfile") // initdb reads its first line
	if err := os.WriteFile(pw, password, 0o600); err != nil {
		t.Fatal(err)
	}
	// initdb refuses root: the cluster is the postgres user's when the test runs as root.
	asOwner := func(name string, args ...string) *exec.Cmd {
		if os.Geteuid() == 0 {
			return exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(bin, name)}, args...)...)
		}
		return exec.Command(filepath.Join(bin, name), args...)
	}
	if os.Geteuid() == 0 {
		pg, err := user.Lookup("postgres")
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(pg.Uid)
		gid, _ := strconv.Atoi(pg.Gid)
		for _, p := range []string{dir, pw} {
			if err := os.Chown(p, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	dataDir := filepath.Join(dir, "data")
	if out, err := asOwner("initdb", "-D", dataDir, "-U", svc.Environment["POSTGRES_USER"], "--pwfile", pw,
		"--auth-local=trust", "--auth-host=scram-sha-256").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	subnet := u.nets[svc.Networks[0]].IPAM.Config[0].Subnet
	hba, err := os.OpenFile(filepath.Join(dataDir, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(hba, "host all all %s scram-sha-256\n", subnet)
	hba.Close()
	u.pg = asOwner("postgres", "-D", dataDir, "-c", "listen_addresses="+u.pgGateway, "-p", "5432",
		"-c", "unix_socket_directories="+dir, "-c", "fsync=off")
	logFile, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	u.pg.Stdout, u.pg.Stderr = logFile, logFile
	if err := u.pg.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for exec.Command(filepath.Join(bin, "pg_isready"), "-q", "-h", dir, "-p", "5432").Run() != nil {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			t.Fatalf("postgres did not start:\n%s", log)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out, err := asOwner("createdb", "-h", dir, "-p", "5432", "-U", svc.Environment["POSTGRES_USER"], svc.Environment["POSTGRES_DB"]).CombinedOutput(); err != nil {
		t.Fatalf("createdb: %v\n%s", err, out)
	}
}

// connect is the test's own connection to the stand-in Postgres, through its socket.
func (u *topology) connect(ctx context.Context) *pgx.Conn {
	svc := u.file.Services["postgres"]
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=5432 user=%s dbname=%s", u.pgDir, svc.Environment["POSTGRES_USER"], svc.Environment["POSTGRES_DB"]))
	if err != nil {
		u.t.Fatal(err)
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		u.t.Fatal(err)
	}
	u.t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// containerSpec translates a service to what compose asks the engine for.
func (u *topology) containerSpec(ctx context.Context, name string, cmd []string) (*container.Config, *container.HostConfig, *network.NetworkingConfig) {
	t := u.t
	s := u.file.Services[name]
	env := make([]string, 0, len(s.Environment))
	for k, v := range s.Environment {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	cfg := &container.Config{
		Image: s.Image, Cmd: cmd, Env: env, User: s.User,
		Labels: map[string]string{"com.docker.compose.project": u.project, "com.docker.compose.service": name},
	}
	if s.StopGracePeriod != "" {
		d, err := time.ParseDuration(s.StopGracePeriod)
		if err != nil {
			t.Fatalf("%s: stop_grace_period: %v", name, err)
		}
		secs := int(d.Seconds())
		cfg.StopTimeout = &secs
	}
	if h := s.Healthcheck; h != nil {
		cfg.Healthcheck = &container.HealthConfig{Test: h.Test, Retries: h.Retries,
			Interval: duration(t, h.Interval), Timeout: duration(t, h.Timeout), StartPeriod: duration(t, h.StartPeriod)}
	}
	restart := container.RestartPolicyMode(s.Restart)
	if restart == "" {
		restart = container.RestartPolicyDisabled
	}
	host := &container.HostConfig{
		RestartPolicy: container.RestartPolicy{Name: restart}, ReadonlyRootfs: s.ReadOnly,
		CapDrop: s.CapDrop, CapAdd: s.CapAdd, SecurityOpt: s.SecurityOpt, Tmpfs: map[string]string{},
	}
	for _, p := range s.Tmpfs {
		host.Tmpfs[p] = ""
	}
	for _, v := range s.Volumes {
		vol, err := parseVolume(v)
		if err != nil {
			t.Fatal(err)
		}
		source := vol.source
		if filepath.IsAbs(source) {
			if _, err := os.Stat(source); os.IsNotExist(err) {
				// compose makes a missing bind source as a folder.
				if err := os.MkdirAll(source, 0o755); err != nil {
					t.Fatal(err)
				}
			}
		} else {
			if _, ok := u.file.Volumes[source]; !ok {
				t.Fatalf("%s: volume %s is not declared", name, source)
			}
			source = u.project + "_" + source
			if !slices.Contains(u.vols, source) {
				if _, err := u.cli.VolumeCreate(ctx, volume.CreateOptions{Name: source, Labels: map[string]string{"com.docker.compose.project": u.project}}); err != nil {
					t.Fatal(err)
				}
				u.vols = append(u.vols, source)
			}
		}
		host.Binds = append(host.Binds, source+":"+vol.target+":"+vol.mode)
	}
	for _, secret := range s.Secrets {
		file, ok := u.secrets[secret]
		if !ok {
			t.Fatalf("%s: secret %s is not declared", name, secret)
		}
		host.Binds = append(host.Binds, file+":/run/secrets/"+secret+":ro")
	}
	for _, p := range s.Ports {
		parts := strings.Split(p, ":")
		if len(parts) != 3 {
			t.Fatalf("%s: port %q is not HOST_IP:HOST_PORT:CONTAINER_PORT", name, p)
		}
		port := nat.Port(parts[2] + "/tcp")
		if cfg.ExposedPorts == nil {
			cfg.ExposedPorts, host.PortBindings = nat.PortSet{}, nat.PortMap{}
		}
		cfg.ExposedPorts[port] = struct{}{}
		host.PortBindings[port] = append(host.PortBindings[port], nat.PortBinding{HostIP: parts[0], HostPort: parts[1]})
	}
	if slices.Contains(s.Networks, u.file.Services["postgres"].Networks[0]) {
		host.ExtraHosts = []string{"postgres:" + u.pgGateway}
	}
	nets := &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{}}
	if len(s.Networks) > 0 {
		nets.EndpointsConfig[u.project+"_"+s.Networks[0]] = &network.EndpointSettings{Aliases: []string{name}}
	}
	return cfg, host, nets
}

// create makes a service's container on all its networks, not started.
func (u *topology) create(ctx context.Context, name, containerName string, cmd []string) string {
	cfg, host, nets := u.containerSpec(ctx, name, cmd)
	created, err := u.cli.ContainerCreate(ctx, cfg, host, nets, nil, containerName)
	if err != nil {
		u.t.Fatalf("create %s: %v", name, err)
	}
	for _, n := range u.file.Services[name].Networks[1:] {
		if err := u.cli.NetworkConnect(ctx, u.project+"_"+n, created.ID, &network.EndpointSettings{Aliases: []string{name}}); err != nil {
			u.t.Fatalf("connect %s to %s: %v", name, n, err)
		}
	}
	return created.ID
}

// start waits for what the service depends on, then creates and starts it.
func (u *topology) start(ctx context.Context, name string) {
	t := u.t
	for dep, d := range u.file.Services[name].DependsOn {
		if !u.active(dep) {
			if d.Required == nil || *d.Required {
				t.Fatalf("%s depends on %s, which its profiles leave out", name, dep)
			}
			continue
		}
		if dep == "postgres" {
			continue // the stand-in is ready once it listens
		}
		switch d.Condition {
		case "service_healthy":
			u.waitHealthy(ctx, dep)
		case "service_completed_successfully":
			if code := u.wait(ctx, u.containers[dep]); code != 0 {
				t.Fatalf("%s exited %d before %s:\n%s", dep, code, name, u.logs(u.containers[dep]))
			}
		}
	}
	id := u.create(ctx, name, u.project+"-"+name+"-1", u.file.Services[name].Command)
	u.containers[name] = id
	if err := u.cli.ContainerStart(ctx, id, container.StartOptions{}); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
}

// run is `docker compose run --rm SERVICE ARGS...`: a one-off container of the service with
// its command replaced; it returns the output and fails the test on a non-zero exit.
func (u *topology) run(ctx context.Context, name string, args []string) string {
	id := u.create(ctx, name, fmt.Sprintf("%s-%s-run-%d", u.project, name, len(u.oneOffs)), args)
	u.oneOffs = append(u.oneOffs, id)
	if err := u.cli.ContainerStart(ctx, id, container.StartOptions{}); err != nil {
		u.t.Fatal(err)
	}
	code := u.wait(ctx, id)
	out := u.logs(id)
	if code != 0 {
		u.t.Fatalf("run %s %v: exit %d\n%s", name, args, code, out)
	}
	return out
}

func (u *topology) wait(ctx context.Context, id string) int64 {
	ch, errc := u.cli.ContainerWait(ctx, id, container.WaitConditionNotRunning)
	select {
	case r := <-ch:
		return r.StatusCode
	case err := <-errc:
		u.t.Fatal(err)
	}
	return -1
}

func (u *topology) waitHealthy(ctx context.Context, name string) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		info, err := u.cli.ContainerInspect(ctx, u.containers[name])
		if err != nil {
			u.t.Fatal(err)
		}
		if info.State.Health != nil && info.State.Health.Status == "healthy" {
			return
		}
		if !info.State.Running || time.Now().After(deadline) {
			u.t.Fatalf("%s is not healthy (%s, health %+v):\n%s", name, info.State.Status, info.State.Health, u.logs(u.containers[name]))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// ip is the service's address on one of its networks.
func (u *topology) ip(ctx context.Context, name, net string) string {
	info, err := u.cli.ContainerInspect(ctx, u.containers[name])
	if err != nil {
		u.t.Fatal(err)
	}
	ep := info.NetworkSettings.Networks[u.project+"_"+net]
	if ep == nil || ep.IPAddress == "" {
		u.t.Fatalf("%s has no address on %s", name, net)
	}
	return ep.IPAddress
}

func (u *topology) logs(id string) string { return u.logsTail(id, "60") }

// logsTail is the container's output, the last tail lines ("all": all of it).
func (u *topology) logsTail(id, tail string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := u.cli.ContainerLogs(ctx, id, container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: tail})
	if err != nil {
		return err.Error()
	}
	defer r.Close()
	var out bytes.Buffer
	_, _ = stdcopy.StdCopy(&out, &out, r)
	return out.String()
}

// down removes what the run made: its containers (the dispatcher stopped first, within its
// stop_grace_period, as compose stops dependants first), the org units its dispatcher left
// for adoption, networks, volumes and the stand-in Postgres. Logs of every service are shown
// when the test failed.
func (u *topology) down() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if u.t.Failed() {
		for name, id := range u.containers {
			u.t.Logf("--- %s:\n%s", name, u.logs(id))
		}
	}
	order := u.order()
	slices.Reverse(order)
	for _, name := range order {
		if id, ok := u.containers[name]; ok {
			if err := u.cli.ContainerStop(ctx, id, container.StopOptions{}); err != nil {
				u.t.Logf("stop %s: %v", name, err)
			}
		}
	}
	for _, id := range append(slices.Collect(maps.Values(u.containers)), u.oneOffs...) {
		_ = u.cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true})
	}
	units, err := u.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", runtime.LabelInstance+"="+u.project))})
	if err == nil {
		for _, c := range units {
			_ = u.cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
		}
	}
	for _, n := range u.nets {
		_ = u.cli.NetworkRemove(ctx, n.ID)
	}
	for _, v := range u.vols {
		_ = u.cli.VolumeRemove(ctx, v, true)
	}
	if u.pg != nil && u.pg.Process != nil {
		_ = u.pg.Process.Signal(os.Interrupt) // fast shutdown
		done := make(chan struct{})
		go func() { _ = u.pg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = u.pg.Process.Kill()
			<-done
		}
	}
	if u.pgDir != "" {
		os.RemoveAll(u.pgDir)
	}
}

func duration(t *testing.T, s string) time.Duration {
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("duration %q: %v", s, err)
	}
	return d
}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func grepLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// dockerSocket is the engine's socket on this host, which the dispatcher mounts.
func dockerSocket(t *testing.T) string {
	t.Helper()
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		return "/var/run/docker.sock"
	}
	path, ok := strings.CutPrefix(host, "unix://")
	if !ok {
		t.Skipf("DOCKER_HOST=%s is not a unix socket the dispatcher could mount", host)
	}
	return path
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
