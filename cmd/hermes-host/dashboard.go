package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"hermeshost/chat"
	"hermeshost/cli"
	"hermeshost/config"
	"hermeshost/control"
	"hermeshost/hermesplugin"
	"hermeshost/internal/procsweep"
	"hermeshost/internal/unitnet"
	"hermeshost/orghome"
	"hermeshost/service"
	"hermeshost/web"
)

// dashboardSecrets are what the dispatcher hands a dashboard on stdin, and nothing else
// reaches it by: the org's control-API key, its gateway key, and its assertion key.
type dashboardSecrets struct {
	controlURL   string
	controlKey   service.Secret
	gatewayURL   string
	gatewayKey   service.Secret
	assertionKey service.Secret
}

// maxSecretsInput bounds what is read of stdin: five lines.
const maxSecretsInput = 64 << 10

var secretKeyPattern = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)

// readDashboardSecrets reads stdin to its end: exactly the KEY=VALUE lines the dispatcher
// writes (blank lines aside), each once. An error names the key or the line, never a
// value.
func readDashboardSecrets(r io.Reader) (dashboardSecrets, error) {
	raw, err := io.ReadAll(io.LimitReader(r, maxSecretsInput+1))
	if err != nil {
		return dashboardSecrets{}, fmt.Errorf("read the secrets on stdin: %w", err)
	}
	if len(raw) > maxSecretsInput {
		return dashboardSecrets{}, fmt.Errorf("the secrets on stdin are over %d bytes", maxSecretsInput)
	}
	var s dashboardSecrets
	fields := map[string]func(string){
		"CONTROL_URL":             func(v string) { s.controlURL = v },
		"CONTROL_KEY":             func(v string) { s.controlKey = service.Secret(v) },
		"GATEWAY_URL":             func(v string) { s.gatewayURL = v },
		"GATEWAY_KEY":             func(v string) { s.gatewayKey = service.Secret(v) },
		"DASHBOARD_ASSERTION_KEY": func(v string) { s.assertionKey = service.Secret(v) },
	}
	seen := map[string]bool{}
	lines := bufio.NewScanner(bytes.NewReader(raw))
	lines.Buffer(make([]byte, 0, 4096), maxSecretsInput)
	for n := 1; lines.Scan(); n++ {
		line := strings.TrimSuffix(lines.Text(), "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok || !secretKeyPattern.MatchString(key) {
			return dashboardSecrets{}, fmt.Errorf("stdin line %d is not a KEY=VALUE line", n)
		}
		set, known := fields[key]
		switch {
		case !known:
			return dashboardSecrets{}, fmt.Errorf("stdin line %d: unknown key %s", n, key)
		case seen[key]:
			return dashboardSecrets{}, fmt.Errorf("stdin line %d: %s is given twice", n, key)
		case value == "":
			return dashboardSecrets{}, fmt.Errorf("stdin line %d: %s is empty", n, key)
		}
		seen[key] = true
		set(value)
	}
	if err := lines.Err(); err != nil {
		return dashboardSecrets{}, fmt.Errorf("read the secrets on stdin: %w", err)
	}
	for _, key := range []string{"CONTROL_URL", "CONTROL_KEY", "GATEWAY_URL", "GATEWAY_KEY", "DASHBOARD_ASSERTION_KEY"} {
		if !seen[key] {
			return dashboardSecrets{}, fmt.Errorf("stdin: %s is missing", key)
		}
	}
	for key, v := range map[string]string{"GATEWAY_URL": s.gatewayURL, "CONTROL_URL": s.controlURL} {
		if _, ok := unitnet.SocketPath(v); ok {
			continue
		}
		if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return dashboardSecrets{}, fmt.Errorf("stdin: %s is neither an http(s) URL nor unix:/path", key)
		}
	}
	return s, nil
}

