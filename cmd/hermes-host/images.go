package main

import (
	"context"
	"flag"
	"fmt"

	"hermeshost/cli"
	"hermeshost/config"
	"hermeshost/dispatch/runtime"
)

func imagesCommand() *cli.Command {
	return &cli.Command{
		Name:    "images",
		Summary: "build the worker and dashboard images FROM scratch (no registry needed)",
		Subcommands: []*cli.Command{{
			Name:    "build",
			Summary: "build both images on the local Docker engine from static binaries",
			Args:    "BINARY...",
			Env:     []config.Var{config.WorkerImage, config.DashboardImage, config.LogLevel, config.LogFormat},
			Setup: func(fs *flag.FlagSet) func(context.Context, []string) error {
				return func(ctx context.Context, binaries []string) error {
					if len(binaries) == 0 {
						return cli.Usagef("name the static binaries to put in the images, hermes-host first")
					}
					var worker, dashboard string
					log, err := startup("images", func(e *config.Env) {
						worker = e.String(config.WorkerImage)
						dashboard = e.String(config.DashboardImage)
					})
					if err != nil {
						return err
					}
					if err := runtime.BuildHostImages(ctx, worker, dashboard, binaries); err != nil {
						return err
					}
					log.Info("images built", "worker", worker, "dashboard", dashboard)
					fmt.Printf("built %s and %s\n", worker, dashboard)
					return nil
				}
			},
		}},
	}
}
