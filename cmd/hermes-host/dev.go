package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"hermeshost/atomicfile"
	"hermeshost/cli"
	"hermeshost/config"
	"hermeshost/internal/logfmt"
	"hermeshost/migrations"
	"hermeshost/operator"
	"hermeshost/pg"
	"hermeshost/sartiq/backend"
	"hermeshost/scriptedagent"
	"hermeshost/service"
)

func devCommand() *cli.Command {
	return &cli.Command{
		Name:    "dev",
		Summary: "run the whole product on this machine (the embedded default of `make run`)",
		Env:     append(append([]config.Var{config.DatabaseURL, config.GatewaySecret, config.GatewayKey, config.SessionCookieSecure}, backendEnv...), dispatcherEnv...),
		Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
			addr := fs.String("addr", "127.0.0.1:8080", "listen address of the dev status server (port 0 picks one)")
			backendAddr := fs.String("backend-addr", "127.0.0.1:8090", "listen address of the seeded reference backend (port 0 picks one)")
			orgsRoot := fs.String("orgs-root", ".run/orgs", "where the demo organizations' homes are made")
			gw := gatewaySettings{upstream: demoUpstream}
			fs.StringVar(&gw.addr, "gateway-addr", "127.0.0.1:8091", "listen address of the model gateway, which serves the demo upstream (port 0 picks one)")
			controlAddr := fs.String("control-addr", "127.0.0.1:8092", "listen address of the dispatcher's control API, /healthz and /metrics (port 0 picks one)")
			launcherAddr := fs.String("launcher-addr", "127.0.0.1:8093", "listen address of the operators' launcher (port 0 picks one)")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("dev takes no arguments")
				}
				var url string
				var shutdownGrace time.Duration
				var bs backendSettings
				var ds dispatcherSettings
				var ls launcherSettings
				log, root, err := startupWithRoot("dev", func(e *config.Env) {
					// Plain HTTP on localhost: the cookie cannot be Secure unless asked.
					ls.secureCookie = false
					if _, set := os.LookupEnv(config.SessionCookieSecure.Name); set {
						ls.secureCookie = e.Bool(config.SessionCookieSecure)
					}
					url = e.Required(config.DatabaseURL)
					shutdownGrace = grace(e)
					bs = readBackendSettings(e, false)
					readGateway(e, &gw)
					readDispatcher(e, &ds, false)
					// A developer's dev, not root, cannot give the homes to another uid: its
					// units run as the developer unless told otherwise.
					if _, set := os.LookupEnv(config.UnitUser.Name); !set && os.Getuid() != 0 {
						ds.unitUser = fmt.Sprintf("%d:%d", os.Getuid(), os.Getgid())
					}
					// dev claims unless told not to; elsewhere claiming is opt-in.
					ds.claim = true
					if _, set := os.LookupEnv(config.ClaimEnabled.Name); set {
						ds.claim = e.Bool(config.ClaimEnabled)
					}
				})
				if err != nil {
					return err
				}
				unitOutput, stopForwarding, err := forwardUnits(root)
				if err != nil {
					return err
				}
				defer stopForwarding()
				if bs.cfg.BotToken == "" {
					// Nothing outside this process needs it until an operator sets one.
					bs.cfg.BotToken = service.Secret(rand.Text())
					log.Info("SARTIQ_BOT_TOKEN is not set: the reference backend uses a bot token made for this run")
				}
				if gw.secret == "" {
					gw.secret = randomSecret()
				}
				if gw.hostKey == "" {
					gw.hostKey = randomSecret()
				}
				if ds.dashSecret == "" {
					// The launcher signs with it and the dispatcher derives the dashboards'
					// keys from it: both are in this process, so one made for this run serves.
					ds.dashSecret = randomSecret()
				}
				ls.dashboardSecret = ds.dashSecret
				if err := migrations.Host.Up(ctx, url, log); err != nil {
					return err
				}
				pool, schema, err := pg.Open(ctx, url, migrations.Host.DefaultSchema)
				if err != nil {
					return err
				}
				defer pool.Close()

				ops := service.NewOps(log)
				ops.Health.Probe("database", pool.Ping)
				srv, err := service.Listen("dev", *addr, ops.Router(), log, shutdownGrace)
				if err != nil {
					return err
				}
				backendSrv, closeBackendDB, err := runBackend(ctx, bs, *backendAddr, seedDemoRun, service.NewOps(log))
				if err != nil {
					return err
				}
				defer closeBackendDB()

				g, gctx := errgroup.WithContext(ctx)
				// The backend and the gateway stop after the dispatcher, which lets the jobs in
				// flight finish in its JOB_GRACE, or has their workers release them, both of
				// which need them: they end when it has returned (or dev returns early).
				svc, stopServices := context.WithCancel(context.WithoutCancel(gctx))
				defer stopServices()
				gatewayUp := make(chan string, 1)
				g.Go(func() error { return runGateway(svc, log, gw, func(url string) { gatewayUp <- url }) })
				var gatewayURL string
				select {
				case gatewayURL = <-gatewayUp:
				case <-gctx.Done():
					stopServices()
					return g.Wait()
				}
				ls.dbURL, ls.grace = url, shutdownGrace
				launcherSrv, closeLauncher, err := runLauncher(gctx, service.NewOps(log), ls, *launcherAddr)
				if err != nil {
					return err
				}
				defer closeLauncher()
				login, err := demoOperator(gctx, pool)
				if err != nil {
					return err
				}
				log.Info("hermes-host dev is up", "status_url", srv.URL(), "backend_url", backendSrv.URL(),
					"gateway_url", gatewayURL, "launcher_url", launcherSrv.URL(), "schema", schema)
				// The one thing an operator needs to start, on stdout rather than in the log.
				fmt.Printf("\nLauncher: %s\nLog in as %s with password %s (made for this run)\n\n", launcherSrv.URL(), demoOperatorName, login)
				g.Go(func() error { return srv.Serve(gctx) })
				g.Go(func() error { return launcherSrv.Serve(gctx) })
				g.Go(func() error { return backendSrv.Serve(svc) })

				if ds.orgsRoot, err = filepath.Abs(*orgsRoot); err != nil {
					return err
				}
				ds.dbURL, ds.apiURL, ds.bot = url, backendSrv.URL(), bs.cfg.BotToken
				// A machine without bubblewrap still runs the demo, saying plainly beside the
				// launcher's address that its orgs are not isolated from each other.
				ds.allowUnisolated = true
				ds.announceUnisolated = func(err error) {
					fmt.Printf("WARNING: ORGS ARE NOT ISOLATED FROM EACH OTHER on this machine: %v.\n"+
						"Install bubblewrap (Debian: apt-get install bubblewrap) or use Docker before running anyone's agent here.\n\n", err)
				}
				ds.controlAddr = *controlAddr
				ds.stopUnits = true
				ds.output = unitOutput
				ds.gatewayURL, ds.gatewayKey, ds.gatewaySec = gatewayURL, gw.hostKey, gw.secret
				if _, set := os.LookupEnv(config.HermesBin.Name); !set {
					// Offline, the scripted agent built beside hermes-host plays Hermes.
					ds.workerEnv = append(ds.workerEnv, config.HermesBin.Name+"=scripted-agent")
					if err := demoKnobs(ds.orgsRoot); err != nil {
						return err
					}
				}
				g.Go(func() error {
					defer stopServices()
					return runDispatcher(gctx, log, ds)
				})
				return g.Wait()
			}
		},
	}
}

