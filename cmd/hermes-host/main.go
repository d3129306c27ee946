// Command hermes-host runs the Hermes Agent Host: every process of the product is one of
// its subcommands.
package main

import (
	"context"
	"os"

	"hermeshost/cli"
	"hermeshost/service"
)

func root() *cli.Command {
	return &cli.Command{
		Name:    "hermes-host",
		Summary: "run Hermes agents for many organizations, safely",
		Subcommands: []*cli.Command{
			devCommand(),
			gatewayCommand(),
			leaseCommand(),
			migrateCommand(),
		},
	}
}

func main() {
	ctx, stop := service.SignalContext(context.Background())
	code := cli.Run(ctx, root(), os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
