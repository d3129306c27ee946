package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Sandbox modes (Sandbox.Mode).
const (
	// SandboxAuto confines units with bubblewrap when it is installed and works here, and
	// runs them unconfined (saying so loudly) otherwise.
	SandboxAuto = "auto"
	// SandboxBwrap requires bubblewrap: NewProcess fails without it.
	SandboxBwrap = "bwrap"
	// SandboxNone runs units unconfined: orgs are not isolated from each other.
	SandboxNone = "none"
)

// DefaultSandboxUID is the uid (and gid) an org's sandboxed programs run as when the host
// runs as root: not root, no user of a usual host, and the uid the Docker runtime's units
// run as by default, so that a home keeps one owner whichever runtime serves it.
const DefaultSandboxUID = 10001

// Sandbox is how Process confines the programs it starts for an org (its idle worker,
// each exec, its dashboard). Under bubblewrap each runs in namespaces of its own: its own
// pid namespace (it sees no host process, and when its main program ends the kernel kills
// everything it started, detached or not), IPC and UTS namespaces, a fresh /proc, a minimal
// /dev, a private /tmp, the host's system folders and BinDir read-only, and, read-write,
// only that org's home (SOUL.md read-only) and workspaces, at their host paths. A host
// running as root runs the programs as UID:GID (their files in the home and workspaces are
// owned to match before each start); a host of another user runs them as itself, in a
// user namespace. On an isolated network (the default) each has a network namespace of its
// own with only a loopback, and the org's sockets of host services bound in.
type Sandbox struct {
	// Mode is SandboxAuto (the default), SandboxBwrap or SandboxNone.
	Mode string
	// Bwrap is the bubblewrap program; default bwrap on PATH (/usr/bin/bwrap on Debian).
	Bwrap string
	// UID and GID the programs run as when the host runs as root; default DefaultSandboxUID.
	UID, GID int
	// ReadOnly are more host paths (files or folders) the programs see read-only at the
	// same place, such as an agent installed outside /usr and /opt.
	ReadOnly []string
}

// systemPaths are bound read-only into every sandbox when the host has them; a top-level
// one that is a symbolic link on the host (/bin -> usr/bin) is the same link inside.
var systemPaths = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"}

