package hosttest

import "testing"

// Ports handed out one after another are distinct even when the kernel would give a freed
// port back at once: a test that names several servers' ports must not get one twice.
func TestFreePortNeverHandsOutAPortTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		p := FreePort(t)
		if p <= 0 || seen[p] {
			t.Fatalf("FreePort gave %d, handed out already or not a port (after %d)", p, len(seen))
		}
		seen[p] = true
	}
}
