package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sys/unix"

	"hermeshost/config"
	"hermeshost/migrations"
	"hermeshost/pg"
	"hermeshost/service"
)

// startup builds the process logger and reads the environment through read; the first bad
// value stops start-up with one line naming the variable.
func startup(process string, read func(env *config.Env)) (*slog.Logger, error) {
	env := config.FromOS()
	level, err := service.ParseLevel(env.String(config.LogLevel))
	if err != nil {
		return nil, &config.Error{Var: config.LogLevel.Name, Msg: err.Error()}
	}
	read(env)
	if err := env.Err(); err != nil {
		return nil, err
	}
	return service.NewLogger(os.Stderr, level, process), nil
}

// serverEnv is what every server subcommand reads besides its own variables.
var serverEnv = []config.Var{config.LogLevel, config.ShutdownGrace}

// grace reads SHUTDOWN_GRACE.
func grace(env *config.Env) time.Duration { return env.Duration(config.ShutdownGrace) }

// openHostDB reads DATABASE_URL for an operator's subcommand (process names it in the logs)
// and opens the host database; close the pool when done.
func openHostDB(ctx context.Context, process string) (*pgxpool.Pool, *slog.Logger, error) {
	var url string
	log, err := startup(process, func(e *config.Env) { url = e.Required(config.DatabaseURL) })
	if err != nil {
		return nil, nil, err
	}
	pool, _, err := pg.Open(ctx, url, migrations.Host.DefaultSchema)
	if err != nil {
		return nil, nil, err
	}
	return pool, log, nil
}

// undumpable makes this process's /proc/<pid>/mem, environ and the like unreadable to any
// other process of the same user (an agent beside it) and refuses it ptrace: what holds
// secrets (a job token, keys, DATABASE_URL) calls it before it reads them.
func undumpable(what string) error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("make the %s undumpable: %w", what, err)
	}
	return nil
}
