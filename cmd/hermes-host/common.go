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
	"hermeshost/internal/logfmt"
	"hermeshost/migrations"
	"hermeshost/pg"
	"hermeshost/service"
)

// startup builds the process logger and reads the environment through read; the first bad
// value stops start-up with one line naming the variable.
func startup(process string, read func(env *config.Env)) (*slog.Logger, error) {
	log, _, err := startupWithRoot(process, read)
	return log, err
}

// startupWithRoot is startup that also returns the handler under the logger, which has no
// process attribute: dev logs its children's lines through it under their own names.
//
// The logger writes to stderr as LOG_FORMAT says (logfmt.New) and becomes slog's default,
// so that what logs through slog.Default or the log package reads the same.
func startupWithRoot(process string, read func(env *config.Env)) (*slog.Logger, slog.Handler, error) {
	env := config.FromOS()
	level, err := service.ParseLevel(env.String(config.LogLevel))
	if err != nil {
		return nil, nil, &config.Error{Var: config.LogLevel.Name, Msg: err.Error()}
	}
	format := env.OneOf(config.LogFormat, logfmt.Formats...)
	read(env)
	if err := env.Err(); err != nil {
		return nil, nil, err
	}
	root, err := logfmt.New(os.Stderr, logfmt.Options{Level: level, Format: format})
	if err != nil {
		return nil, nil, &config.Error{Var: config.LogFormat.Name, Msg: err.Error()}
	}
	log := slog.New(root).With(logfmt.ProcessKey, process)
	slog.SetDefault(log)
	return log, root, nil
}

// serverEnv is what every server subcommand reads besides its own variables.
var serverEnv = []config.Var{config.LogLevel, config.LogFormat, config.ShutdownGrace}

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
