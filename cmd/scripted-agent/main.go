// Command scripted-agent stands in for the Hermes CLI (`hermes chat ...`) in tests and local
// runs, where the real agent cannot be installed; see package scriptedagent.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"hermeshost/scriptedagent"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := scriptedagent.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
