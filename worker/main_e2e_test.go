package worker_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"hermeshost/internal/hosttest"
	"hermeshost/pg/pgtest"
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hermes-worker-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	if err := hosttest.BuildBinaries(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	engineErr = openEngine(context.Background())
	code := pgtest.Run(m)
	if err := closeEngine(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.RemoveAll(binDir)
	os.Exit(code)
}