// forwardUnits is the pipe dev's process units (workers, dashboards) print to: each line
// they print is logged through root, dev's own handler, as a record of the unit's process
// (logfmt.Forward; "unit" for a line that is not a record), so the terminal shows one
// format and never a unit's raw JSON. The units share the pipe: a line of at most
// PIPE_BUF (4096) bytes is written whole, and every record they log is one write. stop
// closes dev's end and waits a moment for the units' last lines.
func forwardUnits(root slog.Handler) (w *os.File, stop func(), err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("the units' output pipe: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := logfmt.Forward(r, root, "unit"); err != nil && !errors.Is(err, os.ErrClosed) {
			slog.New(root).Error("forwarding the units' output", "process", "dev", "err", err)
			// A unit must never block on a full pipe.
			_, _ = io.Copy(io.Discard, r)
		}
	}()
	return w, func() {
		w.Close()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			// A unit's process that outlived it still holds the pipe.
		}
		r.Close()
	}, nil
}

// demoPace is how the scripted agent plays the demo orgs' jobs unless their homes say
// otherwise: slowly enough to watch a progress bar move, with subagents an operator can
// message or cancel from the dashboard while they work.
var demoPace = scriptedagent.Knobs{
	StepMS: 2500,
	Subagents: []scriptedagent.SubagentKnob{
		{Goal: "Collect what the sources say about the brand's voice", Role: "researcher", WaitMS: 30_000},
		{Goal: "Review the draft guidelines for contradictions", Role: "reviewer", WaitMS: 20_000},
	},
}

// demoKnobs writes demoPace into each demo org's home, keeping a knobs file already there.
func demoKnobs(orgsRoot string) error {
	b, err := json.MarshalIndent(demoPace, "", "  ")
	if err != nil {
		return err
	}
	for _, org := range backend.DemoOrganizations {
		home := filepath.Join(orgsRoot, org)
		if err := os.MkdirAll(home, 0o700); err != nil {
			return fmt.Errorf("demo home %s: %w", org, err)
		}
		p := filepath.Join(home, scriptedagent.KnobsFile)
		if _, err := os.Stat(p); err == nil {
			continue
		}
		if err := atomicfile.Write(p, append(b, '\n'), 0o600); err != nil {
			return fmt.Errorf("demo home %s: %w", org, err)
		}
	}
	return nil
}

// demoOperatorName is the operator `dev` logs in as.
const demoOperatorName = "admin"

// demoOperator makes (or keeps) the dev operator, gives it a password made for this run and
// grants it the demo orgs; it returns the password.
func demoOperator(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	ops, err := operator.New(pool, 0)
	if err != nil {
		return "", err
	}
	pw := operator.GeneratePassword()
	err = ops.Add(ctx, demoOperatorName, pw, "dev")
	if errors.Is(err, operator.ErrExists) {
		err = ops.SetPassword(ctx, demoOperatorName, pw, "dev")
	}
	if err != nil {
		return "", err
	}
	if err := ops.SetDisabled(ctx, demoOperatorName, false, "dev"); err != nil {
		return "", err
	}
	for _, org := range backend.DemoOrganizations {
		if err := ops.Grant(ctx, demoOperatorName, org, "dev"); err != nil {
			return "", err
		}
	}
	return pw, nil
}
