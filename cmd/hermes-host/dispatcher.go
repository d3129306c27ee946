package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/cli"
	"hermeshost/config"
	"hermeshost/control"
	"hermeshost/dashboards"
	"hermeshost/dispatch"
	"hermeshost/dispatch/runtime"
	"hermeshost/internal/egress"
	"hermeshost/internal/unitnet"
	"hermeshost/lease"
	"hermeshost/migrations"
	"hermeshost/pg"
	"hermeshost/sartiq"
	"hermeshost/service"
	"hermeshost/subagent"
)

type dispatcherSettings struct {
	dbURL, apiURL            string
	bot                      service.Secret
	gatewayURL               string
	gatewayKey, gatewaySec   service.Secret
	workerModel, visionModel string
	claim                    bool
	maxAttempts              int
	poll                     time.Duration
	orgsRoot, instance       string
	workerImage, dashImage   string
	workerEnv                []string
	leaseTTL, jobGrace       time.Duration
	idleTimeout, httpGrace   time.Duration
	maxOrgs                  int
	controlAddr, controlURL  string
	controlSecret            service.Secret
	// dashSecret derives the dashboards' assertion keys (shared with the launcher); empty:
	// this dispatcher starts no dashboards and says so once.
	dashSecret service.Secret
	dashIdle   time.Duration
	runtime    string
	// limits bound every org unit (UNIT_*_LIMIT); unitUser is the uid:gid in containers.
	limits   runtime.Limits
	unitUser string
	// unitUIDs is UNIT_UIDS' range (perOrgUIDs false: shared, every org as unitUser).
	unitUIDs   [2]int
	perOrgUIDs bool
	// egress is UNIT_EGRESS (none or public), egressAllow UNIT_EGRESS_ALLOW, egressConns
	// UNIT_EGRESS_CONNS.
	egress      string
	egressAllow []netip.Prefix
	egressConns int
	// network is UNIT_NETWORK (runtime.NetworkIsolated or NetworkHost); runRoot, RUN_ROOT.
	network, runRoot string
	// sandbox is the process runtime's (HERMES_SANDBOX); allowUnisolated lets it run
	// without one (HERMES_ALLOW_UNISOLATED, always in dev), which announceUnisolated, when
	// set, tells the operator besides the log.
	sandbox            string
	allowUnisolated    bool
	announceUnisolated func(error)
	// stopUnits removes the org containers on exit (dev: a local run leaves nothing
	// behind); a production dispatcher leaves them for its next start to adopt.
	stopUnits bool
	// output receives what process units print (runtime.Config.Output); nil is stderr.
	output io.Writer
}

var dispatcherEnv = []config.Var{config.DatabaseURL, config.SartiqAPIURL, config.SartiqBotToken, config.GatewayURL,
	config.GatewayKey, config.GatewaySecret, config.WorkerModel, config.VisionModel, config.ClaimEnabled,
	config.PollInterval, config.MaxAttempts, config.OrgsRoot, config.HermesInstance, config.WorkerImage, config.DashboardImage,
	config.HermesBin, config.HeartbeatInterval, config.MaxTurns, config.MaxResumes, config.HermesBundledSkills,
	config.SkillsMaxAuthored, config.LeaseTTL, config.MaxOrgs, config.JobGrace, config.WorkerIdleTimeout,
	config.Runtime, config.ControlAddr, config.ControlURL, config.ControlSecret, config.DashboardSecret, config.DashboardIdleTimeout,
	config.UnitMemoryLimit, config.UnitCPULimit, config.UnitPidsLimit, config.UnitLimitsNone, config.UnitUser, config.UnitUIDs, config.UnitEgress, config.UnitEgressAllow, config.UnitNetwork, config.RunRoot,
	config.Sandbox, config.AllowUnisolated, config.ShutdownGrace, config.LogLevel, config.LogFormat}

