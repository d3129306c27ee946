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
	"hermeshost/subagent"
)

// withSubagents opens the host database for a subagent subcommand.
func withSubagents(ctx context.Context, act func(s *subagent.Store) error) error {
	pool, log, err := openHostDB(ctx, "subagent")
	if err != nil {
		return err
	}
	defer pool.Close()
	s := subagent.New(pool, subagent.Options{Log: log})
	defer s.Close()
	return act(s)
}

// orgFlag is the --org every subagent subcommand needs: handles are per org.
func orgFlag(fs *flag.FlagSet) *string {
	return fs.String("org", "", "required: the organization whose subagents these are")
}

func needOrg(org string) error {
	if org == "" {
		return cli.Usagef("--org is required: subagents belong to one organization")
	}
	return nil
}

func subagentCommand() *cli.Command {
	env := []config.Var{config.DatabaseURL, config.LogLevel, config.LogFormat}
	return &cli.Command{
		Name:    "subagent",
		Summary: "list an org's subagents, show one with its mailbox, message or cancel a running one",
		Subcommands: []*cli.Command{
			{
				Name: "list", Summary: "list an org's subagents, newest first", Args: "--org ORG", Env: env,
				Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
					org := orgFlag(fs)
					status := fs.String("status", "", "only this status: live, running, cancelling, done, failed or cancelled")
					job := fs.String("job", "", "only the children of this job")
					limit := fs.Int("limit", 50, fmt.Sprintf("at most this many (1 to %d)", subagent.MaxListLimit))
					return func(ctx context.Context, args []string) error {
						if len(args) > 0 {
							return cli.Usagef("unexpected arguments (use --status, --job)")
						}
						if err := needOrg(*org); err != nil {
							return err
						}
						return withSubagents(ctx, func(s *subagent.Store) error {
							hs, err := s.List(ctx, *org, subagent.ListParams{Status: *status, JobID: *job, Limit: *limit})
							if err != nil {
								return err
							}
							tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
							fmt.Fprintln(tw, "ID\tSTATUS\tJOB\tSESSION\tPARENT\tPENDING\tSTARTED\tGOAL")
							for _, h := range hs {
								fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", h.ID, h.Status, orDash(h.JobID), orDash(h.Session),
									orDash(parentOf(h)), h.Pending, stamp(h.StartedAt), oneLine(h.Goal, 60))
							}
							return tw.Flush()
						})
					}
				},
			},
			{
				Name: "show", Summary: "show one subagent and its mailbox", Args: "--org ORG ID", Env: env,
				Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
					org := orgFlag(fs)
					limit := fs.Int("messages", 20, "how many of the newest messages to show")
					return func(ctx context.Context, args []string) error {
						if len(args) != 1 {
							return cli.Usagef("want exactly one subagent ID")
						}
						if err := needOrg(*org); err != nil {
							return err
						}
						return withSubagents(ctx, func(s *subagent.Store) error {
							h, err := s.Get(ctx, *org, args[0])
							if err != nil {
								return err
							}
							fmt.Printf("id:       %s\norg:      %s\nstatus:   %s\njob:      %s\nsession:  %s\nparent:   %s\nrole:     %s\nstarted:  %s\n",
								h.ID, h.Org, h.Status, orDash(h.JobID), orDash(h.Session), orDash(parentOf(h)),
								orDash(h.Role), stamp(h.StartedAt))
							if h.EndedAt != nil {
								fmt.Printf("ended:    %s\n", stamp(*h.EndedAt))
							}
							if h.CancelledBy != "" {
								fmt.Printf("cancel:   by %s%s\n", h.CancelledBy, prefixed(": ", h.CancelReason))
							}
							fmt.Printf("goal:     %s\n", oneLine(h.Goal, 500))
							if h.Summary != "" {
								fmt.Printf("summary:  %s\n", oneLine(h.Summary, 500))
							}
							ms, err := s.Messages(ctx, *org, h.ID, *limit)
							if err != nil {
								return err
							}
							fmt.Println()
							tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
							fmt.Fprintln(tw, "MESSAGE\tSENT\tFROM\tSTATE\tBODY")
							for _, m := range ms {
								st := "queued"
								switch {
								case m.AckedAt != nil:
									st = "acked"
								case m.Deliveries > 0:
									st = fmt.Sprintf("delivered x%d", m.Deliveries)
								}
								fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", m.ID, stamp(m.SentAt), m.Sender, st, oneLine(m.Body, 80))
							}
							return tw.Flush()
						})
					}
				},
			},
			{
				Name: "send", Summary: "queue a message in a running subagent's mailbox", Args: "--org ORG ID TEXT...", Env: env,
				Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
					org := orgFlag(fs)
					actor := fs.String("as", operatorName(), "who sends it, shown to the subagent")
					return func(ctx context.Context, args []string) error {
						if len(args) < 2 {
							return cli.Usagef("want a subagent ID and the message text")
						}
						if err := needOrg(*org); err != nil {
							return err
						}
						return withSubagents(ctx, func(s *subagent.Store) error {
							m, err := s.Send(ctx, *org, args[0], "operator:"+*actor, strings.Join(args[1:], " "))
							if err != nil {
								return err
							}
							fmt.Printf("queued message %d for %s; it is redelivered until the subagent acknowledges it\n", m.ID, args[0])
							return nil
						})
					}
				},
			},
			{
				Name: "cancel", Summary: "ask a running subagent to stop", Args: "--org ORG ID", Env: env,
				Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
					org := orgFlag(fs)
					actor := fs.String("as", operatorName(), "who cancels it, recorded with the handle")
					reason := fs.String("reason", "", "why, shown to the subagent")
					return func(ctx context.Context, args []string) error {
						if len(args) != 1 {
							return cli.Usagef("want exactly one subagent ID")
						}
						if err := needOrg(*org); err != nil {
							return err
						}
						return withSubagents(ctx, func(s *subagent.Store) error {
							h, err := s.Cancel(ctx, *org, args[0], "operator:"+*actor, *reason)
							if err != nil {
								return err
							}
							fmt.Printf("%s is %s; it stops at its next mailbox check\n", h.ID, h.Status)
							return nil
						})
					}
				},
			},
		},
	}
}

// oneLine is s on one line, cut to at most n characters.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// parentOf names a child's parents: the session that started it and the subagent, if any.
func parentOf(h subagent.Handle) string {
	var ps []string
	for _, p := range []string{h.ParentSession, h.ParentSubagent} {
		if p != "" {
			ps = append(ps, p)
		}
	}
	return strings.Join(ps, " / ")
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}
