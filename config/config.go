// Package config is the one place where hermes-host reads its environment.
//
// Every variable a process may read is declared here once, with its default and a
// sentence for --help. A subcommand lists the variables it reads, reads them through an
// Env, and stops start-up with Env.Err, whose message is one line naming the variable.
//
// A secret may instead be read from a file named by NAME_FILE (DATABASE_URL_FILE for
// DATABASE_URL), as the official Postgres image reads POSTGRES_PASSWORD_FILE: Docker
// secrets then keep it out of the container's environment, which `docker inspect` shows.
package config

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Var is one environment variable: its name, its default (empty means none) and what it is for.
type Var struct {
	Name    string
	Default string
	Usage   string
	// Secret marks values that must never be printed: --help shows only whether it is set.
	// A secret may also be read from the file its FileVar names.
	Secret bool
}

// FileVar is the variable naming a file that holds v's value, NAME_FILE, or "" when v is not
// a secret: only secrets have one.
func (v Var) FileVar() string {
	if !v.Secret {
		return ""
	}
	return v.Name + "_FILE"
}

// The variables every process shares (DESIGN section 13) and the ones only some read.
var (
	DatabaseURL = define(Var{Name: "DATABASE_URL", Secret: true,
		Usage: "the host's Postgres URL; add ?search_path=NAME to use a schema other than hermes_host"})
	LogLevel = define(Var{Name: "LOG_LEVEL", Default: "info",
		Usage: "debug, info, warn or error"})
	LogFormat = define(Var{Name: "LOG_FORMAT", Default: "auto",
		Usage: "json (one object per line), text (one readable line per record) or auto (text on a terminal, else json); a regular file always gets json"})
	ShutdownGrace = define(Var{Name: "SHUTDOWN_GRACE", Default: "10s",
		Usage: "how long a server waits for in-flight requests after SIGTERM"})
	SartiqAPIURL = define(Var{Name: "SARTIQ_API_URL",
		Usage: "the Sartiq Backend API base URL"})
	SartiqBotToken = define(Var{Name: "SARTIQ_BOT_TOKEN", Secret: true,
		Usage: "the bot credential (dispatcher only)"})
	SartiqToken = define(Var{Name: "SARTIQ_TOKEN", Secret: true,
		Usage: "a job token, where a process is handed one directly"})
	SartiqProxySocket = define(Var{Name: "SARTIQ_PROXY_SOCKET",
		Usage: "a unix socket to the worker's local Sartiq proxy, which adds the job token itself (the sartiq CLI then sends none)"})
	BackendDatabaseURL = define(Var{Name: "BACKEND_DATABASE_URL", Secret: true,
		Usage: "the reference backend's Postgres; default DATABASE_URL's database, in schema sartiq_backend"})
	BackendTokenTTL = define(Var{Name: "BACKEND_TOKEN_TTL", Default: "10m",
		Usage: "the reference backend's job-token lifetime from a claim or the last accepted heartbeat"})
	GatewayURL = define(Var{Name: "GATEWAY_URL",
		Usage: "where a process reaches the model gateway"})
	GatewayKey = define(Var{Name: "GATEWAY_KEY", Secret: true,
		Usage: "the key presented to the gateway (the gateway's own internal key on the gateway)"})
	GatewaySecret = define(Var{Name: "GATEWAY_SECRET", Secret: true,
		Usage: "the secret per-org gateway keys are derived from (gateway and dispatcher)"})
	GatewayUpstream = define(Var{Name: "GATEWAY_UPSTREAM", Default: "demo",
		Usage: "the OpenAI-compatible base URL the gateway forwards to (e.g. https://api.example.com/v1), or demo"})
	GatewayAuthFile = define(Var{Name: "GATEWAY_AUTH_FILE", Default: "/var/lib/hermes/gateway/auth.json",
		Usage: "the gateway's one OAuth login (access and refresh token, identity)"})
	GatewayUpstreamAPIKey = define(Var{Name: "GATEWAY_UPSTREAM_API_KEY", Secret: true,
		Usage: "a static upstream API key; when set the gateway uses it instead of the OAuth login"})
	GatewayOAuthTokenURL = define(Var{Name: "GATEWAY_OAUTH_TOKEN_URL",
		Usage: "the provider's OAuth token endpoint (refresh-token and device-code grants)"})
	GatewayOAuthDeviceURL = define(Var{Name: "GATEWAY_OAUTH_DEVICE_URL",
		Usage: "the provider's device-authorization endpoint (RFC 8628), for gateway login"})
	GatewayOAuthClientID = define(Var{Name: "GATEWAY_OAUTH_CLIENT_ID",
		Usage: "the OAuth client id the gateway logs in and refreshes as"})
	GatewayOAuthScope = define(Var{Name: "GATEWAY_OAUTH_SCOPE", Default: "openid offline_access",
		Usage: "the scopes gateway login asks for (openid gives the identity, offline_access the refresh token)"})
	GatewayOrgRPS = define(Var{Name: "GATEWAY_ORG_RPS", Default: "5",
		Usage: "requests per second each org may make through the gateway (bursts up to twice that)"})
	GatewayOrgConcurrency = define(Var{Name: "GATEWAY_ORG_CONCURRENCY", Default: "4",
		Usage: "requests each org may have in flight through the gateway at once"})
	GatewayMaxRequestBytes = define(Var{Name: "GATEWAY_MAX_REQUEST_BYTES", Default: "20971520",
		Usage: "the largest request body the gateway accepts (images make vision requests large)"})
	WorkerModel = define(Var{Name: "WORKER_MODEL", Default: "demo-worker",
		Usage: "the model agents run jobs with; the dispatcher claims only while the gateway serves it"})
	VisionModel = define(Var{Name: "VISION_MODEL", Default: "demo-vision",
		Usage: "the model for images; the dispatcher claims only while the gateway serves it"})
	ClaimEnabled = define(Var{Name: "CLAIM_ENABLED", Default: "false",
		Usage: "claim queued jobs (false only logs what would be claimed)"})
	ReportEnabled = define(Var{Name: "REPORT_ENABLED", Default: "true",
		Usage: "send terminal complete/fail calls to the backend"})
	MaxAttempts = define(Var{Name: "MAX_ATTEMPTS", Default: "3",
		Usage: "crashes and failures a job may have before it is failed for good"})
	StaleAfter = define(Var{Name: "STALE_AFTER", Default: "45s",
		Usage: "a claimed job without a heartbeat for this long is stale"})
	HeartbeatInterval = define(Var{Name: "HEARTBEAT_INTERVAL", Default: "10s",
		Usage: "how often a worker heartbeats a running job"})
	OrgsRoot = define(Var{Name: "ORGS_ROOT", Default: "/var/lib/hermes/orgs",
		Usage: "the folder holding one HERMES_HOME per organization"})
	WorkerImage = define(Var{Name: "HERMES_WORKER_IMAGE", Default: "hermes-host-worker:dev",
		Usage: "the image of every org's worker container"})
	DashboardImage = define(Var{Name: "HERMES_DASHBOARD_IMAGE", Default: "hermes-host-dashboard:dev",
		Usage: "the image of every org's dashboard container"})
	HermesOrg = define(Var{Name: "HERMES_ORG",
		Usage: "the organization a worker container serves (set by the dispatcher)"})
	HermesHome = define(Var{Name: "HERMES_HOME",
		Usage: "the organization's Hermes home, as the worker sees it"})
	MaxTurns = define(Var{Name: "MAX_TURNS", Default: "30",
		Usage: "the agent's turn limit per run (--max-turns)"})
	MaxResumes = define(Var{Name: "MAX_RESUMES", Default: "3",
		Usage: "how often a worker resumes an agent session that stopped at its turn limit with work left"})
	PollInterval = define(Var{Name: "POLL_INTERVAL", Default: "5s",
		Usage: "how often the dispatcher polls the backend's queue"})
	Runtime = define(Var{Name: "HERMES_RUNTIME", Default: "auto",
		Usage: "where org workers run: docker, process (local subprocesses), or auto (docker when an engine answers)"})
	JobGrace = define(Var{Name: "JOB_GRACE", Default: "20s",
		Usage: "how long a stopping dispatcher lets jobs in flight run on before it has them released (not counted as attempts)"})
	LeaseTTL = define(Var{Name: "LEASE_TTL", Default: "15s",
		Usage: "lifetime of the dispatcher's org: and home: leases, refreshed every third of it; a dead replica's orgs are taken over after it"})
	MaxOrgs = define(Var{Name: "MAX_ORGS", Default: "32",
		Usage: "how many organizations one dispatcher owns at once (at most one job in flight each)"})
	WorkerIdleTimeout = define(Var{Name: "WORKER_IDLE_TIMEOUT", Default: "10m",
		Usage: "an org's worker with no job for this long is stopped by the reaper"})
	ControlAddr = define(Var{Name: "CONTROL_ADDR", Default: "127.0.0.1:8092",
		Usage: "the dispatcher's internal address: the control API for per-org processes, /healthz and /metrics"})
	ControlURL = define(Var{Name: "CONTROL_URL",
		Usage: "the control API as org containers reach it; default http://CONTROL_ADDR"})
	SessionCookieSecure = define(Var{Name: "SESSION_COOKIE_SECURE", Default: "true",
		Usage: "mark the launcher's session cookie Secure (HTTPS only); dev turns it off for its plain-HTTP localhost"})
	ControlKey = define(Var{Name: "CONTROL_KEY", Secret: true,
		Usage: "this org's control API key, which the dispatcher hands run-job; the agent's subagent hooks reach the API through the worker with it, never holding it"})
	ControlSecret = define(Var{Name: "CONTROL_SECRET", Secret: true,
		Usage: "derives the per-org control API keys; replicas share it (the dispatcher makes one per run when unset)"})
	DashboardSecret = define(Var{Name: "DASHBOARD_SECRET", Secret: true,
		Usage: "derives each org's dashboard assertion key; the launcher and every dispatcher share it (a dispatcher without it starts no dashboards; dev makes one per run)"})
	DashboardIdleTimeout = define(Var{Name: "DASHBOARD_IDLE_TIMEOUT", Default: "30m",
		Usage: "an org's dashboard unused for this long is stopped; the next Open starts it again"})
	UnitMemoryLimit = define(Var{Name: "UNIT_MEMORY_LIMIT", Default: "2GiB",
		Usage: "memory each org unit (worker, dashboard) may use, swap included, as bytes or with KiB, MiB, GiB (also K, M, G); past it the kernel kills the biggest process and the job ends out of memory; none only with UNIT_LIMITS_NONE=true"})
	UnitCPULimit = define(Var{Name: "UNIT_CPU_LIMIT", Default: "1",
		Usage: "CPUs each org unit may use, a decimal such as 0.5 or 2 (Docker); none only with UNIT_LIMITS_NONE=true"})
	UnitPidsLimit = define(Var{Name: "UNIT_PIDS_LIMIT", Default: "512",
		Usage: "processes and threads each org unit may have at once, which bounds a fork bomb (Docker); none only with UNIT_LIMITS_NONE=true"})
	UnitLimitsNone = define(Var{Name: "UNIT_LIMITS_NONE", Default: "false",
		Usage: "allow none in UNIT_MEMORY_LIMIT, UNIT_CPU_LIMIT and UNIT_PIDS_LIMIT (units unbounded there); without it none is refused"})
	UnitUser = define(Var{Name: "UNIT_USER", Default: "10001:10001",
		Usage: "with UNIT_UIDS=shared (or a dispatcher that is not root), the numeric uid:gid programs run as inside every org's units; org homes and workspaces are given to it; 0 (root) only if set so explicitly, and never 65534 (the workers' keeper)"})
	UnitUIDs = define(Var{Name: "UNIT_UIDS", Default: "200000-299999",
		Usage: "first-last: each org's units run as a uid of its own from this range (its gid the same), allocated once in Postgres and kept, and its home and workspaces are given to it; shared: every org's run as UNIT_USER. Needs a dispatcher running as root (one that is not runs every org as UNIT_USER); the range may not hold 65534"})
	UnitEgress = define(Var{Name: "UNIT_EGRESS", Default: "none",
		Usage: "none: isolated org units reach nothing beyond the host's services; public: their agents also reach the public internet on ports 80 and 443 through an egress proxy the dispatcher serves on each org's sockets (HTTPS_PROXY in the agent's environment), never loopback, private, link-local (cloud metadata), shared or reserved addresses nor the host's own"})
	UnitEgressAllow = define(Var{Name: "UNIT_EGRESS_ALLOW",
		Usage: "with UNIT_EGRESS=public, addresses the egress proxy reaches besides public ones, on any port: comma-separated IPs or CIDR prefixes (an internal service jobs need)"})
	UnitEgressConns = define(Var{Name: "UNIT_EGRESS_CONNS", Default: "64",
		Usage: "with UNIT_EGRESS=public, the connections through the egress proxy each org may have open at once; one more is refused (429) and counted, so a runaway agent cannot take the host's sockets"})
	EgressURL = define(Var{Name: "EGRESS_URL",
		Usage: "the egress proxy as the unit reaches it (unix:/path or http URL), set by the dispatcher with UNIT_EGRESS=public; the agent gets it as HTTPS_PROXY and HTTP_PROXY"})
	UnitNetwork = define(Var{Name: "UNIT_NETWORK", Default: "isolated",
		Usage: "isolated: org units are off the host's network (Docker: an internal bridge network of the host's own with no host address on it; process: a network namespace with only a loopback; neither has egress) and reach the gateway, control API and backend through sockets mounted into them; host: units share the host's network"})
	RunRoot = define(Var{Name: "RUN_ROOT",
		Usage: "folder for the sockets org units reach the host by, and dashboards serve on; default <parent of ORGS_ROOT>/run"})
	HermesInstance = define(Var{Name: "HERMES_INSTANCE",
		Usage: "this dispatcher's name on the container engine and in claim records; default the host name"})
	HermesBin = define(Var{Name: "HERMES_BIN", Default: "hermes",
		Usage: "the agent command"})
	HermesBundledSkills = define(Var{Name: "HERMES_BUNDLED_SKILLS", Default: "/opt/hermes/skills",
		Usage: "the image's bundled skills (read-only, never copied into a home)"})
	SkillsMaxAuthored = define(Var{Name: "SKILLS_MAX_AUTHORED", Default: "40",
		Usage: "authored skills an org keeps enabled; past it the least recently used are disabled, never deleted"})
	WorkspaceRetention = define(Var{Name: "WORKSPACE_RETENTION", Default: "168h",
		Usage: "job workspaces older than this are removed"})
	WorkspaceKeep = define(Var{Name: "WORKSPACE_KEEP", Default: "20",
		Usage: "job workspaces kept per org at most, newest first; older ones are removed"})
)

