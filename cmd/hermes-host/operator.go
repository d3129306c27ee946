package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"hermeshost/cli"
	"hermeshost/config"
	"hermeshost/operator"
)

// withOperators opens the host database for an operator subcommand.
func withOperators(ctx context.Context, act func(s *operator.Store) error) error {
	pool, _, err := openHostDB(ctx, "operator")
	if err != nil {
		return err
	}
	defer pool.Close()
	s, err := operator.New(pool, 0)
	if err != nil {
		return err
	}
	return act(s)
}

func operatorCommand() *cli.Command {
	env := []config.Var{config.DatabaseURL, config.LogLevel, config.LogFormat}
	actorFlag := func(fs *flag.FlagSet) *string {
		return fs.String("as", operatorName(), "who makes the change, recorded with it")
	}
	return &cli.Command{
		Name:    "operator",
		Summary: "operator accounts and their per-org grants (who may open which org's dashboard)",
		Subcommands: []*cli.Command{
			passwordCommand("add", "add an operator; the password comes from stdin, or one is made and printed once",
				"added operator %[1]s; grant orgs with: hermes-host operator grant %[1]s ORG...\n", (*operator.Store).Add, env, actorFlag),
			passwordCommand("passwd", "set an operator's password: from stdin, or a new one printed once",
				"password of %s changed\n", (*operator.Store).SetPassword, env, actorFlag),
			{
				Name: "list", Summary: "list operators and their grants", Env: env,
				Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
					return func(ctx context.Context, args []string) error {
						if len(args) > 0 {
							return cli.Usagef("list takes no arguments")
						}
						return withOperators(ctx, func(s *operator.Store) error {
							ops, err := s.List(ctx)
							if err != nil {
								return err
							}
							tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
							fmt.Fprintln(tw, "NAME\tSTATE\tCREATED\tPASSWORD SET\tORGS")
							for _, o := range ops {
								state := "enabled"
								if o.Disabled {
									state = "disabled"
								}
								fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", o.Name, state, stamp(o.CreatedAt), stamp(o.PasswordAt), orDash(strings.Join(o.Orgs, ",")))
							}
							return tw.Flush()
						})
					}
				},
			},
			{
				Name: "show", Summary: "show one operator, their grants and recent history", Args: "NAME", Env: env,
				Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
					limit := fs.Int("events", 20, "how many recent events to show")
					return func(ctx context.Context, args []string) error {
						if len(args) != 1 {
							return cli.Usagef("want exactly one operator NAME")
						}
						return withOperators(ctx, func(s *operator.Store) error {
							o, err := s.Get(ctx, args[0])
							if err != nil {
								return err
							}
							state := "enabled"
							if o.Disabled {
								state = "disabled"
							}
							fmt.Printf("name:     %s\nstate:    %s\ncreated:  %s\npassword: set %s\norgs:     %s\n\n",
								o.Name, state, stamp(o.CreatedAt), stamp(o.PasswordAt), orDash(strings.Join(o.Orgs, ", ")))
							evs, err := s.Events(ctx, o.Name, *limit)
							if err != nil {
								return err
							}
							tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
							fmt.Fprintln(tw, "AT\tEVENT\tORG\tBY")
							for _, e := range evs {
								fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", stamp(e.At), e.Kind, orDash(e.Org), e.Actor)
							}
							return tw.Flush()
						})
					}
				},
			},
			grantCommand("grant", "let an operator open these orgs' dashboards", "%s may open %s\n", (*operator.Store).Grant, env, actorFlag),
			grantCommand("revoke", "take orgs away from an operator", "%s may no longer open %s\n", (*operator.Store).Revoke, env, actorFlag),
			toggleCommand("disable", "stop an operator's logins and access; the account and grants are kept", true, env, actorFlag),
			toggleCommand("enable", "let a disabled operator log in again", false, env, actorFlag),
			{
				Name: "remove", Summary: "delete an operator and their grants; their history stays", Args: "NAME", Env: env,
				Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
					actor := actorFlag(fs)
					return func(ctx context.Context, args []string) error {
						if len(args) != 1 {
							return cli.Usagef("want exactly one operator NAME")
						}
						return withOperators(ctx, func(s *operator.Store) error {
							if err := s.Remove(ctx, args[0], *actor); err != nil {
								return err
							}
							fmt.Printf("removed operator %s\n", args[0])
							return nil
						})
					}
				},
			},
		},
	}
}

func toggleCommand(name, summary string, disabled bool, env []config.Var, actorFlag func(*flag.FlagSet) *string) *cli.Command {
	return &cli.Command{
		Name: name, Summary: summary, Args: "NAME", Env: env,
		Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
			actor := actorFlag(fs)
			return func(ctx context.Context, args []string) error {
				if len(args) != 1 {
					return cli.Usagef("want exactly one operator NAME")
				}
				return withOperators(ctx, func(s *operator.Store) error {
					if err := s.SetDisabled(ctx, args[0], disabled, *actor); err != nil {
						return err
					}
					fmt.Printf("%s is %sd\n", args[0], name)
					return nil
				})
			}
		},
	}
}

// grantCommand is grant or revoke: change applied to NAME for each ORG, then done said.
func grantCommand(name, summary, done string, change func(*operator.Store, context.Context, string, string, string) error,
	env []config.Var, actorFlag func(*flag.FlagSet) *string) *cli.Command {
	return &cli.Command{
		Name: name, Summary: summary, Args: "NAME ORG...", Env: env,
		Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
			actor := actorFlag(fs)
			return func(ctx context.Context, args []string) error {
				if len(args) < 2 {
					return cli.Usagef("want an operator NAME and at least one ORG")
				}
				return withOperators(ctx, func(s *operator.Store) error {
					for _, org := range args[1:] {
						if err := change(s, ctx, args[0], org, *actor); err != nil {
							return err
						}
					}
					fmt.Printf(done, args[0], strings.Join(args[1:], ", "))
					return nil
				})
			}
		},
	}
}

// passwordCommand is add or passwd: apply NAME with a password from stdin
// (--password-stdin) or one made and shown once, then done said.
func passwordCommand(name, summary, done string, apply func(*operator.Store, context.Context, string, string, string) error,
	env []config.Var, actorFlag func(*flag.FlagSet) *string) *cli.Command {
	return &cli.Command{
		Name: name, Summary: summary, Args: "NAME", Env: env,
		Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
			fromStdin := fs.Bool("password-stdin", false, "read the password from stdin (never pass it as an argument)")
			actor := actorFlag(fs)
			return func(ctx context.Context, args []string) error {
				if len(args) != 1 {
					return cli.Usagef("want exactly one operator NAME")
				}
				pw, generated := operator.GeneratePassword(), true
				if *fromStdin {
					var err error
					if pw, err = readSecretLine(os.Stdin, "password"); err != nil {
						return err
					}
					generated = false
				}
				return withOperators(ctx, func(s *operator.Store) error {
					if err := apply(s, ctx, args[0], pw, *actor); err != nil {
						return err
					}
					fmt.Printf(done, args[0])
					if generated {
						fmt.Printf("password (shown once): %s\n", pw)
					}
					return nil
				})
			}
		},
	}
}
