package hosttest

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// demoOrgsLock is taken by every test that runs containers for the demo orgs: a container
// name is one per org on an engine, so such tests, from any package or checkout, take turns.
var demoOrgsLock = filepath.Join(os.TempDir(), "hermes-demo-org-containers.lock")

// LockDemoOrgContainers waits, up to within, until this test alone may run containers named
// for the demo orgs (hermes-org-acme, hermes-org-globex), and holds that until it ends.
func LockDemoOrgContainers(t testing.TB, within time.Duration) {
	t.Helper()
	lock, err := os.OpenFile(demoOrgsLock, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() }) // closing drops the lock
	deadline := time.Now().Add(within)
	for {
		err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			t.Fatalf("lock %s (another test runs the demo orgs' containers): %v", demoOrgsLock, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