var all []Var

func define(v Var) Var { all = append(all, v); return v }

// All is every variable declared here, in declaration order.
func All() []Var { return append([]Var(nil), all...) }

// Env reads variables and collects the first bad value, so a caller reads everything it
// needs and then checks one error.
type Env struct {
	lookup func(string) (string, bool)
	err    error
}

// FromOS reads the process environment.
func FromOS() *Env { return &Env{lookup: os.LookupEnv} }

// FromMap reads a fixed set of values; tests and `dev` use it to hand children a config.
func FromMap(m map[string]string) *Env {
	return &Env{lookup: func(k string) (string, bool) { v, ok := m[k]; return v, ok }}
}

// Err is the first bad value read, as one line naming the variable, or nil.
func (e *Env) Err() error { return e.err }

func (e *Env) fail(v Var, raw, want string) {
	if e.err != nil {
		return
	}
	shown := strconv.Quote(raw)
	if v.Secret {
		shown = "(secret value)"
	}
	e.err = &Error{Var: v.Name, Msg: fmt.Sprintf("%s is not %s", shown, want)}
}

// OneOf reads v, which must be one of allowed.
func (e *Env) OneOf(v Var, allowed ...string) string {
	raw := e.raw(v)
	for _, a := range allowed {
		if raw == a {
			return raw
		}
	}
	e.fail(v, raw, "one of "+strings.Join(allowed, ", "))
	return v.Default
}

