package faults

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"
)

// Kind is a kind of fault.
type Kind string

// The faults the suite applies.
const (
	KillWorker     Kind = "kill-worker"      // SIGKILL an org's worker container
	KillDispatcher Kind = "kill-dispatcher"  // SIGKILL a dispatcher process, then start it again
	KillGateway    Kind = "kill-gateway"     // SIGKILL the gateway, then start it again
	KillDashboard  Kind = "kill-dashboard"   // SIGKILL a dashboard in the middle of a chat turn
	RestartDB      Kind = "restart-postgres" // stop Postgres at once (immediate mode), start it again
	FillHome       Kind = "fill-home"        // fill the tmpfs under an org's home, free it later
	FillCreds      Kind = "fill-credentials" // fill the tmpfs under the gateway's credentials, free it later
	StallAgent     Kind = "stall-agent"      // an org's agent stalls past STALE_AFTER, then is killed
	PauseHolder    Kind = "pause-holder"     // SIGSTOP a dispatcher past LEASE_TTL, then SIGCONT
	RestartDocker  Kind = "restart-dockerd"  // stop dockerd, start it again
	ForceRelease   Kind = "force-release"    // an operator force-releases a held home: lease from its dashboard
)

// AllKinds is every fault, each drawn with the same weight.
var AllKinds = []Kind{KillWorker, KillDispatcher, KillGateway, KillDashboard, RestartDB, FillHome, FillCreds, StallAgent, PauseHolder, RestartDocker, ForceRelease}

// Planned is one fault of a schedule: its kind at an offset from the start, and a number
// from which its target is picked among those there are when it is applied.
type Planned struct {
	At     time.Duration
	Kind   Kind
	Target int
}

func (p Planned) String() string {
	return fmt.Sprintf("+%s %s (target draw %d)", p.At.Round(time.Millisecond), p.Kind, p.Target)
}

// Plan draws a schedule from seed: faults for duration, gaps drawn between minGap and
// maxGap, kinds drawn from kinds. Every kind comes at least once when the duration has
// room for them (the first len(kinds) faults are a shuffle of kinds), so a bounded run
// covers them all; the same seed gives the same schedule.
func Plan(seed uint64, duration, minGap, maxGap time.Duration, kinds []Kind) []Planned {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	order := append([]Kind(nil), kinds...)
	r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	var out []Planned
	at := time.Duration(0)
	for i := 0; ; i++ {
		gap := minGap
		if maxGap > minGap {
			gap += time.Duration(r.Int64N(int64(maxGap - minGap)))
		}
		at += gap
		if at > duration {
			return out
		}
		k := order[i%len(order)]
		if i >= len(order) {
			k = kinds[r.IntN(len(kinds))]
		}
		out = append(out, Planned{At: at, Kind: k, Target: r.IntN(1 << 20)})
	}
}

// Applied is a fault as it was applied: when, what, to whom.
type Applied struct {
	At     time.Time
	Kind   Kind
	Target string
	Note   string
}

func (a *Applied) String() string {
	s := fmt.Sprintf("%s of %s at %s", a.Kind, a.Target, a.At.UTC().Format("15:04:05.000"))
	if a.Note != "" {
		s += " (" + a.Note + ")"
	}
	return s
}

// Attribute sets each violation's After to the last fault applied before it.
func Attribute(vs []Violation, applied []Applied) {
	sorted := append([]Applied(nil), applied...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].At.Before(sorted[j].At) })
	for i := range vs {
		if vs[i].At.IsZero() {
			continue
		}
		for j := range sorted {
			if sorted[j].At.After(vs[i].At) {
				break
			}
			vs[i].After = &sorted[j]
		}
	}
}

// Report is the violations, one a line, for a test failure.
func Report(vs []Violation) string {
	lines := make([]string, len(vs))
	for i, v := range vs {
		lines[i] = v.String()
	}
	return strings.Join(lines, "\n")
}
