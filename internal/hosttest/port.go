package hosttest

import (
	"net"
	"sync"
	"testing"
)

var (
	portsMu sync.Mutex
	// portsGiven are the ports FreePort has handed out in this test binary: a server that
	// was given one may not listen on it yet, and the kernel would hand it out again.
	portsGiven = map[int]bool{}
)

// FreePort is a loopback port nothing listened on a moment ago and that no earlier call in
// this test binary returned, for a server whose address must be known before it starts (a
// client's URL fixed across restarts, a flag). Two calls in a row never collide, which a
// bare listen-and-close does now and then: the kernel may give the port it just freed again.
func FreePort(t testing.TB) int {
	t.Helper()
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for range 64 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free loopback port: %v", err)
		}
		held = append(held, l)
		port := l.Addr().(*net.TCPAddr).Port
		portsMu.Lock()
		given := portsGiven[port]
		portsGiven[port] = true
		portsMu.Unlock()
		if !given {
			return port
		}
	}
	t.Fatal("find a free loopback port: 64 tries all gave ports handed out already")
	return 0
}
