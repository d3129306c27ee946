package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"hermeshost/config"
	"hermeshost/internal/hosttest"
)

// bins holds the static hermes-host, scripted-agent and hermes-healthcheck TestMain builds.
var bins string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hermes-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		if err := hosttest.BuildBinaries(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		hc := exec.Command("go", "build", "-o", filepath.Join(dir, "hermes-healthcheck"), "./healthcheck")
		hc.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := hc.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build hermes-healthcheck: %v\n%s", err, out)
			return 1
		}
		bins = dir
		return m.Run()
	}()
	os.Exit(code)
}

// composeFile is the part of the compose specification deploy/compose.yaml uses. Decoding
// refuses any other key, so a key added to the file must be added here, and to the real
// run's translation (compose_e2e_test.go), before the tests pass.
type composeFile struct {
	Name     string                    `yaml:"name"`
	XHost    yaml.Node                 `yaml:"x-host"`
	Services map[string]composeService `yaml:"services"`
	Networks map[string]composeNetwork `yaml:"networks"`
	Volumes  map[string]struct{}       `yaml:"volumes"`
	Secrets  map[string]composeSecret  `yaml:"secrets"`
}

// composeSecret is a file-based secret: compose bind-mounts the file, relative to the
// compose file's folder, into each service that lists it, at /run/secrets/<name>.
type composeSecret struct {
	File string `yaml:"file"`
}

type composeNetwork struct {
	Internal bool `yaml:"internal"`
}

type composeService struct {
	Image           string            `yaml:"image"`
	Build           *composeBuild     `yaml:"build"`
	Profiles        []string          `yaml:"profiles"`
	Restart         string            `yaml:"restart"`
	ReadOnly        bool              `yaml:"read_only"`
	Tmpfs           []string          `yaml:"tmpfs"`
	CapDrop         []string          `yaml:"cap_drop"`
	CapAdd          []string          `yaml:"cap_add"`
	SecurityOpt     []string          `yaml:"security_opt"`
	User            string            `yaml:"user"`
	Command         []string          `yaml:"command"`
	Environment     map[string]string `yaml:"environment"`
	Volumes         []string          `yaml:"volumes"`
	Secrets         []string          `yaml:"secrets"`
	Ports           []string          `yaml:"ports"`
	Networks        []string          `yaml:"networks"`
	StopGracePeriod string            `yaml:"stop_grace_period"`
	Healthcheck     *composeHealth    `yaml:"healthcheck"`
	DependsOn       map[string]struct {
		Condition string `yaml:"condition"`
		Required  *bool  `yaml:"required"`
	} `yaml:"depends_on"`
}

type composeBuild struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

type composeHealth struct {
	Test        []string `yaml:"test"`
	Interval    string   `yaml:"interval"`
	Timeout     string   `yaml:"timeout"`
	Retries     int      `yaml:"retries"`
	StartPeriod string   `yaml:"start_period"`
}

