package orghome

import (
	"testing"

	"go.uber.org/goleak"
)

// Every StateDB a test opens must be closed; a leaked database/sql opener shows up here.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
