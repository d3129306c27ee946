package main

import (
	"log/slog"
	"os"
	"time"

	"hermeshost/config"
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
