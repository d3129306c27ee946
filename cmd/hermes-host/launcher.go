package main

import (
	"context"
	"flag"
	"time"

	"hermeshost/cli"
	"hermeshost/config"
	"hermeshost/dashboards"
	"hermeshost/migrations"
	"hermeshost/operator"
	"hermeshost/pg"
	"hermeshost/service"
	"hermeshost/web"
)

type launcherSettings struct {
	dbURL        string
	secureCookie bool
	grace        time.Duration
	// dashboardSecret signs the assertions org dashboards verify; the dispatcher that
	// starts them derives their keys from the same secret. Empty: no dashboards.
	dashboardSecret service.Secret
}

// runLauncher migrates, opens the database and listens; the caller serves.
func runLauncher(ctx context.Context, ops *service.Ops, s launcherSettings, addr string) (*service.Server, func(), error) {
	if err := migrations.Host.Up(ctx, s.dbURL, ops.Log); err != nil {
		return nil, nil, err
	}
	pool, _, err := pg.Open(ctx, s.dbURL, migrations.Host.DefaultSchema)
	if err != nil {
		return nil, nil, err
	}
	ops.Health.Probe("database", pool.Ping)
	if err := pg.RegisterPoolMetrics(ops.Registry, pg.MainPool, pool); err != nil {
		pool.Close()
		return nil, nil, err
	}
	opStore, err := operator.New(pool, 0)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	// The launcher only asks for dashboards and reads where they answer; their metrics are the dispatcher's.
	dash := dashboards.New(pool, dashboards.Options{Log: ops.Log})
	if s.dashboardSecret == "" {
		ops.Log.Warn("DASHBOARD_SECRET is not set: org dashboards cannot be opened from this launcher")
	}
	l, err := web.NewLauncher(ops, web.LauncherConfig{DB: pool, Operators: opStore, SecureCookie: s.secureCookie,
		Dashboards: dash, DashboardSecret: s.dashboardSecret})
	if err != nil {
		dash.Close()
		pool.Close()
		return nil, nil, err
	}
	srv, err := service.Listen("launcher", addr, l.Handler(), ops.Log, s.grace)
	if err != nil {
		l.Close()
		dash.Close()
		pool.Close()
		return nil, nil, err
	}
	return srv, func() { l.Close(); dash.Close(); pool.Close() }, nil
}

func launcherCommand() *cli.Command {
	return &cli.Command{
		Name:    "launcher",
		Summary: "serve the operators' launcher: login, and the index of the orgs granted to each",
		Env:     append([]config.Var{config.DatabaseURL, config.SessionCookieSecure, config.DashboardSecret}, serverEnv...),
		Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
			addr := fs.String("addr", "127.0.0.1:8093", "listen address (port 0 picks one)")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("launcher takes no arguments")
				}
				var s launcherSettings
				log, err := startup("launcher", func(e *config.Env) {
					s.dbURL = e.Required(config.DatabaseURL)
					s.secureCookie = e.Bool(config.SessionCookieSecure)
					s.grace = e.Duration(config.ShutdownGrace)
					s.dashboardSecret = service.Secret(e.String(config.DashboardSecret))
				})
				if err != nil {
					return err
				}
				srv, closeAll, err := runLauncher(ctx, service.NewOps(log), s, *addr)
				if err != nil {
					return err
				}
				defer closeAll()
				return srv.Serve(ctx)
			}
		},
	}
}