// Error is a bad configuration value.
type Error struct {
	Var string
	Msg string
}

func (e *Error) Error() string { return "config: " + e.Var + ": " + e.Msg }

// raw is v's value: from the environment, or a secret's from the file its FileVar names
// (both set is an error), else the default. A blank variable counts as unset. A file that
// cannot be read or is empty is an error, never the default.
func (e *Env) raw(v Var) string {
	val, set := e.get(v.Name)
	if fileVar := v.FileVar(); fileVar != "" {
		if path, fromFile := e.get(fileVar); fromFile {
			if set {
				e.setErr(&Error{Var: v.Name, Msg: "is set and so is " + fileVar + ": set only one of them"})
				return ""
			}
			s, err := readSecretFile(path)
			if err != nil {
				e.setErr(&Error{Var: fileVar, Msg: err.Error()})
				return ""
			}
			return s
		}
	}
	if set {
		return val
	}
	return v.Default
}

func (e *Env) get(name string) (string, bool) {
	s, _ := e.lookup(name)
	s = strings.TrimSpace(s)
	return s, s != ""
}

func (e *Env) setErr(err *Error) {
	if e.err == nil {
		e.err = err
	}
}

// maxSecretFile bounds what is read of a secret's file: it holds one value, and a path such
// as /dev/zero must not stall start-up.
const maxSecretFile = 64 << 10