func readDispatcher(e *config.Env, s *dispatcherSettings, requireAll bool) {
	s.dbURL = e.Required(config.DatabaseURL)
	if requireAll {
		s.apiURL = e.Required(config.SartiqAPIURL)
		s.bot = service.Secret(e.Required(config.SartiqBotToken))
		s.gatewayURL = e.Required(config.GatewayURL)
		s.gatewayKey = service.Secret(e.Required(config.GatewayKey))
		s.gatewaySec = service.Secret(e.Required(config.GatewaySecret))
		s.claim = e.Bool(config.ClaimEnabled)
		s.orgsRoot = e.String(config.OrgsRoot)
	}
	s.workerModel = e.String(config.WorkerModel)
	s.visionModel = e.String(config.VisionModel)
	s.poll = e.Duration(config.PollInterval)
	s.maxAttempts = e.Int(config.MaxAttempts)
	s.instance = e.String(config.HermesInstance)
	s.workerImage = e.String(config.WorkerImage)
	s.dashImage = e.String(config.DashboardImage)
	s.runtime = e.OneOf(config.Runtime, "auto", "docker", "process")
	s.sandbox = e.OneOf(config.Sandbox, runtime.SandboxAuto, runtime.SandboxBwrap, runtime.SandboxNone)
	s.allowUnisolated = e.Bool(config.AllowUnisolated)
	s.leaseTTL = e.Duration(config.LeaseTTL)
	s.maxOrgs = e.Int(config.MaxOrgs)
	s.jobGrace = e.Duration(config.JobGrace)
	s.idleTimeout = e.Duration(config.WorkerIdleTimeout)
	s.httpGrace = grace(e)
	s.controlAddr = e.String(config.ControlAddr)
	s.controlURL = e.String(config.ControlURL)
	s.controlSecret = service.Secret(e.String(config.ControlSecret))
	s.dashSecret = service.Secret(e.String(config.DashboardSecret))
	s.dashIdle = e.Duration(config.DashboardIdleTimeout)
	l := e.UnitLimits()
	s.limits = runtime.Limits{MemoryBytes: l.MemoryBytes, NanoCPUs: l.NanoCPUs, Pids: l.Pids}
	s.unitUser = e.UnitUser()
	first, last, perOrg := e.UnitUIDs()
	s.unitUIDs, s.perOrgUIDs = [2]int{first, last}, perOrg
	s.egress = e.OneOf(config.UnitEgress, "none", "public")
	s.egressAllow = e.UnitEgressAllow()
	s.egressConns = e.Int(config.UnitEgressConns)
	s.network = e.OneOf(config.UnitNetwork, runtime.NetworkIsolated, runtime.NetworkHost)
	s.runRoot = e.String(config.RunRoot)
	// The workers' own settings, passed on when the operator set them (the worker has the
	// same defaults).
	for _, v := range []config.Var{config.HermesBin, config.HeartbeatInterval, config.MaxTurns, config.MaxResumes,
		config.HermesBundledSkills, config.SkillsMaxAuthored} {
		if val, ok := os.LookupEnv(v.Name); ok {
			s.workerEnv = append(s.workerEnv, v.Name+"="+val)
		}
	}
}

// dashboardEnv is what a dashboard's chat needs to run the agent as jobs do: the agent
// command and turn limit the workers get, and the model.
func dashboardEnv(s dispatcherSettings) []string {
	env := []string{config.WorkerModel.Name + "=" + s.workerModel}
	for _, kv := range s.workerEnv {
		for _, v := range []config.Var{config.HermesBin, config.MaxTurns} {
			if strings.HasPrefix(kv, v.Name+"=") {
				env = append(env, kv)
			}
		}
	}
	return env
}

// runDispatcher polls until ctx ends, then stops claiming, lets the jobs in flight finish
// within JOB_GRACE (else has them released) and gives up its leases. A shutdown that
// arrives while it is still starting is a clean stop, not an error.
func runDispatcher(ctx context.Context, log *slog.Logger, s dispatcherSettings) error {
	// It holds DATABASE_URL, the bot token and the secrets every org's keys derive from,
	// and starts agents' units as children.
	if err := undumpable("dispatcher"); err != nil {
		return err
	}
	err := dispatchUntilDone(ctx, log, s)
	if err != nil && ctx.Err() != nil {
		return nil
	}
	return err
}

