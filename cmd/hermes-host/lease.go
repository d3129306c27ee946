package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/user"
	"text/tabwriter"
	"time"

	"hermeshost/cli"
	"hermeshost/config"
	"hermeshost/lease"
)

// withLeases opens the host database for a lease subcommand.
func withLeases(ctx context.Context, act func(s *lease.Store) error) error {
	pool, log, err := openHostDB(ctx, "lease")
	if err != nil {
		return err
	}
	defer pool.Close()
	s := lease.New(pool, lease.Options{Log: log})
	defer s.Close()
	return act(s)
}

func leaseCommand() *cli.Command {
	env := []config.Var{config.DatabaseURL, config.LogLevel, config.LogFormat}
	return &cli.Command{
		Name:    "lease",
		Summary: "inspect turn leases and release a stuck one by force",
		Subcommands: []*cli.Command{
			{
				Name: "list", Summary: "list leases: holder, epoch, acquired, expires", Env: env,
				Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
					prefix := fs.String("prefix", "", "only keys starting with this, e.g. home: or session:abc")
					return func(ctx context.Context, args []string) error {
						if len(args) > 0 {
							return cli.Usagef("unexpected arguments (use --prefix)")
						}
						return withLeases(ctx, func(s *lease.Store) error {
							infos, err := s.List(ctx, *prefix)
							if err != nil {
								return err
							}
							now := time.Now()
							tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
							fmt.Fprintln(tw, "KEY\tHOLDER\tEPOCH\tSTATE\tACQUIRED\tEXPIRES")
							for _, i := range infos {
								fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", i.Key, orDash(i.Holder), i.Epoch, state(i, now), stamp(i.AcquiredAt), stamp(i.ExpiresAt))
							}
							return tw.Flush()
						})
					}
				},
			},
			{
				Name: "show", Summary: "show one lease and its recent events", Args: "KEY", Env: env,
				Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
					limit := fs.Int("events", 20, "how many recent events to show")
					return func(ctx context.Context, args []string) error {
						if len(args) != 1 {
							return cli.Usagef("want exactly one KEY, e.g. home:acme")
						}
						return withLeases(ctx, func(s *lease.Store) error {
							i, err := s.Holder(ctx, args[0])
							if err != nil {
								return err
							}
							fmt.Printf("key:      %s\nholder:   %s\nepoch:    %d\nstate:    %s\nacquired: %s\nexpires:  %s\n\n",
								i.Key, orDash(i.Holder), i.Epoch, state(i, time.Now()), stamp(i.AcquiredAt), stamp(i.ExpiresAt))
							evs, err := s.Events(ctx, args[0], *limit)
							if err != nil {
								return err
							}
							tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
							fmt.Fprintln(tw, "AT\tEVENT\tHOLDER\tEPOCH\tDETAIL")
							for _, e := range evs {
								detail := ""
								switch {
								case e.PreviousHolder != "":
									detail = "taken from " + e.PreviousHolder
								case e.Actor != "":
									detail = "by " + e.Actor
									if e.Reason != "" {
										detail += ": " + e.Reason
									}
								}
								fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", stamp(e.At), e.Kind, e.Holder, e.Epoch, detail)
							}
							return tw.Flush()
						})
					}
				},
			},
			{
				Name: "release", Summary: "release a lease by force; the epoch moves on so the old holder is refused", Args: "--force KEY", Env: env,
				Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
					force := fs.Bool("force", false, "required: release whoever holds it")
					reason := fs.String("reason", "", "why, recorded with the event")
					actor := fs.String("as", operatorName(), "who is forcing it, recorded with the event")
					return func(ctx context.Context, args []string) error {
						if !*force {
							return cli.Usagef("refusing without --force: the holder may still be working")
						}
						if len(args) != 1 {
							return cli.Usagef("want exactly one KEY, e.g. session:abc")
						}
						return withLeases(ctx, func(s *lease.Store) error {
							old, err := s.ForceRelease(ctx, args[0], *actor, *reason)
							if err != nil {
								return err
							}
							fmt.Printf("released %s held by %s (epoch %d); its refreshes and fenced writes are now refused\n", old.Key, old.Holder, old.Epoch)
							return nil
						})
					}
				},
			},
		},
	}
}

func operatorName() string {
	name := "operator"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil {
		name += "@" + h
	}
	return name
}

func state(i lease.Info, now time.Time) string {
	switch {
	case i.Holder == "":
		return "free"
	case i.Held(now):
		return "held"
	default:
		return "expired"
	}
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