// readSecretFile is the file's content with one trailing newline (\n or \r\n) trimmed, as
// `echo` and editors leave one. Its errors name the path, never the content.
func readSecretFile(path string) (string, error) {
	cannot := func(err error) error {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Errorf("cannot read %s: %v", path, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", cannot(err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return "", cannot(err)
	}
	if len(b) > maxSecretFile {
		return "", fmt.Errorf("%s is over %d KiB, too large for a secret's value", path, maxSecretFile>>10)
	}
	s, crlf := strings.CutSuffix(string(b), "\r\n")
	if !crlf {
		s = strings.TrimSuffix(s, "\n")
	}
	if strings.TrimSpace(s) == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// String is the value, or the default when unset or blank.
func (e *Env) String(v Var) string { return e.raw(v) }

// Required is the value; an unset variable without a default is an error.
func (e *Env) Required(v Var) string {
	s := e.raw(v)
	if s == "" {
		msg := "is required and not set"
		if v.Secret {
			msg += " (nor is " + v.FileVar() + ")"
		}
		e.setErr(&Error{Var: v.Name, Msg: msg})
	}
	return s
}

// Duration parses a Go duration such as 90s or 5m; it must be positive.
func (e *Env) Duration(v Var) time.Duration {
	s := e.raw(v)
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		e.fail(v, s, "a positive duration (for example 90s or 5m)")
		return 0
	}
	return d
}

// Int parses a whole number of at least 1.
func (e *Env) Int(v Var) int {
	s := e.raw(v)
	if s == "" {
		return 0
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		e.fail(v, s, "a whole number of at least 1")
		return 0
	}
	return n
}

// Bool parses true/false (also 1/0, yes/no, on/off).
func (e *Env) Bool(v Var) bool {
	s := e.raw(v)
	switch strings.ToLower(s) {
	case "true", "1", "yes", "on":
		return true
	case "false", "0", "no", "off", "":
		return false
	}
	e.fail(v, s, "true or false")
	return false
}

// URL parses an absolute http(s) URL.
func (e *Env) URL(v Var) string {
	s := e.raw(v)
	if s == "" {
		return ""
	}
	if err := checkHTTPURL(s); err != nil {
		e.fail(v, s, "an absolute http or https URL")
		return ""
	}
	return strings.TrimRight(s, "/")
}

// UnitURL reads a URL a unit reaches a host service at: an absolute http(s) URL, or
// unix:/path naming a socket the runtime mounted into the unit.
func (e *Env) UnitURL(v Var) string {
	s := e.raw(v)
	if rest, ok := strings.CutPrefix(s, "unix:"); ok {
		if !strings.HasPrefix(rest, "/") || strings.ContainsAny(rest, "?#") {
			e.fail(v, s, "an absolute http or https URL, or unix:/path/to/socket")
			return ""
		}
		return s
	}
	return e.URL(v)
}

func checkHTTPURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("not an absolute http(s) URL")
	}
	return nil
}