type dashboardSettings struct {
	org, prefix string
	home        string
	bundled     string
	skillsMax   int
	grace       time.Duration
	// The chat's agent, as a worker runs it: HERMES_BIN, MAX_TURNS, WORKER_MODEL.
	hermesBin string
	maxTurns  int
	model     string
	egressURL string // EGRESS_URL, the agent's HTTPS_PROXY once forwarded
	secrets   dashboardSecrets
}

// runDashboard opens the org's home and listens; the caller serves.
func runDashboard(ops *service.Ops, s dashboardSettings, addr string) (*service.Server, func(), error) {
	// Both keys name their org (control.Key, gateway.OrgKey): keys handed for another org
	// are a mistake to stop at, not to serve with.
	if !strings.HasPrefix(s.secrets.controlKey.Reveal(), "hck_"+s.org+"_") {
		return nil, nil, fmt.Errorf("stdin: CONTROL_KEY is not a control key of org %s", s.org)
	}
	if !strings.HasPrefix(s.secrets.gatewayKey.Reveal(), "hgw_"+s.org+"_") {
		return nil, nil, fmt.Errorf("stdin: GATEWAY_KEY is not a gateway key of org %s", s.org)
	}
	// Off the host's network its services are sockets, forwarded on the unit's loopback:
	// the gateway's at the address the agent's config.yaml names.
	fwd, stopForwarding := context.WithCancel(context.Background())
	controlURL, err := unitnet.Resolve(fwd, s.secrets.controlURL, "", ops.Log)
	if err != nil {
		stopForwarding()
		return nil, nil, err
	}
	gatewayURL, err := unitnet.Resolve(fwd, s.secrets.gatewayURL, unitnet.GatewayAddr, ops.Log)
	if err != nil {
		stopForwarding()
		return nil, nil, err
	}
	egressURL, err := unitnet.Resolve(fwd, s.egressURL, unitnet.EgressAddr, ops.Log)
	if err != nil {
		stopForwarding()
		return nil, nil, err
	}
	home, err := orghome.OpenHome(s.org, s.home)
	if err != nil {
		stopForwarding()
		return nil, nil, err
	}
	home.Log = ops.Log
	closeHome := func() { home.Close(); stopForwarding() }
	bundled, err := orghome.ReadBundled(s.bundled)
	if err != nil {
		closeHome()
		return nil, nil, err
	}
	client, err := control.NewClient(controlURL, s.secrets.controlKey.Reveal(), &http.Client{Timeout: 10 * time.Second})
	if err != nil {
		closeHome()
		return nil, nil, fmt.Errorf("stdin: CONTROL_URL or CONTROL_KEY: %w", err)
	}
	chatCfg := chat.Config{
		Org: s.org, Home: home, Control: client, HermesBin: s.hermesBin, MaxTurns: s.maxTurns,
		GatewayURL: gatewayURL, GatewayKey: s.secrets.gatewayKey, Model: s.model, EgressURL: egressURL,
		BundledSkills: s.bundled, Bundled: bundled, SkillsMax: s.skillsMax,
		Plugin: orghome.Plugin{Name: hermesplugin.Name, Files: hermesplugin.Files()}, Log: ops.Log,
	}
	var unswept error
	chatCfg.Sweep, chatCfg.Broken, unswept = chatSweep(ops)
	runner, err := chat.NewRunner(chatCfg)
	if err != nil {
		closeHome()
		return nil, nil, err
	}
	closeAll := func() { runner.Close(); closeHome() }
	h, err := web.NewDashboard(ops, web.DashboardConfig{
		Org: s.org, Home: home, Bundled: bundled, SkillsMax: s.skillsMax,
		AssertionKey: s.secrets.assertionKey, Control: client,
		GatewayURL: gatewayURL, GatewayKey: s.secrets.gatewayKey,
		HTTPClient: &http.Client{Timeout: 10 * time.Second}, Prefix: s.prefix, Chat: runner,
	})
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	srv, err := service.Listen("dashboard", addr, h, ops.Log, s.grace)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	if unswept != nil {
		ops.Log.Warn("dashboard: not inside an org unit, so what a chat turn's agent detaches outlives the turn", "reason", unswept.Error())
	}
	return srv, closeAll, nil
}

