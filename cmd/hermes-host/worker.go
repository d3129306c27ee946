package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"hermeshost/cli"
	"hermeshost/config"
	"hermeshost/control"
	"hermeshost/hermesplugin"
	"hermeshost/internal/procsweep"
	"hermeshost/internal/unitnet"
	"hermeshost/orghome"
	"hermeshost/sartiq"
	"hermeshost/service"
	"hermeshost/subagent"
	"hermeshost/worker"
)

func workerCommand() *cli.Command {
	return &cli.Command{
		Name:    "worker",
		Summary: "what runs inside an org's worker container",
		Subcommands: []*cli.Command{
			{
				Name:    "idle",
				Summary: "the container's main process: wait for jobs to be executed beside it, until SIGTERM",
				Env:     []config.Var{config.LogLevel, config.LogFormat},
				Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
					return func(ctx context.Context, args []string) error {
						if len(args) > 0 {
							return cli.Usagef("worker idle takes no arguments")
						}
						log, err := startup("worker", func(*config.Env) {})
						if err != nil {
							return err
						}
						log.Info("worker idle: jobs are executed beside this process")
						<-ctx.Done()
						log.Info("worker idle: stopping")
						return nil
					}
				},
			},
			runJobCommand(),
			{
				Name: "sweep",
				Summary: "kill every process an exec left in this worker container (the runtime runs it after each job; " +
					"it refuses to run anywhere but beside worker idle, as another uid)",
				Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
					return func(ctx context.Context, args []string) error {
						if len(args) > 0 {
							return cli.Usagef("worker sweep takes no arguments")
						}
						res, err := procsweep.Sweep(5*time.Second, "hermes-host worker idle")
						fmt.Printf("swept %d\n", res.Killed)
						return err
					}
				},
			},
		},
	}
}

// errNotFinished makes run-job exit non-zero when the job was not brought to an end here.
var errNotFinished = errors.New("the job did not finish in this run")

// errStdinClosed is why a run with hold_stdin stops: its caller closed stdin.
var errStdinClosed = errors.New("stdin closed by the caller")