// etcPaths are the few files of /etc that programs need: names, hosts and DNS, time zone,
// TLS roots, the loader's cache, and Debian's alternatives links. Nothing else of /etc.
var etcPaths = []string{"passwd", "group", "hosts", "host.conf", "resolv.conf", "nsswitch.conf", "gai.conf",
	"services", "protocols", "localtime", "timezone", "ssl", "ca-certificates", "ca-certificates.conf", "pki",
	"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "mime.types", "os-release", "debian_version"}

// bwrapSandbox runs programs under bubblewrap.
type bwrapSandbox struct {
	bwrap string
	// setpriv drops to uid:gid inside the sandbox when the host runs as root: bubblewrap
	// run by root sets up without a user namespace (one would map the sandbox's uid to the
	// host's root), so the switch to an unprivileged uid happens in the sandbox, after
	// which the program holds no capability and cannot gain one (no_new_privs).
	setpriv  string
	uid, gid int
	readOnly []string
	cfg      Config
	// isolatedNet gives every sandbox a network namespace of its own, with only a
	// loopback (Config.Network isolated).
	isolatedNet bool
}

// boxMount is a host folder bound into one sandbox at dst.
type boxMount struct{ flag, src, dst string }

// openSandbox returns the sandbox cfg asks for, or nil and why there is none. An error
// that is not a reason to run unconfined (SandboxBwrap without bubblewrap, a bad mode)
// is returned as fatal.
func openSandbox(cfg Config) (box *bwrapSandbox, unconfined, fatal error) {
	s := cfg.Sandbox
	switch s.Mode {
	case "", SandboxAuto, SandboxBwrap:
	case SandboxNone:
		return nil, errors.New("the sandbox is turned off (mode none)"), nil
	default:
		return nil, nil, fmt.Errorf("runtime config: sandbox mode %q is not auto, bwrap or none", s.Mode)
	}
	box, err := newBwrap(cfg)
	if err != nil {
		if s.Mode == SandboxBwrap {
			return nil, nil, fmt.Errorf("sandbox: %w", err)
		}
		return nil, err, nil
	}
	return box, nil, nil
}

func newBwrap(cfg Config) (*bwrapSandbox, error) {
	s := cfg.Sandbox
	name := s.Bwrap
	if name == "" {
		name = "bwrap"
	}
	bwrap, err := exec.LookPath(name)
	if err != nil {
		return nil, fmt.Errorf("bubblewrap is not installed (%w)", err)
	}
	b := &bwrapSandbox{bwrap: bwrap, uid: s.UID, gid: s.GID, readOnly: s.ReadOnly, cfg: cfg}
	if os.Geteuid() == 0 {
		if b.uid == 0 {
			b.uid = DefaultSandboxUID
		}
		if b.gid == 0 {
			b.gid = b.uid
		}
		if b.setpriv, err = exec.LookPath("setpriv"); err != nil {
			return nil, fmt.Errorf("setpriv (util-linux) is not installed, and bubblewrap run by root needs it to drop to uid %d (%w)", b.uid, err)
		}
	}
	if err := b.probe(); err != nil {
		return nil, err
	}
	return b, nil
}

// probe runs a trivial program in an empty sandbox: bubblewrap installed where it cannot
// make namespaces (a container without the capability, user namespaces turned off) fails
// here rather than at every unit's start.
func (b *bwrapSandbox) probe() error {
	truth, err := exec.LookPath("true")
	if err != nil {
		return fmt.Errorf("probe bubblewrap: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	args := append(b.baseArgs(), "--remount-ro", "/", "--")
	cmd := exec.CommandContext(ctx, b.bwrap, append(append(args, b.dropArgs(b.uid, b.gid)...), truth)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.Join(strings.Fields(stderr.String()), " ")
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		return fmt.Errorf("bubblewrap (%s) does not work here: %v: %s", b.bwrap, err, msg)
	}
	return nil
}

// baseArgs are the namespaces and the system folders every sandbox has.
func (b *bwrapSandbox) baseArgs() []string {
	args := []string{
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session",
	}
	if b.isolatedNet {
		// A network namespace of its own: a loopback and nothing else. What it may use of
		// the host comes as sockets bound in (Config.Services).
		args = append(args, "--unshare-net")
	}
	for _, p := range systemPaths {
		fi, err := os.Lstat(p)
		switch {
		case err != nil:
		case fi.Mode()&fs.ModeSymlink != 0:
			if target, err := os.Readlink(p); err == nil {
				args = append(args, "--symlink", target, p)
			}
		case fi.IsDir():
			args = append(args, "--ro-bind", p, p)
		}
	}
	for _, name := range etcPaths {
		p := "/etc/" + name
		args = append(args, "--ro-bind-try", p, p)
	}
	args = append(args, "--proc", "/proc", "--dev", "/dev")
	if limit := b.cfg.Limits.MemoryBytes; limit > 0 {
		// A private /tmp is memory: at most the memory limit of it.
		args = append(args, "--size", strconv.FormatInt(limit, 10))
	}
	return append(args, "--perms", "1777", "--tmpfs", "/tmp")
}

// dropArgs start the program as uid:gid when the host runs as root.
func (b *bwrapSandbox) dropArgs(uid, gid int) []string {
	if b.setpriv == "" {
		return nil
	}
	return []string{b.setpriv, "--reuid", strconv.Itoa(uid), "--regid", strconv.Itoa(gid), "--clear-groups",
		"--inh-caps=-all", "--bounding-set=-all", "--"}
}

// args are bubblewrap's arguments to run program in a sandbox of unit's as uid:gid (when
// the host is root), with extra more paths bound read-only and infoFD the descriptor it
// reports the sandbox's pid 1 on.
func (b *bwrapSandbox) args(unit string, dirs orgDirs, uid, gid int, program string, programArgs, extra []string, mounts []boxMount, infoFD int) []string {
	args := b.baseArgs()
	args = append(args, "--hostname", unit)
	type bind struct{ flag, path string }
	var binds []bind
	for _, p := range b.binDirPrograms() {
		binds = append(binds, bind{"--ro-bind-try", p})
	}
	for _, p := range append(append([]string(nil), b.readOnly...), extra...) {
		binds = append(binds, bind{"--ro-bind-try", p})
	}
	if b.setpriv != "" {
		binds = append(binds, bind{"--ro-bind", b.setpriv})
	}
	binds = append(binds, bind{"--bind", dirs.home}, bind{"--bind", dirs.workspaces},
		bind{"--ro-bind", filepath.Join(dirs.home, "SOUL.md")})
	// bubblewrap would make the folders leading to a bound path with the host folders'
	// modes (a test's temporary folder is 0700, root's): made first, they are 0755 and
	// empty but for what is bound in them.
	made := make(map[string]bool)
	dsts := make([]string, 0, len(binds)+len(mounts))
	for _, bd := range binds {
		dsts = append(dsts, bd.path)
	}
	for _, m := range mounts {
		dsts = append(dsts, m.dst)
	}
	for _, dst := range dsts {
		for _, dir := range ancestors(dst) {
			if !made[dir] && !underSystemPath(dir) {
				made[dir] = true
				args = append(args, "--perms", "0755", "--dir", dir)
			}
		}
	}
	for _, bd := range binds {
		args = append(args, bd.flag, bd.path, bd.path)
	}
	for _, m := range mounts {
		args = append(args, m.flag, m.src, m.dst)
	}
	// The folders holding every org's home and workspaces exist inside only as the way to
	// this org's: nothing else is in them, and they cannot be listed.
	for _, parent := range []string{filepath.Dir(dirs.home), filepath.Dir(dirs.workspaces)} {
		if made[parent] {
			args = append(args, "--chmod", "0111", parent)
		}
	}
	args = append(args, "--remount-ro", "/", "--info-fd", strconv.Itoa(infoFD), "--chdir", dirs.home, "--")
	args = append(args, b.dropArgs(uid, gid)...)
	return append(append(args, program), programArgs...)
}

// ancestors are the folders leading to path, outermost first, without / and /tmp.
func ancestors(path string) []string {
	var dirs []string
	for dir := filepath.Dir(path); dir != "/" && dir != "/tmp" && dir != "."; dir = filepath.Dir(dir) {
		dirs = append([]string{dir}, dirs...)
	}
	return dirs
}

// underSystemPath says whether dir is in what every sandbox binds from the host.
func underSystemPath(dir string) bool {
	for _, p := range append(append([]string(nil), systemPaths...), "/etc", "/proc", "/dev") {
		if dir == p || strings.HasPrefix(dir, p+"/") {
			return true
		}
	}
	return false
}

// agentPaths are the programs named by absolute path in a unit's environment that the
// sandbox must show: the agent command (HERMES_BIN), which the worker and the dashboard's
// chat run. The environment is the host's own (Command.Env, Dashboard.Env), never an
// agent's.
func agentPaths(env []string) []string {
	var paths []string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "HERMES_BIN="); ok && filepath.IsAbs(v) {
			paths = append(paths, filepath.Clean(v))
		}
	}
	return paths
}

// binDirPrograms are BinDir's programs, bound one by one so that the folder inside holds
// nothing else; none when BinDir is under /usr, which is bound whole.
func (b *bwrapSandbox) binDirPrograms() []string {
	dir := b.cfg.BinDir
	if dir == "" || underSystemPath(dir) {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil // a program named there then fails to start, saying why
	}
	var paths []string
	for _, e := range entries {
		paths = append(paths, filepath.Join(dir, e.Name()))
	}
	return paths
}

// own makes the org's home and workspaces, and everything in them, the sandbox uid's,
// when the host runs as root; the host writes there (SOUL.md, config, job inputs) as
// root. chownTree changes links, never follows them, and cannot leave the folder through
// one (os.Root), whatever an agent left there.
func (b *bwrapSandbox) own(dirs orgDirs, uid, gid int) error {
	if b.setpriv == "" {
		return nil
	}
	for _, dir := range []string{dirs.home, dirs.workspaces} {
		if _, err := chownTree(dir, uid, gid); err != nil {
			return fmt.Errorf("own %s for the sandbox: %w", dir, err)
		}
	}
	return nil
}

// tree is one started program and everything it starts: the process group of a plain
// subprocess, or the pid namespace of a sandbox.
type tree struct {
	pgid int // the started process's own group
	mu   sync.Mutex
	// pidfd is the sandbox's pid 1, whose death takes the whole namespace along; -1
	// without a sandbox, when the sandbox ended before it was known, or once released.
	pidfd int
	pidNS string // the sandbox's pid namespace as /proc/<pid>/ns/pid reads, "pid:[N]"
}

func groupTree(pgid int) *tree { return &tree{pgid: pgid, pidfd: -1} }

// sandboxTree reads what bubblewrap reports on info about the sandbox it started as
// bwrapPid. Without a report (bubblewrap failed to set up, and is exiting) the tree is
// only the process group.
func sandboxTree(info *os.File, bwrapPid int) *tree {
	t := groupTree(bwrapPid)
	defer info.Close()
	_ = info.SetReadDeadline(time.Now().Add(10 * time.Second))
	var report struct {
		ChildPid int    `json:"child-pid"`
		PidNS    uint64 `json:"pid-namespace"`
	}
	if err := json.NewDecoder(info).Decode(&report); err != nil || report.ChildPid <= 0 {
		return t
	}
	fd, err := unix.PidfdOpen(report.ChildPid, 0)
	if err != nil {
		return t // already gone
	}
	// The pid names the sandbox's pid 1 only while bubblewrap has not reaped it: once it
	// has, the number may be another process's.
	if parentOf(report.ChildPid) != bwrapPid {
		unix.Close(fd)
		return t
	}
	t.pidfd = fd
	t.pidNS = fmt.Sprintf("pid:[%d]", report.PidNS)
	return t
}

func parentOf(pid int) int {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// kill kills everything in the tree. In a sandbox that is its pid 1: the kernel then
// kills every other process of the namespace. bubblewrap itself is left to exit; see
// waitGone for when the namespace is empty.
func (t *tree) kill() {
	t.mu.Lock()
	sandboxed := t.pidfd >= 0
	if sandboxed {
		_ = unix.PidfdSendSignal(t.pidfd, unix.SIGKILL, nil, 0)
	}
	t.mu.Unlock()
	if !sandboxed {
		killGroup(t.pgid)
	}
}

// waitGone returns once the sandbox's pid 1 has exited, which is after every other process
// of its namespace has: bubblewrap itself exits as soon as the program does (its pid 1
// tells it so), and its pid 1, killed with it (--die-with-parent) or here, takes the rest
// of the namespace along a moment later. Call it after the started process was reaped.
func (t *tree) waitGone(timeout time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pidfd < 0 {
		return
	}
	_ = unix.PidfdSendSignal(t.pidfd, unix.SIGKILL, nil, 0)
	deadline := time.Now().Add(timeout)
	for {
		// A pidfd polls readable once its process has exited.
		fds := []unix.PollFd{{Fd: int32(t.pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(time.Until(deadline)/time.Millisecond)+1)
		if (err == nil && n > 0) || (err != nil && err != unix.EINTR) || time.Now().After(deadline) {
			return
		}
	}
}

// release gives up the sandbox's pidfd once the started process has been reaped.
func (t *tree) release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pidfd >= 0 {
		unix.Close(t.pidfd)
		t.pidfd = -1
	}
}

// resident sums the resident memory of the tree's processes.
func (t *tree) resident() int64 {
	if t.pidNS == "" {
		return residentWhere(func(pid string, fields []string) bool { return fields[2] == strconv.Itoa(t.pgid) })
	}
	return residentWhere(func(pid string, _ []string) bool {
		ns, err := os.Readlink("/proc/" + pid + "/ns/pid")
		return err == nil && ns == t.pidNS
	})
}

// unisolatedWarning is what a Process without a sandbox logs when it starts.
const unisolatedWarning = "ORGS ARE NOT ISOLATED FROM EACH OTHER: the process runtime runs every org's programs unsandboxed, " +
	"as the host's own user, where an agent can read other orgs' homes and the host's processes"

func (b *bwrapSandbox) runsAs() string {
	if b.setpriv == "" {
		return strconv.Itoa(os.Geteuid()) + " (the host's own, in a user namespace)"
	}
	return strconv.Itoa(b.uid) + ":" + strconv.Itoa(b.gid)
}

// Unisolated says why p does not isolate orgs from each other, or nil when every program
// it starts runs in a sandbox.
func (p *Process) Unisolated() error {
	if p.box != nil {
		return nil
	}
	if p.because != nil {
		return fmt.Errorf("orgs are not isolated: %v, and the process runtime picked instead has no sandbox: %v", p.because, p.unconfined)
	}
	return fmt.Errorf("orgs are not isolated: the process runtime has no sandbox: %v", p.unconfined)
}

// Unisolated says why rt does not isolate orgs from each other, or nil when it does
// (Docker, or a sandboxed Process).
func Unisolated(rt Runtime) error {
	if p, ok := rt.(*Process); ok {
		return p.Unisolated()
	}
	return nil
}
