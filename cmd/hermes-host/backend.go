package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"

	"hermeshost/cli"
	"hermeshost/config"
	"hermeshost/pg"
	"hermeshost/sartiq/backend"
	"hermeshost/service"
)

// backendSettings is what the reference backend reads from the environment.
type backendSettings struct {
	databaseURL string
	cfg         backend.Config
	grace       time.Duration
}

var backendEnv = append([]config.Var{config.BackendDatabaseURL, config.DatabaseURL, config.SartiqBotToken,
	config.StaleAfter, config.BackendTokenTTL}, serverEnv...)

func readBackendSettings(e *config.Env, botTokenRequired bool) backendSettings {
	var s backendSettings
	s.databaseURL = e.String(config.BackendDatabaseURL)
	if s.databaseURL == "" {
		s.databaseURL = backendSchemaOf(e.Required(config.DatabaseURL))
	}
	bot := e.String(config.SartiqBotToken)
	if botTokenRequired {
		bot = e.Required(config.SartiqBotToken)
	}
	s.cfg = backend.Config{
		BotToken:   service.Secret(bot),
		StaleAfter: e.Duration(config.StaleAfter),
		TokenTTL:   e.Duration(config.BackendTokenTTL),
	}
	s.grace = grace(e)
	return s
}

// backendSchemaOf is DATABASE_URL pointed at the backend's own schema: the backend never
// shares the host's, whatever search_path DATABASE_URL names.
func backendSchemaOf(databaseURL string) string {
	if databaseURL == "" {
		return ""
	}
	if u, err := url.Parse(databaseURL); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("search_path", backend.Migrations.DefaultSchema)
		u.RawQuery = q.Encode()
		return u.String()
	}
	// A keyword/value DSN: the last setting of a keyword wins.
	return strings.TrimSpace(databaseURL) + " search_path=" + backend.Migrations.DefaultSchema
}

// seeding is what runBackend puts in the backend before it serves.
type seeding int

const (
	seedNothing seeding = iota
	seedDemo            // the demo orgs, products and jobs, once
	// seedDemoRun is seedDemo plus a fresh batch of demo jobs when the earlier ones are all
	// done, so that every `make run` shows jobs flowing.
	seedDemoRun
)

// runBackend migrates the backend's schema, seeds it as asked, and listens; the caller
// serves.
func runBackend(ctx context.Context, s backendSettings, addr string, seed seeding, ops *service.Ops) (*service.Server, func(), error) {
	if err := backend.Migrations.Up(ctx, s.databaseURL, ops.Log); err != nil {
		return nil, nil, err
	}
	pool, schema, err := pg.Open(ctx, s.databaseURL, backend.Migrations.DefaultSchema)
	if err != nil {
		return nil, nil, fmt.Errorf("backend: %w", err)
	}
	if seed != seedNothing {
		if err := backend.SeedDemo(ctx, pool, time.Now()); err != nil {
			pool.Close()
			return nil, nil, err
		}
	}
	if seed == seedDemoRun {
		batch := time.Now().UTC().Format("20060102T150405")
		queued, err := backend.QueueDemoBatch(ctx, pool, time.Now(), batch)
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		if queued {
			ops.Log.Info("the earlier demo jobs are done: queued a fresh batch", "batch", batch)
		}
	}
	h, err := backend.New(pool, s.cfg, ops)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	srv, err := service.Listen("backend", addr, h, ops.Log, s.grace)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	ops.Log.Info("reference backend is up", "url", srv.URL(), "schema", schema, "seeded", seed != seedNothing)
	return srv, pool.Close, nil
}

func backendCommand() *cli.Command {
	return &cli.Command{
		Name:    "backend",
		Summary: "serve the reference Sartiq agent-jobs API (its OpenAPI document at /openapi.json)",
		Env:     backendEnv,
		Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
			addr := fs.String("addr", "127.0.0.1:8090", "listen address (port 0 picks one)")
			seed := fs.Bool("seed-demo", false, "create the demo organizations, products and jobs (idempotent)")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("backend takes no arguments")
				}
				var s backendSettings
				log, err := startup("backend", func(e *config.Env) { s = readBackendSettings(e, true) })
				if err != nil {
					return err
				}
				seeds := seedNothing
				if *seed {
					seeds = seedDemo
				}
				srv, closeDB, err := runBackend(ctx, s, *addr, seeds, service.NewOps(log))
				if err != nil {
					return err
				}
				defer closeDB()
				return srv.Serve(ctx)
			}
		},
	}
}
