package worker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// HomeLockFile is the lock every agent run takes in its home, beside the home: lease, so
// that a stale holder waking late cannot start a second agent on the same home.
const HomeLockFile = ".host.lock"

// ErrHomeBusy: another agent holds the home's lock.
var ErrHomeBusy = errors.New("home is locked by another agent run")

// HomeLock is a held exclusive lock on a home; the kernel drops it if the process dies.
type HomeLock struct{ f *os.File }

// LockHome takes the home's exclusive lock without waiting.
func LockHome(home string) (*HomeLock, error) {
	path := filepath.Join(home, HomeLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock home %s: %w", home, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock home %s: %w", home, ErrHomeBusy)
		}
		return nil, fmt.Errorf("lock home %s: %w", home, err)
	}
	return &HomeLock{f: f}, nil
}

// Unlock releases the lock.
func (l *HomeLock) Unlock() error {
	err := syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	return errors.Join(err, l.f.Close())
}
