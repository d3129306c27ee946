package worker_test

import (
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
	code := pgtest.Run(m)
	os.RemoveAll(binDir)
	os.Exit(code)
}
