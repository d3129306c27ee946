package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"hermeshost/cli"
	"hermeshost/config"
	"hermeshost/gateway"
	"hermeshost/service"
)

// demoUpstream is the --upstream value that runs the built-in deterministic upstream.
const demoUpstream = "demo"

// gatewaySettings is everything `gateway` and `dev` read to run the gateway.
type gatewaySettings struct {
	addr, upstream, authFile string
	secret, hostKey, apiKey  service.Secret
	oauth                    gateway.OAuthConfig
	rps, concurrency         int
	maxBody                  int64
	grace                    time.Duration
}

// readGateway reads the gateway's variables; flags given on the command line win.
func readGateway(e *config.Env, s *gatewaySettings) {
	// gateway.New checks the upstream URL, whether it came from the flag or the variable.
	if s.upstream == "" {
		s.upstream = e.String(config.GatewayUpstream)
	}
	if s.authFile == "" {
		s.authFile = e.String(config.GatewayAuthFile)
	}
	s.secret = service.Secret(e.String(config.GatewaySecret))
	s.hostKey = service.Secret(e.String(config.GatewayKey))
	s.apiKey = service.Secret(e.String(config.GatewayUpstreamAPIKey))
	s.oauth = gateway.OAuthConfig{
		TokenURL: e.URL(config.GatewayOAuthTokenURL),
		ClientID: e.String(config.GatewayOAuthClientID),
	}
	s.rps = e.Int(config.GatewayOrgRPS)
	s.concurrency = e.Int(config.GatewayOrgConcurrency)
	s.maxBody = int64(e.Int(config.GatewayMaxRequestBytes))
	s.grace = grace(e)
}

// runGateway serves the gateway (and the demo upstream, if chosen) until ctx ends.
// ready, if set, is told the gateway's URL once it listens.
func runGateway(ctx context.Context, log *slog.Logger, s gatewaySettings, ready func(url string)) error {
	ops := service.NewOps(log.With("server", "gateway"))
	g, gctx := errgroup.WithContext(ctx)
	cfg := gateway.Config{
		UpstreamURL: s.upstream, Secret: s.secret, HostKey: s.hostKey,
		OrgRPS: float64(s.rps), OrgBurst: 2 * s.rps, OrgConcurrency: s.concurrency,
		MaxRequestBytes: s.maxBody, Ops: ops,
	}
	switch {
	case s.upstream == demoUpstream:
		demo, err := service.Listen("gateway-demo-upstream", "127.0.0.1:0", gateway.Demo(), log, s.grace)
		if err != nil {
			return err
		}
		g.Go(func() error { return demo.Serve(gctx) })
		cfg.UpstreamURL = demo.URL() + "/v1"
		log.Warn("the gateway forwards to the built-in demo upstream: answers are deterministic stand-ins, not a model's")
	case s.apiKey != "":
		cfg.APIKey = s.apiKey
	default:
		if s.oauth.TokenURL == "" {
			return &config.Error{Var: config.GatewayOAuthTokenURL.Name,
				Msg: "is required to refresh the OAuth login (or set GATEWAY_UPSTREAM_API_KEY, or use --upstream demo)"}
		}
		login, err := gateway.OpenLogin(gateway.LoginOptions{
			Path: s.authFile, OAuth: s.oauth, Log: ops.Log, Health: ops.Health, Registry: ops.Registry,
		})
		if err != nil {
			return fmt.Errorf("%w (run hermes-host gateway login, or restore a receipt)", err)
		}
		defer login.Close()
		cfg.Login = login
	}
	srv, err := gateway.New(cfg)
	if err != nil {
		return err
	}
	listener, err := service.Listen("gateway", s.addr, srv.Handler(), log, s.grace)
	if err != nil {
		return err
	}
	if ready != nil {
		ready(listener.URL())
	}
	g.Go(func() error { return listener.Serve(gctx) })
	return g.Wait()
}

func gatewayEnv() []config.Var {
	return append([]config.Var{
		config.GatewaySecret, config.GatewayKey, config.GatewayUpstream, config.GatewayAuthFile,
		config.GatewayUpstreamAPIKey, config.GatewayOAuthTokenURL, config.GatewayOAuthClientID,
		config.GatewayOrgRPS, config.GatewayOrgConcurrency, config.GatewayMaxRequestBytes,
	}, serverEnv...)
}