func dashboardCommand() *cli.Command {
	return &cli.Command{
		Name: "dashboard",
		Summary: "serve one org's dashboard (--org ID) under its prefix: its home is HERMES_HOME; its keys (CONTROL_URL, " +
			"CONTROL_KEY, GATEWAY_URL, GATEWAY_KEY, DASHBOARD_ASSERTION_KEY) come as KEY=VALUE lines on stdin, read to its end before serving",
		Env: append([]config.Var{config.HermesHome, config.HermesBundledSkills, config.SkillsMaxAuthored,
			config.HermesBin, config.MaxTurns, config.WorkerModel, config.EgressURL}, serverEnv...),
		Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
			org := fs.String("org", "", "the organization whose dashboard this is (required)")
			addr := fs.String("addr", "127.0.0.1:8094", "listen address (port 0 picks one), or unix:/path for a socket")
			prefix := fs.String("prefix", "", "the path the pages are served under, as the launcher proxies them (default /orgs/ORG)")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("dashboard takes no arguments: its keys come on stdin")
				}
				if err := orghome.ValidID(*org); err != nil {
					return cli.Usagef("--org: %v", err)
				}
				// The keys are kept in memory only: our /proc/<pid>/mem and environ stay
				// unreadable to a process of the same user (an agent beside us).
				if err := undumpable("dashboard"); err != nil {
					return err
				}
				s := dashboardSettings{org: *org, prefix: *prefix}
				log, err := startup("dashboard", func(e *config.Env) {
					s.home = e.Required(config.HermesHome)
					s.bundled = e.String(config.HermesBundledSkills)
					s.skillsMax = e.Int(config.SkillsMaxAuthored)
					s.grace = grace(e)
					s.hermesBin = e.String(config.HermesBin)
					s.maxTurns = e.Int(config.MaxTurns)
					s.model = e.String(config.WorkerModel)
					s.egressURL = e.UnitURL(config.EgressURL)
				})
				if err != nil {
					return err
				}
				if s.secrets, err = readDashboardSecrets(os.Stdin); err != nil {
					return err
				}
				srv, closeAll, err := runDashboard(service.NewOps(log.With("org", *org)), s, *addr)
				if err != nil {
					return err
				}
				defer closeAll()
				return srv.Serve(ctx)
			}
		},
	}
}

// chatSweep is what ends a chat turn's leftovers: inside an org unit (the dashboard its
// main process, under the unit's init, as a uid without capabilities), a sweep of every
// other process of its uid once the turn's agent has exited; a sweep that leaves one
// running ends the dashboard at once, without releasing the turn's home: lease, so its
// unit's end takes what is left. Elsewhere (a dashboard run by hand on a host, or a process
// runtime without bubblewrap) there is nothing it may sweep: unswept says why, for the
// dashboard to say once it serves.
func chatSweep(ops *service.Ops) (sweep func() error, broken func(error), unswept error) {
	if err := procsweep.CheckMain(); err != nil {
		return nil, nil, err
	}
	m := chat.NewSweepMetrics(ops.Registry)
	sweep = func() error {
		res, err := procsweep.SweepAsMain(5 * time.Second)
		m.Swept.Add(float64(res.Killed))
		switch {
		case err != nil:
			m.Sweeps.WithLabelValues("failed").Inc()
			return err
		case res.Killed > 0:
			m.Sweeps.WithLabelValues("killed").Inc()
			ops.Log.Warn("dashboard: ended what a chat turn's agent left running", "processes", res.Killed)
		default:
			m.Sweeps.WithLabelValues("clean").Inc()
		}
		return nil
	}
	broken = func(err error) {
		ops.Log.Error("dashboard: exiting at once, so that its unit's end takes what the sweep could not", "err", err.Error())
		os.Exit(1)
	}
	return sweep, broken, nil
}
