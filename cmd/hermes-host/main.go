// Command hermes-host runs the Hermes Agent Host: every process of the product is one of
// its subcommands. Run under the name `sartiq` (a link or copy), it is the sartiq CLI.
package main

import (
	"context"
	"os"
	"path/filepath"

	"hermeshost/cli"
	"hermeshost/sartiq/sartiqcli"
	"hermeshost/service"
)

func root() *cli.Command {
	return &cli.Command{
		Name:    "hermes-host",
		Summary: "run Hermes agents for many organizations, safely",
		Subcommands: []*cli.Command{
			devCommand(),
			backendCommand(),
			dashboardCommand(),
			dispatcherCommand(),
			gatewayCommand(),
			imagesCommand(),
			launcherCommand(),
			leaseCommand(),
			migrateCommand(),
			operatorCommand(),
			sartiqcli.Command(os.Stdout),
			subagentCommand(),
			workerCommand(),
		},
	}
}

func main() {
	ctx, stop := service.SignalContext(context.Background())
	cmd := root()
	if filepath.Base(os.Args[0]) == "sartiq" {
		cmd = sartiqcli.Command(os.Stdout)
	}
	code := cli.Run(ctx, cmd, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
