// Package procsweep kills what a job left behind in its unit: every process of the
// caller's uid in the caller's pid namespace, however it was detached (setsid, nohup,
// double fork), except the caller itself and the namespace's init.
//
// It relies on the unit's layout (see dispatch/runtime's Docker): the unit's init and its
// long-lived main process run as another uid than the programs executed in it, so that
// kill(-1, SIGKILL) from an exec of the unit's uid reaches exactly what execs started.
// kill(-1) is one pass of the kernel over the namespace's processes under the task list
// lock: no fork can slip between two kills, so a fork bomb is ended in one call, and a
// fork that was under way fails on the pending SIGKILL. The sweep then waits until the
// processes are gone from /proc (reaped by the unit's init), repeating the kill.
//
// A dashboard's unit has no keeper: the dashboard is its main process and runs its chat
// turns' agents as its own uid. It sweeps from itself (SweepAsMain) once a turn's agent
// has exited, and kill(-1), which never signals the caller or pid 1, spares it and the
// unit's init.
package procsweep

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Result is what one sweep found.
type Result struct {
	Killed int // processes found and killed
}

// ErrNotInUnit says the caller does not run where a sweep is safe: kill(-1) on a host, or
// with a capability to signal other users' processes, would take far more than a job.
var ErrNotInUnit = errors.New("not inside an org unit: refusing to sweep")

// Sweep kills every other process of the caller's uid in its pid namespace and waits
// until they are gone, for at most within. keeper is the main process's command line
// that must be pid 1's (after its init's arguments), for example "hermes-host worker
// idle": the check that this runs inside a unit.
func Sweep(within time.Duration, keeper string) (Result, error) {
	if err := checkInUnit(keeper); err != nil {
		return Result{}, err
	}
	return sweep(within)
}

// SweepAsMain is Sweep for a unit whose main process is the caller (a dashboard, whose
// chat turns' agents run as its own uid): it kills every other process of the caller's
// uid in its pid namespace but the namespace's init, which kill(-1) spares. CheckMain is
// its check that this runs inside a unit.
func SweepAsMain(within time.Duration) (Result, error) {
	if err := CheckMain(); err != nil {
		return Result{}, err
	}
	return sweep(within)
}

func sweep(within time.Duration) (Result, error) {
	uid := os.Getuid()
	self := os.Getpid()
	found := ours(uid, self)
	res := Result{Killed: len(found)}
	deadline := time.Now().Add(within)
	for len(found) > 0 {
		// Everything we may signal but pid 1 and ourselves: with no capability, only
		// processes of our uid.
		_ = syscall.Kill(-1, syscall.SIGKILL)
		if time.Now().After(deadline) {
			return res, fmt.Errorf("after %s, %d processes are still there (pids %v)", within, len(found), found)
		}
		time.Sleep(2 * time.Millisecond)
		found = ours(uid, self)
		if len(found) > res.Killed {
			res.Killed = len(found)
		}
	}
	return res, nil
}

// checkInUnit refuses unless the caller has no effective capability, is not root, and pid
// 1 runs keeper as another uid: inside a unit's pid namespace, kill(-1) reaches the
// unit's execs only.
func checkInUnit(keeper string) error {
	if err := checkUnprivileged(); err != nil {
		return err
	}
	args, err := cmdline("1")
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotInUnit, err)
	}
	if keeper == "" || !strings.HasSuffix(args, " "+keeper) && args != keeper {
		return fmt.Errorf("%w: pid 1 is %q, not the unit's %q", ErrNotInUnit, args, keeper)
	}
	if uid, err := uidOf("1"); err != nil || uid == os.Getuid() {
		return fmt.Errorf("%w: pid 1 runs as this uid (%d, %v)", ErrNotInUnit, uid, err)
	}
	return nil
}

// CheckMain refuses unless the caller has no effective capability, is not root, and is
// its unit's main process: not pid 1, whose command line (the unit's init: Docker's, or
// bubblewrap's) ends with the caller's own. On a host, pid 1 is the host's init, and
// kill(-1) would reach every process of the user.
func CheckMain() error {
	if err := checkUnprivileged(); err != nil {
		return err
	}
	if os.Getpid() == 1 {
		return fmt.Errorf("%w: this is pid 1", ErrNotInUnit)
	}
	own, err := cmdline("self")
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotInUnit, err)
	}
	init, err := cmdline("1")
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotInUnit, err)
	}
	if own == "" || !strings.HasSuffix(init, " "+own) {
		return fmt.Errorf("%w: pid 1 is %q, not an init of %q", ErrNotInUnit, init, own)
	}
	return nil
}

// cmdline is a process's arguments joined by spaces.
func cmdline(pid string) (string, error) {
	raw, err := os.ReadFile("/proc/" + pid + "/cmdline")
	if err != nil {
		return "", err
	}
	return strings.Join(strings.Split(string(bytes.TrimRight(raw, "\x00")), "\x00"), " "), nil
}

// checkUnprivileged refuses root and any effective capability: kill(-1) then reaches
// only processes of the caller's uid.
func checkUnprivileged() error {
	if os.Getuid() == 0 {
		return fmt.Errorf("%w: running as root", ErrNotInUnit)
	}
	caps, err := statusField("self", "CapEff")
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotInUnit, err)
	}
	if n, err := strconv.ParseUint(caps, 16, 64); err != nil || n != 0 {
		return fmt.Errorf("%w: effective capabilities %s", ErrNotInUnit, caps)
	}
	return nil
}

// ours lists the processes of uid other than self (and pid 1) in /proc.
func ours(uid, self int) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var pids []int
	for _, dir := range dirs {
		pid, err := strconv.Atoi(filepath.Base(dir))
		if err != nil || pid == self || pid == 1 {
			continue
		}
		if u, err := uidOf(filepath.Base(dir)); err == nil && u == uid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// uidOf is the real uid of a process.
func uidOf(pid string) (int, error) {
	f, err := statusField(pid, "Uid")
	if err != nil {
		return -1, err
	}
	real, _, _ := strings.Cut(f, "\t")
	return strconv.Atoi(strings.TrimSpace(real))
}

func statusField(pid, name string) (string, error) {
	raw, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("/proc/%s/status has no %s", pid, name)
}