func runJobCommand() *cli.Command {
	return &cli.Command{
		Name: "run-job",
		Summary: "run one job end to end: the assignment on stdin, the job token in SARTIQ_TOKEN; " +
			"progress as JSON lines on stdout; SIGTERM releases the job, except with hold_stdin, where EOF on stdin " +
			"releases it and a signal is a crash (the attempt counts)",
		Env: []config.Var{config.SartiqToken, config.SartiqAPIURL, config.HermesOrg, config.HermesHome,
			config.GatewayURL, config.GatewayKey, config.WorkerModel, config.HermesBin, config.MaxTurns,
			config.MaxResumes, config.HeartbeatInterval, config.ReportEnabled, config.HermesBundledSkills,
			config.SkillsMaxAuthored, config.WorkspaceRetention, config.EgressURL,
			config.WorkspaceKeep, config.ControlURL, config.ControlKey, config.LogLevel, config.LogFormat},
		Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("run-job takes no arguments: the assignment comes on stdin")
				}
				// The agent runs as this user: make our /proc/<pid>/environ, which holds the
				// job token, unreadable to it.
				if err := undumpable("worker"); err != nil {
					return err
				}
				var cfg worker.Config
				var apiURL, token, controlURL, controlKey string
				log, err := startup("worker", func(e *config.Env) {
					token = e.Required(config.SartiqToken)
					apiURL = e.Required(config.SartiqAPIURL)
					apiURL = e.UnitURL(config.SartiqAPIURL)
					cfg.Org = e.Required(config.HermesOrg)
					cfg.Home = e.Required(config.HermesHome)
					cfg.GatewayURL = e.UnitURL(config.GatewayURL)
					cfg.EgressURL = e.UnitURL(config.EgressURL)
					cfg.GatewayKey = service.Secret(e.String(config.GatewayKey))
					cfg.Model = e.String(config.WorkerModel)
					cfg.HermesBin = e.String(config.HermesBin)
					cfg.BundledSkills = e.String(config.HermesBundledSkills)
					cfg.SkillsMax = e.Int(config.SkillsMaxAuthored)
					cfg.MaxTurns = e.Int(config.MaxTurns)
					cfg.MaxResumes = e.Int(config.MaxResumes)
					cfg.Heartbeat = e.Duration(config.HeartbeatInterval)
					cfg.ReportEnabled = e.Bool(config.ReportEnabled)
					cfg.Retention = orghome.Retention{MaxAge: e.Duration(config.WorkspaceRetention), MaxCount: e.Int(config.WorkspaceKeep)}
					controlURL = e.UnitURL(config.ControlURL)
					controlKey = e.String(config.ControlKey)
				})
				if err != nil {
					return err
				}
				// Off the host's network, the host's services are sockets: each gets a
				// forwarder on the unit's loopback, the gateway's at the address the agent's
				// config.yaml names. They live as long as the process: a run told to stop still
				// reports through them.
				fwd := context.WithoutCancel(ctx)
				if apiURL, err = unitnet.Resolve(fwd, apiURL, "", log); err != nil {
					return err
				}
				if controlURL, err = unitnet.Resolve(fwd, controlURL, "", log); err != nil {
					return err
				}
				if cfg.GatewayURL, err = unitnet.Resolve(fwd, cfg.GatewayURL, unitnet.GatewayAddr, log); err != nil {
					return err
				}
				if cfg.EgressURL, err = unitnet.Resolve(fwd, cfg.EgressURL, unitnet.EgressAddr, log); err != nil {
					return err
				}
				// The variables go only to the proxies, never further (nor where their files are).
				for _, v := range []config.Var{config.SartiqToken, config.ControlKey} {
					for _, name := range []string{v.Name, v.FileVar()} {
						if err := os.Unsetenv(name); err != nil {
							return err
						}
					}
				}
				switch {
				case controlURL != "" && controlKey != "":
					// Longer than any mailbox wait the API grants; a hook's own context ends it sooner.
					cfg.Control, err = control.NewClient(controlURL, controlKey, &http.Client{Timeout: 2 * subagent.MaxWait})
					if err != nil {
						return &config.Error{Var: config.ControlURL.Name + "/" + config.ControlKey.Name, Msg: err.Error()}
					}
				case controlURL != "" || controlKey != "":
					return &config.Error{Var: config.ControlURL.Name + "/" + config.ControlKey.Name, Msg: "only one of the two is set: set both or neither"}
				}
				if cfg.API, err = url.Parse(apiURL); err != nil || cfg.API.Host == "" {
					return &config.Error{Var: config.SartiqAPIURL.Name, Msg: "is not an absolute URL"}
				}
				if cfg.GatewayURL == "" {
					return &config.Error{Var: config.GatewayURL.Name, Msg: "is required and not set"}
				}
				self, err := os.Executable()
				if err != nil {
					return err
				}
				cfg.SartiqBin = filepath.Join(filepath.Dir(self), "sartiq")
				if _, err := os.Stat(cfg.SartiqBin); err != nil {
					// Not installed under that name: the workspace gets its own link.
					cfg.SartiqBin = ""
				}
				cfg.Plugin = orghome.Plugin{Name: hermesplugin.Name, Files: hermesplugin.Files()}
				cfg.Token = service.Secret(token)
				cfg.Log = log
				cfg.Progress = os.Stdout

				var a worker.Assignment
				dec := json.NewDecoder(io.LimitReader(os.Stdin, 1<<20))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&a); err != nil {
					return fmt.Errorf("read the assignment from stdin: %w", err)
				}
				if a.Job.ID == "" || a.ManifestURL == "" {
					return errors.New("the assignment on stdin names no job or manifest")
				}
				if a.HoldStdin {
					// Only the dispatcher stops this run, by closing stdin; a signal is
					// someone else (the agent killing its parent, say): a crash.
					signalled := ctx
					var stop context.CancelCauseFunc
					ctx, stop = context.WithCancelCause(context.WithoutCancel(ctx))
					defer stop(nil)
					go func() {
						select {
						case <-signalled.Done():
							stop(fmt.Errorf("%w (%v)", worker.ErrSignalled, context.Cause(signalled)))
						case <-ctx.Done():
						}
					}()
					go func() {
						// Straight from os.Stdin, not through the limit, which would end in a
						// false EOF; what the decoder buffered past the assignment is ignored.
						_, err := io.Copy(io.Discard, os.Stdin)
						if err == nil {
							err = errStdinClosed
						}
						stop(err)
					}()
				}
				api, err := sartiq.New(apiURL, token)
				if err != nil {
					return err
				}
				out, err := worker.Run(ctx, cfg, api, a)
				if err != nil {
					return err
				}
				switch out.Status {
				case "completed", "failed", "released", "unreported":
					return nil
				}
				return fmt.Errorf("%w: %s %s", errNotFinished, out.Status, out.Reason)
			}
		},
	}
}
