// Package sartiqcli is the `sartiq` command: the CLI an agent shell-calls to use the
// Sartiq API. It has no generated client to keep in sync: `sartiq ops` lists operations
// from the live /openapi.json and `sartiq call` builds each request from it.
//
// Its credential comes from the environment, never the command line: with
// SARTIQ_PROXY_SOCKET it talks to the worker's local proxy, which adds the job token
// itself; otherwise to SARTIQ_API_URL with SARTIQ_TOKEN (operators, tests). The token is
// never printed.
package sartiqcli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"hermeshost/cli"
	"hermeshost/config"
	"hermeshost/sartiq"
)

var env = []config.Var{config.SartiqProxySocket, config.SartiqAPIURL, config.SartiqToken}

// Command is the `sartiq` command group. It writes results to stdout.
func Command(stdout io.Writer) *cli.Command {
	return &cli.Command{
		Name:    "sartiq",
		Summary: "call the Sartiq API, operation by operation, from its live OpenAPI document",
		Subcommands: []*cli.Command{
			{
				Name: "ops", Summary: "list the operations whose operationId, path or summary contains SUBSTRING",
				Args: "[SUBSTRING]", Env: env,
				Setup: func(*flag.FlagSet) func(context.Context, []string) error {
					return func(ctx context.Context, args []string) error {
						if len(args) > 1 {
							return cli.Usagef("give at most one substring")
						}
						return runOps(ctx, stdout, strings.Join(args, ""))
					}
				},
			},
			{
				Name: "call", Summary: "call one operation and print its JSON answer",
				Args: "<operationId> [--path name=value]... [--query name=value]... [--json '<body>']", Env: env,
				Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
					a := &CallArgs{}
					defineCallFlags(fs, a)
					return func(ctx context.Context, args []string) error {
						rest := flag.NewFlagSet("call", flag.ContinueOnError)
						rest.SetOutput(io.Discard)
						defineCallFlags(rest, a)
						if err := a.parse(rest, args); err != nil {
							return err
						}
						return runCall(ctx, stdout, a)
					}
				},
			},
		},
	}
}

// session is a client and the token it presents (to scrub from anything printed).
type session struct {
	client *sartiq.Client
	token  string
}

func connect() (*session, error) {
	e := config.FromOS()
	if sock := e.String(config.SartiqProxySocket); sock != "" {
		c, err := sartiq.NewUnix(sock)
		return &session{client: c}, err
	}
	base := e.URL(config.SartiqAPIURL)
	token := e.String(config.SartiqToken)
	if err := e.Err(); err != nil {
		return nil, err
	}
	if base == "" {
		return nil, fmt.Errorf("set SARTIQ_PROXY_SOCKET (inside a job) or SARTIQ_API_URL and SARTIQ_TOKEN")
	}
	c, err := sartiq.New(base, token)
	return &session{client: c, token: token}, err
}

// scrub keeps the session's token out of s, whatever a server echoed.
func (s *session) scrub(text string) string {
	if s.token == "" {
		return text
	}
	return strings.ReplaceAll(text, s.token, "[redacted]")
}

func (s *session) operations(ctx context.Context) (map[string]operation, error) {
	raw, err := s.client.Document(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the API's operations from %s/openapi.json: %s", s.client.BaseURL(), s.scrub(err.Error()))
	}
	return loadOperations(ctx, raw)
}

func runOps(ctx context.Context, stdout io.Writer, sub string) error {
	s, err := connect()
	if err != nil {
		return err
	}
	ops, err := s.operations(ctx)
	if err != nil {
		return err
	}
	matches := sortedMatching(ops, sub)
	if len(matches) == 0 {
		return fmt.Errorf("no operation matches %q", sub)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	for _, o := range matches {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", o.id, o.method, o.path, o.summary)
	}
	return tw.Flush()
}

func runCall(ctx context.Context, stdout io.Writer, a *CallArgs) error {
	s, err := connect()
	if err != nil {
		return err
	}
	ops, err := s.operations(ctx)
	if err != nil {
		return err
	}
	op, ok := ops[a.Op]
	if !ok {
		return cli.Usagef("unknown operationId %q (list them with: sartiq ops)", a.Op)
	}
	path, query, body, err := op.build(a)
	if err != nil {
		return err
	}
	out, err := s.client.Call(ctx, op.id, op.method, path, query, body)
	if err != nil {
		var ae *sartiq.APIError
		if errors.As(err, &ae) {
			return errors.New(s.scrub(ae.Error()))
		}
		return errors.New(s.scrub(err.Error()))
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, out, "", "  ") == nil {
		out = pretty.Bytes()
	}
	_, err = fmt.Fprintln(stdout, s.scrub(strings.TrimRight(string(out), "\n")))
	return err
}