func gatewayCommand() *cli.Command {
	return &cli.Command{
		Name:    "gateway",
		Summary: "serve the OpenAI-compatible model gateway in front of the one upstream login",
		Env:     gatewayEnv(),
		Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
			var s gatewaySettings
			fs.StringVar(&s.addr, "addr", "127.0.0.1:8091", "listen address (port 0 picks one)")
			fs.StringVar(&s.upstream, "upstream", "", "the OpenAI-compatible base URL to forward to, or demo (default $GATEWAY_UPSTREAM)")
			fs.StringVar(&s.authFile, "auth-file", "", "the OAuth login file (default $GATEWAY_AUTH_FILE)")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("unexpected arguments %q (gateway login is the only subcommand)", args)
				}
				log, err := startup("gateway", func(e *config.Env) {
					e.Required(config.GatewaySecret)
					readGateway(e, &s)
				})
				if err != nil {
					return err
				}
				return runGateway(ctx, log, s, func(url string) {
					log.Info("hermes-host gateway is up", "gateway_url", url, "upstream", s.upstream)
				})
			}
		},
		Subcommands: []*cli.Command{gatewayLoginCommand()},
	}
}

func gatewayLoginCommand() *cli.Command {
	return &cli.Command{
		Name:    "login",
		Summary: "log the gateway in once: device code, or a refresh token read from stdin",
		Env: []config.Var{config.GatewayAuthFile, config.GatewayOAuthTokenURL, config.GatewayOAuthDeviceURL,
			config.GatewayOAuthClientID, config.GatewayOAuthScope, config.LogLevel, config.LogFormat},
		Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
			authFile := fs.String("auth-file", "", "where to write the login (default $GATEWAY_AUTH_FILE)")
			fromStdin := fs.Bool("refresh-token-stdin", false, "read a refresh token from stdin instead of the device-code flow (never pass it as an argument)")
			replace := fs.Bool("replace", false, "replace an existing login of another identity, or an unreadable auth.json (a receipt keeps the old one)")
			return func(ctx context.Context, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("login takes no arguments; pipe a refresh token to --refresh-token-stdin")
				}
				var oauth gateway.OAuthConfig
				_, err := startup("gateway-login", func(e *config.Env) {
					if *authFile == "" {
						*authFile = e.String(config.GatewayAuthFile)
					}
					oauth = gateway.OAuthConfig{
						TokenURL:  e.Required(config.GatewayOAuthTokenURL),
						DeviceURL: e.URL(config.GatewayOAuthDeviceURL),
						ClientID:  e.String(config.GatewayOAuthClientID),
						Scope:     e.String(config.GatewayOAuthScope),
					}
					if !*fromStdin && oauth.DeviceURL == "" && e.Err() == nil {
						e.Required(config.GatewayOAuthDeviceURL)
					}
				})
				if err != nil {
					return err
				}
				var creds gateway.Credentials
				if *fromStdin {
					token, rerr := readSecretLine(os.Stdin, "refresh token")
					token = strings.TrimSpace(token)
					if rerr != nil {
						return rerr
					}
					creds, err = oauth.ExchangeRefreshToken(ctx, token)
				} else {
					creds, err = oauth.DeviceLogin(ctx, func(dc gateway.DeviceCode) {
						where := dc.VerificationURI
						if dc.VerificationURIComplete != "" {
							where = dc.VerificationURIComplete
						}
						fmt.Printf("To log the gateway in, open %s and enter the code %s (valid %s).\n", where, dc.UserCode, dc.ExpiresIn)
					})
				}
				if err != nil {
					return err
				}
				if err := gateway.SaveLogin(*authFile, creds, *replace); err != nil {
					return err
				}
				fmt.Printf("logged in as %s; wrote %s\n", creds.Identity, *authFile)
				return nil
			}
		},
	}
}

// readSecretLine reads one line from r, without its line ending: a secret (what it is)
// piped in, never typed into argv where ps and shell history would keep it.
func readSecretLine(r io.Reader, what string) (string, error) {
	line, err := bufio.NewReader(io.LimitReader(r, 64<<10)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read the %s from stdin: %w", what, err)
	}
	line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
	if strings.TrimSpace(line) == "" {
		return "", fmt.Errorf("no %s on stdin", what)
	}
	return line, nil
}

// randomSecret is a fresh secret for `dev`, which runs every process of the product in
// one and so needs no shared one.
func randomSecret() service.Secret { return service.Secret(rand.Text()) }