// Limits bound an org unit; zero in a field means unbounded, which UnitLimits returns only
// when UNIT_LIMITS_NONE allows it.
type Limits struct {
	MemoryBytes int64
	NanoCPUs    int64 // 1e9 is one CPU
	Pids        int64
}

// UnitLimits reads UNIT_MEMORY_LIMIT, UNIT_CPU_LIMIT and UNIT_PIDS_LIMIT. An unbounded unit
// is never a default nor an accident: only the word none gives it, and only with
// UNIT_LIMITS_NONE=true; 0 and blank are refused (blank is the default).
func (e *Env) UnitLimits() Limits {
	allowNone := e.Bool(UnitLimitsNone)
	var l Limits
	limit := func(v Var, parse func(string) (int64, bool), want string) int64 {
		s := e.raw(v)
		if strings.EqualFold(s, "none") {
			if !allowNone && e.err == nil {
				e.err = &Error{Var: v.Name, Msg: "none leaves every org unit unbounded; set " + UnitLimitsNone.Name + "=true to allow it"}
			}
			return 0
		}
		n, ok := parse(s)
		if !ok || n <= 0 {
			e.fail(v, s, want+" (or none, with "+UnitLimitsNone.Name+"=true)")
			return 0
		}
		return n
	}
	l.MemoryBytes = limit(UnitMemoryLimit, parseSize, "a size of at least 16MiB such as 512MiB or 2GiB")
	if l.MemoryBytes > 0 && l.MemoryBytes < 16<<20 && e.err == nil {
		e.fail(UnitMemoryLimit, e.raw(UnitMemoryLimit), "a size of at least 16MiB such as 512MiB or 2GiB")
	}
	l.NanoCPUs = limit(UnitCPULimit, parseCPUs, "a positive number of CPUs such as 0.5 or 2")
	l.Pids = limit(UnitPidsLimit, func(s string) (int64, bool) {
		n, err := strconv.ParseInt(s, 10, 64)
		return n, err == nil
	}, "a whole number of processes of at least 1")
	return l
}

