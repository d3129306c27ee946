package worker_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"hermeshost/pg/pgtest"
)

func TestMain(m *testing.M) {
	if err := buildBinaries(); err != nil {
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