// loadCompose reads deploy/compose.yaml as compose does: every scalar interpolated from env
// (${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}, $VAR, $$), then
// decoded strictly.
func loadCompose(env map[string]string) (composeFile, error) {
	raw, err := os.ReadFile("compose.yaml")
	if err != nil {
		return composeFile{}, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return composeFile{}, fmt.Errorf("compose.yaml: %w", err)
	}
	var walk func(n *yaml.Node) error
	walk = func(n *yaml.Node) error {
		if n.Kind == yaml.ScalarNode && n.Tag != "!!merge" {
			v, err := interpolate(n.Value, env)
			if err != nil {
				return fmt.Errorf("compose.yaml line %d: %w", n.Line, err)
			}
			n.Value = v
		}
		for _, c := range n.Content {
			if err := walk(c); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(&doc); err != nil {
		return composeFile{}, err
	}
	out, err := yaml.Marshal(&doc)
	if err != nil {
		return composeFile{}, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	dec.KnownFields(true)
	var f composeFile
	if err := dec.Decode(&f); err != nil {
		return composeFile{}, fmt.Errorf("compose.yaml: %w", err)
	}
	return f, nil
}

var interpolation = regexp.MustCompile(`\$(\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))`)

// interpolate substitutes env into s as compose does; an unset variable is empty, and
// ${VAR:?message} of an unset or empty one is an error with the message.
func interpolate(s string, env map[string]string) (string, error) {
	var err error
	out := interpolation.ReplaceAllStringFunc(s, func(m string) string {
		sub := interpolation.FindStringSubmatch(m)
		if sub[1] == "$" {
			return "$"
		}
		name := sub[2] + sub[5]
		val, set := env[name]
		op, arg := sub[3], sub[4]
		empty := !set || (strings.HasPrefix(op, ":") && val == "")
		switch {
		case op == ":-" || op == "-":
			if empty {
				return arg
			}
		case op == ":?" || op == "?":
			if empty && err == nil {
				err = fmt.Errorf("%s: %s", name, arg)
			}
		}
		return val
	})
	return out, err
}

// exampleEnv is deploy/env.example with every empty value filled, as an operator fills it.
func exampleEnv(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open("env.example")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("env.example: %q is not NAME=value", line)
		}
		if v == "" {
			v = "filled-" + strings.ToLower(k) + "-0123456789abcdef"
		}
		env[k] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return env
}

// hostServices are the services that run the host's image, and so the hermes-host command.
func hostServices(f composeFile) []string {
	var names []string
	for name, s := range f.Services {
		if s.Build != nil && s.Build.Dockerfile == "deploy/Dockerfile.host" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// helpEnv is the Environment section of `hermes-host ARGS... --help`: what that command reads.
func helpEnv(t *testing.T, args []string) []string {
	t.Helper()
	out, err := exec.Command(filepath.Join(bins, "hermes-host"), append(args, "--help")...).Output()
	if err != nil {
		t.Fatalf("hermes-host %s --help: %v", strings.Join(args, " "), err)
	}
	_, section, ok := strings.Cut(string(out), "\nEnvironment:\n")
	if !ok {
		t.Fatalf("hermes-host %s --help lists no environment:\n%s", strings.Join(args, " "), out)
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  ([A-Z][A-Z0-9_]+) `).FindAllStringSubmatch(section, -1) {
		names = append(names, m[1])
	}
	return names
}

// secretVars are the variables that hold secrets: config's, and the postgres image's
// password.
func secretVars() map[string]bool {
	out := map[string]bool{"POSTGRES_PASSWORD": true}
	for _, v := range config.All() {
		if v.Secret {
			out[v.Name] = true
		}
	}
	return out
}

// secretOfFileVar is the secret variable a NAME_FILE variable stands for, if k is one.
func secretOfFileVar(k string) (string, bool) {
	base, ok := strings.CutSuffix(k, "_FILE")
	return base, ok && secretVars()[base]
}

// subcommand is the words of a service's command before its first flag.
func subcommand(cmd []string) []string {
	for i, a := range cmd {
		if strings.HasPrefix(a, "-") {
			return cmd[:i]
		}
	}
	return cmd
}

// volumeSpec is one short-syntax entry: source (a host path or a named volume), target, mode.
type volumeSpec struct{ source, target, mode string }

func parseVolume(s string) (volumeSpec, error) {
	parts := strings.Split(s, ":")
	switch len(parts) {
	case 2:
		return volumeSpec{parts[0], parts[1], "rw"}, nil
	case 3:
		if parts[2] != "ro" && parts[2] != "rw" {
			return volumeSpec{}, fmt.Errorf("volume %q: mode %q", s, parts[2])
		}
		return volumeSpec{parts[0], parts[1], parts[2]}, nil
	}
	return volumeSpec{}, fmt.Errorf("volume %q is not SOURCE:TARGET[:MODE]", s)
}

// TestComposeFileStatically holds deploy/compose.yaml to what the host needs of it, with
// the values of deploy/env.example: the services, the Docker socket only in the dispatcher,
// the networks, the paths the dispatcher shares with the host's engine, healthchecks and
// restart policies, and every variable a service sets being one its command reads.
func TestComposeFileStatically(t *testing.T) {
	env := exampleEnv(t)
	f, err := loadCompose(env)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"postgres", "migrate", "gateway", "dispatcher", "launcher", "backend"} {
		if _, ok := f.Services[name]; !ok {
			t.Errorf("no service %s", name)
		}
	}
	if got := f.Services["backend"].Profiles; !slices.Equal(got, []string{"demo"}) {
		t.Errorf("the reference backend runs only in the demo profile, not %v", got)
	}
	if !regexp.MustCompile(`^postgres:[0-9]+\.[0-9]+`).MatchString(f.Services["postgres"].Image) {
		t.Errorf("postgres image %q is not pinned to a release", f.Services["postgres"].Image)
	}

	for name, s := range f.Services {
		for _, v := range s.Volumes {
			vol, err := parseVolume(v)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			if strings.Contains(vol.source+vol.target, "docker.sock") && name != "dispatcher" {
				t.Errorf("%s mounts the Docker socket (%s); only the dispatcher may", name, v)
			}
		}
		if len(s.CapAdd) > 0 && name != "dispatcher" {
			t.Errorf("%s adds capabilities %v; only the dispatcher may", name, s.CapAdd)
		}
		if name != "postgres" && (!s.ReadOnly || !slices.Equal(s.CapDrop, []string{"ALL"}) || !slices.Contains(s.SecurityOpt, "no-new-privileges:true")) {
			t.Errorf("%s: the host's processes run on a read-only root, without capabilities, with no-new-privileges", name)
		}
		if !slices.Contains([]string{"no", "always", "on-failure", "unless-stopped"}, s.Restart) {
			t.Errorf("%s: restart %q is not a restart policy", name, s.Restart)
		}
		durations := []string{s.StopGracePeriod}
		if h := s.Healthcheck; h != nil {
			durations = append(durations, h.Interval, h.Timeout, h.StartPeriod)
		}
		for _, d := range durations {
			if _, err := time.ParseDuration(d); d != "" && err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
		for _, p := range s.Ports {
			if !regexp.MustCompile(`^[0-9.]+:[0-9]+:[0-9]+$`).MatchString(p) {
				t.Errorf("%s: port %q is not HOST_IP:HOST_PORT:CONTAINER_PORT", name, p)
			}
		}
		for dep, d := range s.DependsOn {
			if _, ok := f.Services[dep]; !ok {
				t.Errorf("%s depends on unknown service %s", name, dep)
			}
			if !slices.Contains([]string{"service_started", "service_healthy", "service_completed_successfully"}, d.Condition) {
				t.Errorf("%s: depends_on %s: condition %q", name, dep, d.Condition)
			}
			if d.Condition == "service_healthy" && f.Services[dep].Healthcheck == nil {
				t.Errorf("%s waits for %s to be healthy, which has no healthcheck", name, dep)
			}
		}
		for _, n := range s.Networks {
			if _, ok := f.Networks[n]; !ok {
				t.Errorf("%s is on undeclared network %s", name, n)
			}
		}
		switch {
		case name == "migrate":
			if s.Restart != "no" || s.Healthcheck != nil {
				t.Errorf("migrate is one-shot: restart %q, healthcheck %v", s.Restart, s.Healthcheck)
			}
		case s.Restart != "unless-stopped" && s.Restart != "always":
			t.Errorf("%s: restart %q", name, s.Restart)
		case s.Healthcheck == nil || len(s.Healthcheck.Test) < 2 || s.Healthcheck.Test[0] != "CMD":
			t.Errorf("%s: no exec-form healthcheck", name)
		}
	}

	// Networks: the units network is the dispatcher's own; the database is on an internal
	// network the gateway is not on.
	if _, ok := f.Networks["hermes-units"]; ok {
		t.Error("compose declares hermes-units: the dispatcher makes it, and refuses one it did not make")
	}
	if !f.Networks["db"].Internal || !slices.Equal(f.Services["postgres"].Networks, []string{"db"}) {
		t.Error("Postgres is on the internal network db alone")
	}
	if slices.Contains(f.Services["gateway"].Networks, "db") {
		t.Error("the gateway is on the database's network")
	}

	// The dispatcher: Docker runtime, isolated units, and the data folder at its own path.
	disp := f.Services["dispatcher"]
	de := disp.Environment
	if de["HERMES_RUNTIME"] != "docker" || de["UNIT_NETWORK"] != "isolated" {
		t.Errorf("dispatcher: HERMES_RUNTIME %q, UNIT_NETWORK %q", de["HERMES_RUNTIME"], de["UNIT_NETWORK"])
	}
	if de["HERMES_INSTANCE"] == "" {
		t.Error("dispatcher: HERMES_INSTANCE must be set (the container's host name changes with every new container)")
	}
	sharedPath := func(s composeService, path string) bool {
		for _, v := range s.Volumes {
			vol, err := parseVolume(v)
			if err == nil && vol.source == vol.target && filepath.IsAbs(vol.source) &&
				(path == vol.source || strings.HasPrefix(path, vol.source+"/")) {
				return true
			}
		}
		return false
	}
	orgs, run := de["ORGS_ROOT"], de["RUN_ROOT"]
	for _, p := range []string{orgs, filepath.Join(filepath.Dir(orgs), "workspaces"), run} {
		if !sharedPath(disp, p) {
			t.Errorf("dispatcher: %s is not mounted at the same path as on the host", p)
		}
	}
	if !sharedPath(f.Services["launcher"], filepath.Join(run, "dashboards", "acme", "dashboard.sock")) {
		t.Errorf("launcher: the dashboards' sockets under %s/dashboards are not mounted at their own path", run)
	}
	if disp.StopGracePeriod == "" {
		t.Error("dispatcher: no stop_grace_period beyond JOB_GRACE")
	}

	// Every variable a host service sets is one its command reads (its --help lists it; a
	// secret's NAME_FILE stands for NAME).
	for _, name := range hostServices(f) {
		s := f.Services[name]
		reads := helpEnv(t, subcommand(s.Command))
		for k := range s.Environment {
			if base, ok := secretOfFileVar(k); ok {
				k = base
			}
			if !slices.Contains(reads, k) {
				t.Errorf("%s sets %s, which `hermes-host %s` does not read", name, k, strings.Join(subcommand(s.Command), " "))
			}
		}
		if len(s.Healthcheck.testOrNil()) > 0 && s.Healthcheck.Test[1] == "hermes-healthcheck" {
			port := s.Healthcheck.Test[2][strings.LastIndex(s.Healthcheck.Test[2], ":")+1:]
			port, _, _ = strings.Cut(port, "/")
			if !strings.Contains(strings.Join(s.Command, " ")+" "+s.Environment["CONTROL_ADDR"], ":"+port) {
				t.Errorf("%s: the healthcheck asks port %s, which the service does not listen on", name, port)
			}
		}
	}
	if len(hostServices(f)) != 5 {
		t.Errorf("host services: %v", hostServices(f))
	}

	// Secrets are files, never environment values (which `docker inspect` shows): a secret
	// variable reaches a service only as NAME_FILE=/run/secrets/<name>, a secret the service
	// mounts and the file declares, from deploy/secrets/; a service mounts only the secrets it
	// reads, and deploy/.env holds none.
	secrets := secretVars()
	for k := range env {
		if secrets[k] {
			t.Errorf("env.example sets the secret %s; it belongs in a file in deploy/secrets/", k)
		}
	}
	for name, decl := range f.Secrets {
		if decl.File != "./secrets/"+name {
			t.Errorf("secret %s is read from %q, not ./secrets/%s", name, decl.File, name)
		}
		if !slices.ContainsFunc(slices.Collect(maps.Values(f.Services)), func(s composeService) bool { return slices.Contains(s.Secrets, name) }) {
			t.Errorf("secret %s is declared and no service uses it", name)
		}
	}
	for name, s := range f.Services {
		named := map[string]bool{}
		for k, val := range s.Environment {
			if secrets[k] {
				t.Errorf("%s: the secret %s is a plain environment value; pass %s_FILE naming a secret instead", name, k, k)
			}
			if _, ok := secretOfFileVar(k); !ok {
				continue
			}
			secret, ok := strings.CutPrefix(val, "/run/secrets/")
			switch {
			case !ok || strings.Contains(secret, "/"):
				t.Errorf("%s: %s=%s is not /run/secrets/<name>", name, k, val)
			case !slices.Contains(s.Secrets, secret):
				t.Errorf("%s: %s names the secret %s, which the service does not mount", name, k, secret)
			}
			named[secret] = true
		}
		for _, secret := range s.Secrets {
			if _, ok := f.Secrets[secret]; !ok {
				t.Errorf("%s uses the secret %s, which the file does not declare", name, secret)
			}
			if !named[secret] {
				t.Errorf("%s mounts the secret %s, which none of its variables reads", name, secret)
			}
		}
		if slices.Contains(s.Secrets, "sartiq_bot_token") && name != "dispatcher" && name != "backend" {
			t.Errorf("%s holds the bot credential", name)
		}
	}

	// Every image is built from a Dockerfile in the repository, and nothing secret is baked
	// into one.
	for _, df := range []string{"Dockerfile.host", "Dockerfile.hermes"} {
		text := readFile(t, df)
		if !slices.Contains(strings.Split(readFile(t, df+".dockerignore"), "\n"), "deploy/secrets") {
			t.Errorf("%s.dockerignore does not keep deploy/secrets out of the build", df)
		}
		for _, v := range config.All() {
			if v.Secret && regexp.MustCompile(`(?m)^\s*(ENV|ARG)\b.*\b`+v.Name+`\b`).MatchString(text) {
				t.Errorf("%s bakes in %s", df, v.Name)
			}
		}
		for _, m := range regexp.MustCompile(`go build .*? (\./[a-z/-]+)`).FindAllStringSubmatch(text, -1) {
			if _, err := os.Stat(filepath.Join("..", m[1])); err != nil {
				t.Errorf("%s builds %s: %v", df, m[1], err)
			}
		}
		if !regexp.MustCompile(`(?m)^FROM [a-z0-9./-]+:[0-9]+\.[0-9]+\.[0-9]+`).MatchString(text) {
			t.Errorf("%s: no base image pinned to a release", df)
		}
	}
	for name, s := range f.Services {
		if s.Build != nil {
			if _, err := os.Stat(filepath.Join(s.Build.Context, s.Build.Dockerfile)); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
	if !strings.Contains(readFile(t, "Dockerfile.hermes"), `"hermes-agent==0.19.0"`) {
		t.Error("Dockerfile.hermes does not pin hermes-agent==0.19.0")
	}
}

func (h *composeHealth) testOrNil() []string {
	if h == nil {
		return nil
	}
	return h.Test
}

// TestEnvExampleListsWhatComposeReads: every variable compose.yaml interpolates is in
// deploy/env.example, which an operator copies, and env.example holds nothing compose does
// not use.
func TestEnvExampleListsWhatComposeReads(t *testing.T) {
	env := exampleEnv(t)
	used := map[string]bool{}
	for _, m := range regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)`).FindAllStringSubmatch(readFile(t, "compose.yaml"), -1) {
		used[m[1]] = true
	}
	for name := range used {
		if _, ok := env[name]; !ok {
			t.Errorf("compose.yaml reads ${%s}, which env.example does not list", name)
		}
	}
	for name := range env {
		if !used[name] {
			t.Errorf("env.example sets %s, which compose.yaml does not use", name)
		}
	}
}

// TestComposeConfigAccepted runs `docker compose config` on the file with env.example's
// values where the compose plugin is installed; the static test above runs everywhere.
func TestComposeConfigAccepted(t *testing.T) {
	if err := exec.Command("docker", "compose", "version").Run(); err != nil {
		t.Skip("no docker compose plugin here (TestComposeFileStatically checks the file instead): ", err)
	}
	env := exampleEnv(t)
	file := filepath.Join(t.TempDir(), "env")
	var b strings.Builder
	for k, v := range env {
		fmt.Fprintf(&b, "%s=%s\n", k, v)
	}
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, profile := range []string{"", "demo"} {
		args := []string{"compose", "-f", "compose.yaml", "--env-file", file}
		if profile != "" {
			args = append(args, "--profile", profile)
		}
		if out, err := exec.Command("docker", append(args, "config", "-q")...).CombinedOutput(); err != nil {
			t.Errorf("docker %s config -q: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestInterpolation is compose's substitution as loadCompose does it.
func TestInterpolation(t *testing.T) {
	env := map[string]string{"A": "a", "E": ""}
	for in, want := range map[string]string{
		"${A}": "a", "$A/x": "a/x", "${B:-b}": "b", "${E:-e}": "e", "${E-e}": "", "${A:-z}": "a", "$$A": "$A", "x${B}y": "xy",
	} {
		got, err := interpolate(in, env)
		if err != nil || got != want {
			t.Errorf("interpolate(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := interpolate("${E:?set E}", env); err == nil || !strings.Contains(err.Error(), "set E") {
		t.Errorf("${E:?set E} with E empty: %v", err)
	}
	if _, err := interpolate("${E?set E}", env); err != nil {
		t.Errorf("${E?set E} with E set but empty: %v", err)
	}
}