// parseSize reads bytes, with an optional binary suffix (K, KiB, M, MiB, G, GiB, T, TiB;
// any case, an optional B).
func parseSize(s string) (int64, bool) {
	num := strings.TrimRightFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	unit := strings.ToLower(strings.TrimSpace(s[len(num):]))
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, false
	}
	shift := map[string]uint{"": 0, "b": 0, "k": 10, "kb": 10, "kib": 10, "m": 20, "mb": 20, "mib": 20,
		"g": 30, "gb": 30, "gib": 30, "t": 40, "tb": 40, "tib": 40}
	sh, ok := shift[unit]
	if !ok || n > (1<<62)>>sh {
		return 0, false
	}
	return n << sh, true
}

// parseCPUs reads a decimal number of CPUs as billionths.
func parseCPUs(s string) (int64, bool) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 || f > 1<<20 {
		return 0, false
	}
	n := int64(f*1e9 + 0.5)
	return n, n >= 1e6 // Docker's floor is a thousandth of a CPU
}

// UnitEgressAllow reads UNIT_EGRESS_ALLOW: IPs and CIDR prefixes, comma-separated.
func (e *Env) UnitEgressAllow() []netip.Prefix {
	s := e.raw(UnitEgressAllow)
	var out []netip.Prefix
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if p, err := netip.ParsePrefix(item); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(item)
		if err != nil || a.Zone() != "" {
			e.fail(UnitEgressAllow, s, "IPs or CIDR prefixes separated by commas, such as 10.20.0.0/16,192.0.2.7")
			return nil
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out
}

// UnitUIDs reads UNIT_UIDS: shared (ok false), or a range first-last of uids above root
// that does not hold the workers' keeper's (65534).
func (e *Env) UnitUIDs() (first, last int, ok bool) {
	s := e.raw(UnitUIDs)
	if s == "shared" {
		return 0, 0, false
	}
	a, b, cut := strings.Cut(s, "-")
	first, ferr := strconv.Atoi(a)
	last, lerr := strconv.Atoi(b)
	switch {
	case !cut || ferr != nil || lerr != nil || first < 1 || last < first || last > 1<<31-2:
		e.fail(UnitUIDs, s, "shared, or a range of uids above 0 such as 200000-299999")
		return 0, 0, false
	case first <= 65534 && 65534 <= last:
		e.fail(UnitUIDs, s, "a range without 65534, the workers' keeper")
		return 0, 0, false
	}
	return first, last, true
}

// UnitUser reads UNIT_USER: a numeric uid:gid, never the workers' keeper (65534), root
// only when set explicitly.
func (e *Env) UnitUser() string {
	s := e.raw(UnitUser)
	u, g, ok := strings.Cut(s, ":")
	uid, uerr := strconv.Atoi(u)
	_, gerr := strconv.Atoi(g)
	switch {
	case !ok || uerr != nil || gerr != nil || uid < 0 || strings.HasPrefix(g, "-"):
		e.fail(UnitUser, s, "a numeric uid:gid such as 10001:10001")
		return UnitUser.Default
	case uid == 65534:
		e.fail(UnitUser, s, "a uid other than 65534, the workers' keeper")
		return UnitUser.Default
	}
	return s
}
