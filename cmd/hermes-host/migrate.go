package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"hermeshost/cli"
	"hermeshost/config"
	"hermeshost/migrations"
	"hermeshost/sartiq/backend"
)

// migrationSets are the schemas `migrate` can act on, by name.
var migrationSets = map[string]migrations.Set{
	migrations.Host.Name:    migrations.Host,
	backend.Migrations.Name: backend.Migrations,
}

func setNames() string {
	var names []string
	for n := range migrationSets {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func migrateCommand() *cli.Command {
	env := []config.Var{config.DatabaseURL, config.LogLevel, config.LogFormat}
	sub := func(name, summary string, act func(ctx context.Context, r *migrations.Runner) error) *cli.Command {
		return &cli.Command{
			Name: name, Summary: summary, Env: env,
			Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
				set := fs.String("set", migrations.Host.Name, "which migration set: "+setNames())
				return func(ctx context.Context, args []string) error {
					if len(args) > 0 {
						return cli.Usagef("unexpected arguments: %s", strings.Join(args, " "))
					}
					s, ok := migrationSets[*set]
					if !ok {
						return cli.Usagef("unknown migration set %q (known: %s)", *set, setNames())
					}
					var url string
					log, err := startup("migrate", func(e *config.Env) { url = e.Required(config.DatabaseURL) })
					if err != nil {
						return err
					}
					r, err := s.Open(ctx, url, log)
					if err != nil {
						return err
					}
					defer r.Close()
					return act(ctx, r)
				}
			},
		}
	}
	return &cli.Command{
		Name:    "migrate",
		Summary: "apply, roll back or list the database migrations",
		Subcommands: []*cli.Command{
			sub("up", "apply every pending migration", func(ctx context.Context, r *migrations.Runner) error {
				res, err := r.Up(ctx)
				for _, m := range res {
					fmt.Printf("applied %s (%s)\n", m.Source.Path, m.Duration.Round(time.Millisecond))
				}
				if err == nil && len(res) == 0 {
					fmt.Printf("schema %s is up to date\n", r.Schema())
				}
				return err
			}),
			sub("down", "roll back the newest applied migration", func(ctx context.Context, r *migrations.Runner) error {
				res, err := r.Down(ctx)
				if err != nil {
					return err
				}
				fmt.Printf("rolled back %s\n", res.Source.Path)
				return nil
			}),
			sub("status", "list each migration and whether it is applied", func(ctx context.Context, r *migrations.Runner) error {
				st, err := r.Status(ctx)
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintf(tw, "VERSION\tSTATE\tAPPLIED AT\tFILE\n")
				for _, m := range st {
					at := "-"
					if !m.AppliedAt.IsZero() {
						at = m.AppliedAt.UTC().Format(time.RFC3339)
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", m.Source.Version, m.State, at, m.Source.Path)
				}
				return tw.Flush()
			}),
		},
	}
}
