package procsweep

import (
	"errors"
	"testing"
	"time"
)

// On the host, as root or not, a sweep refuses before it signals anything: kill(-1) here
// would take every process of the user (of every user, as root). That it kills what it
// must inside a unit is tested on the Docker runtime (dispatch/runtime, dispatch).
func TestSweepRefusesOutsideAUnit(t *testing.T) {
	for _, keeper := range []string{"hermes-host worker idle", ""} {
		if _, err := Sweep(time.Second, keeper); !errors.Is(err, ErrNotInUnit) {
			t.Fatalf("Sweep(%q) on the host: %v, want ErrNotInUnit", keeper, err)
		}
	}
}

// A dashboard's sweep refuses on the host too: pid 1 there is the host's init, not an init
// of this process.
func TestSweepAsMainRefusesOutsideAUnit(t *testing.T) {
	if _, err := SweepAsMain(time.Second); !errors.Is(err, ErrNotInUnit) {
		t.Fatalf("SweepAsMain on the host: %v, want ErrNotInUnit", err)
	}
	if err := CheckMain(); !errors.Is(err, ErrNotInUnit) {
		t.Fatalf("CheckMain on the host: %v, want ErrNotInUnit", err)
	}
}