func dispatchUntilDone(ctx context.Context, log *slog.Logger, s dispatcherSettings) error {
	if s.instance == "" {
		h, err := os.Hostname()
		if err != nil {
			return err
		}
		s.instance = h
	}
	if s.dashSecret != "" && len(s.dashSecret) < 16 {
		// The launcher refuses a shorter one to sign with; a dispatcher starting dashboards
		// whose assertions nobody can make would only fail later.
		return &config.Error{Var: config.DashboardSecret.Name, Msg: "(secret value) is shorter than 16 characters"}
	}
	if s.controlSecret == "" {
		// Keys minted from it reach only this run's containers; replicas must share one.
		s.controlSecret = service.Secret(randomSecret())
		log.Info("CONTROL_SECRET is not set: per-org control keys derive from a secret made for this run")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ops := service.NewOps(log)
	// The database first: the instance's lease says no other dispatcher runs under this
	// name before the runtime adopts (and removes) what it finds of this instance's.
	if err := migrations.Host.Up(ctx, s.dbURL, log); err != nil {
		return err
	}
	pool, _, err := pg.Open(ctx, s.dbURL, migrations.Host.DefaultSchema)
	if err != nil {
		return err
	}
	defer pool.Close()
	ops.Health.Probe("database", pool.Ping)
	if err := pg.RegisterPoolMetrics(ops.Registry, pg.MainPool, pool); err != nil {
		return err
	}
	// The dispatcher's own leases (its instance's, its orgs', its runs' homes) are kept on
	// a few connections of their own: on the main pool their refreshes queued behind the
	// steps and mirror writes of 100 runs, and home: leases lapsed while they waited.
	keepPool, _, err := pg.OpenWith(ctx, s.dbURL, migrations.Host.DefaultSchema, pg.Options{MaxConns: lease.KeepPoolConns, Name: pg.LeasePool})
	if err != nil {
		return err
	}
	defer keepPool.Close()
	if err := pg.RegisterPoolMetrics(ops.Registry, pg.LeasePool, keepPool); err != nil {
		return err
	}
	leases, agentLeases := leaseStores(pool, keepPool, log, ops.Registry)
	defer leases.Close()
	defer agentLeases.Close()
	kept, err := holdInstance(ctx, leases, s.instance, s.leaseTTL, log)
	if err != nil {
		return err
	}
	defer releaseInstance(leases, kept, log)
	outer := ctx
	ctx = kept.Context() // losing the instance's lease stops this dispatcher
	subagents := subagent.New(pool, subagent.Options{Log: log, Registerer: ops.Registry})
	defer subagents.Close()
	ctl, err := control.NewServer(control.Config{DB: pool, Leases: agentLeases, Subagents: subagents, Secret: s.controlSecret, Log: log, Registerer: ops.Registry})
	if err != nil {
		return err
	}
	// Its mirror's LISTEN connection ends before the pool it uses.
	defer ctl.Close()
	// What an org's units may use of the host, each through a socket of the org's.
	var egressProxy http.Handler
	switch {
	case s.egress != "public":
	case s.network != runtime.NetworkIsolated:
		log.Info("UNIT_EGRESS=public: units are on the host's network (UNIT_NETWORK=host), where they reach what the host reaches; no egress proxy")
	default:
		proxy := egress.New(egress.Config{Allow: s.egressAllow, MaxConnsPerOrg: s.egressConns, OrgOf: unitnet.OrgOf, Log: log, Registerer: ops.Registry})
		defer proxy.Close()
		egressProxy = proxy
		log.Info("org units reach the public internet through the egress proxy", "allow", fmt.Sprint(s.egressAllow), "max_conns_per_org", s.egressConns)
	}
	services, err := dispatch.UnitServices(s.apiURL, s.gatewayURL, ctl.Handler(), egressProxy)
	if err != nil {
		return err
	}
	// Each org its own uid, where this process may give an org's files to one.
	var users runtime.Users
	unitUsers := s.unitUser
	switch {
	case !s.perOrgUIDs:
	case os.Geteuid() != 0:
		log.Warn("UNIT_UIDS: not root, so every org's units run as UNIT_USER", "unit_user", s.unitUser)
	default:
		if users, err = dispatch.NewUnitUsers(pool, s.unitUIDs[0], s.unitUIDs[1]); err != nil {
			return err
		}
		unitUsers = fmt.Sprintf("each org its own of %d-%d", s.unitUIDs[0], s.unitUIDs[1])
	}
	rt, err := openRuntime(ctx, s.runtime, runtime.Config{
		Instance: s.instance, OrgsRoot: s.orgsRoot, WorkspacesRoot: filepath.Join(filepath.Dir(s.orgsRoot), "workspaces"),
		WorkerIdle: []string{"hermes-host", "worker", "idle"}, WorkerImage: s.workerImage, DashboardImage: s.dashImage,
		Network: s.network, Services: services, RunRoot: s.runRoot, BinDir: filepath.Dir(self), Logger: log, IdleTimeout: s.idleTimeout,
		Metrics: runtime.NewMetrics(ops.Registry), Limits: s.limits, User: s.unitUser, Users: users,
		Sandbox: runtime.Sandbox{Mode: s.sandbox}, Output: s.output, FollowLogs: s.output != nil, // dev shows every unit's lines
		InstanceLive: func(ctx context.Context, instance string) (bool, error) {
			return instanceLive(ctx, leases, instance)
		},
	})
	if err != nil {
		return err
	}
	if err := checkIsolation(rt, log, s); err != nil {
		rt.Close()
		return err
	}
	defer rt.Close()
	if s.stopUnits {
		defer stopUnits(rt, log)
	}
	dashStore := dashboards.New(pool, dashboards.Options{Log: log, Registerer: ops.Registry})
	defer dashStore.Close()
	bot, err := sartiq.New(s.apiURL, s.bot.Reveal())
	if err != nil {
		return err
	}
	router := ops.Router()
	router.Handle("/v1/*", ctl.Handler())
	srv, err := service.Listen("dispatcher", s.controlAddr, router, log, s.httpGrace)
	if err != nil {
		return err
	}
	controlURL := s.controlURL
	if controlURL == "" {
		controlURL = srv.URL()
	}
	d := dispatch.New(dispatch.Config{
		Instance: s.instance, Bot: bot, APIURL: s.apiURL, Runtime: rt, DB: pool, Leases: leases, Subagents: subagents, OrgsRoot: s.orgsRoot,
		GatewayURL: s.gatewayURL, GatewayKey: s.gatewayKey, GatewaySecret: s.gatewaySec,
		WorkerModel: s.workerModel, VisionModel: s.visionModel, ClaimEnabled: s.claim, MaxAttempts: s.maxAttempts,
		LeaseTTL: s.leaseTTL, MaxOrgs: s.maxOrgs, WorkerEnv: s.workerEnv, DashboardEnv: dashboardEnv(s), Log: log, Registerer: ops.Registry,
		ControlURL: controlURL, ControlKey: func(org string) (string, error) { return control.Key(s.controlSecret, org) },
		Dashboards: dashStore, DashboardSecret: s.dashSecret, DashboardIdle: s.dashIdle,
		// Docker dashboards outlive a production dispatcher for its next start to adopt;
		// process ones die with it, and dev removes its units.
		KeepDashboards: !s.stopUnits && rt.Kind() == "docker",
	})
	// The dashboards' own /metrics, on their sockets where no Prometheus reaches, gathered
	// with an org label on each series. Routes are added before the server serves.
	router.Method(http.MethodGet, "/metrics/dashboards", d.DashboardMetrics())
	served := make(chan error, 1)
	srvCtx, stopSrv := context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		stopSrv()
		<-served
	}()
	go func() { served <- srv.Serve(srvCtx) }()
	if s.limits.MemoryBytes == 0 || s.limits.NanoCPUs == 0 || s.limits.Pids == 0 {
		log.Warn("org units are unbounded where a limit is 0 (UNIT_LIMITS_NONE=true)", "memory_bytes", s.limits.MemoryBytes,
			"nano_cpus", s.limits.NanoCPUs, "pids", s.limits.Pids)
	}
	log.Info("dispatcher polling", "runtime", rt.Kind(), "claim_enabled", s.claim, "poll", s.poll.String(),
		"unit_memory_bytes", s.limits.MemoryBytes, "unit_nano_cpus", s.limits.NanoCPUs, "unit_pids", s.limits.Pids, "unit_users", unitUsers,
		"instance", s.instance, "holder", d.Holder(), "status_url", srv.URL())
	dashDone := make(chan struct{})
	go func() {
		defer close(dashDone)
		d.RunDashboards(ctx)
	}()
	defer func() { <-dashDone }()
	d.Run(ctx, dispatch.RunOptions{
		Poll: s.poll, Grace: s.jobGrace,
		Cycled: func(n int, err error) {
			switch {
			case errors.Is(err, dispatch.ErrGateClosed):
				log.Warn("not polling: gateway gate closed", "err", err)
			case err != nil && ctx.Err() == nil:
				log.Warn("poll cycle failed", "err", err)
			case n > 0:
				log.Info("jobs started", "count", n)
			}
		},
	})
	log.Info("dispatcher stopped")
	if cause := context.Cause(kept.Context()); outer.Err() == nil && cause != nil {
		return fmt.Errorf("stopped: the lease of HERMES_INSTANCE=%s was lost (%v); another dispatcher may run under this name", s.instance, cause)
	}
	return nil
}

// stopUnits stops and removes every unit the runtime runs for this instance.
func stopUnits(rt runtime.Runtime, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	units, err := rt.List(ctx)
	if err != nil {
		log.Warn("list org units to stop", "err", err)
		return
	}
	for _, u := range units {
		if err := rt.Stop(ctx, u.Org, u.Role); err != nil {
			log.Warn("stop org unit", "unit", u.Name, "err", err)
		}
	}
	if len(units) > 0 {
		log.Info("org units stopped", "count", len(units))
	}
}

// openRuntime opens the runtime HERMES_RUNTIME names; auto picks Docker when an engine
// answers.
func openRuntime(ctx context.Context, kind string, cfg runtime.Config) (runtime.Runtime, error) {
	switch kind {
	case "docker":
		d, err := runtime.NewDocker(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return d, nil
	case "process":
		p, err := runtime.NewProcess(cfg)
		if err != nil {
			return nil, err
		}
		return p, nil
	}
	return runtime.Detect(ctx, cfg)
}

func dispatcherCommand() *cli.Command {
	return &cli.Command{
		Name:    "dispatcher",
		Summary: "poll the backend behind the gateway gate, claim, and run each org's jobs in its worker",
		Env:     dispatcherEnv,
		Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("dispatcher takes no arguments")
				}
				var s dispatcherSettings
				log, err := startup("dispatcher", func(e *config.Env) { readDispatcher(e, &s, true) })
				if err != nil {
					return err
				}
				return runDispatcher(ctx, log, s)
			}
		},
	}
}

// leaseStores are a dispatcher's two Stores over its one lease table. own holds the
// dispatcher's leases (instance, orgs, homes) and keeps them on keepPool. agents serves the
// control API's lease requests, which agents make: all on the main pool, never in the
// queue the dispatcher keeps its own leases in, so a hostile agent's flood cannot make
// them lapse.
func leaseStores(pool, keepPool *pgxpool.Pool, log *slog.Logger, reg prometheus.Registerer) (own, agents *lease.Store) {
	own = lease.New(pool, lease.Options{Log: log, Registerer: reg, KeepPool: keepPool})
	agents = lease.New(pool, lease.Options{Log: log, Registerer: reg})
	return own, agents
}
