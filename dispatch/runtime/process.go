package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"hermeshost/internal/unitnet"
)

// memorySampleInterval is how often Process measures a running exec's resident memory.
const memorySampleInterval = 50 * time.Millisecond

// outputDrainWait bounds how long an ended exec waits on an output pipe that gives nothing
// after its process group was killed: only a process that left the group can hold it open.
// A pipe still giving output, or whose reader waits on a slow consumer (the dispatcher
// mirrors each line in a transaction of its own), is read to its end: its last line is
// the run's outcome.
const outputDrainWait = 2 * time.Second

// sandboxGoneWait bounds how long an ended sandbox's namespace may take to empty once its
// pid 1 was killed; the kernel does it at once unless a process is stuck in the kernel.
const sandboxGoneWait = 10 * time.Second

var errClosed = errors.New("runtime closed")

// Process runs each org's worker and dashboard as local subprocesses, each in its own
// process group, working in the org's home. It is the embedded default for one machine
// without a Docker engine. It keeps the environment rules (a subprocess sees only the
// org's variables and what its Command adds, never the host's environment) and limits
// memory by sampling. Where bubblewrap works (Config.Sandbox) every program it starts
// for an org runs in a sandbox of its own that holds only that org's home and
// workspaces (see Sandbox); without one it is no isolation boundary, subprocesses run as
// the host's user and can reach every file the host can, and it says so (Unisolated).
type Process struct {
	cfg   Config
	log   *slog.Logger
	locks unitLocks
	waits sync.WaitGroup // one per unit or exec whose main process has not been reaped
	box   *bwrapSandbox  // nil: programs run unconfined
	net   netPlan        // isolated only in a sandbox
	pids  *pidsCgroups   // nil: no process limit
	// unconfined says why there is no sandbox; because, why Detect picked this runtime.
	unconfined, because error

	mu     sync.Mutex
	units  map[string]*processUnit // by unit name
	closed bool
}

type processUnit struct {
	org      string
	role     Role
	name     string
	pid      int // also its process group
	tree     *tree
	soul     string // identity of the SOUL.md a sandbox bound
	uid, gid int    // what its sandbox drops to (-1: no drop)
	exited   chan struct{}
	execs    map[*processExec]struct{}
	lastUsed time.Time
}

type processExec struct {
	tree        *tree // nil until started; guarded by Process.mu
	gone        atomic.Bool
	outOfMemory atomic.Bool
}

// NewProcess returns a Process runtime. Its subprocesses get SIGKILL if the host dies, so
// nothing is left to adopt at the next start.
func NewProcess(cfg Config) (*Process, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	box, unconfined, err := openSandbox(cfg)
	if err != nil {
		return nil, err
	}
	if box == nil && cfg.Network != NetworkHost {
		// Without a sandbox there is no network of a unit's own: programs are on the
		// host's, and reach the host's services at their addresses.
		cfg.Network = NetworkHost
	}
	plan, err := cfg.netPlan()
	if err != nil {
		return nil, err
	}
	if box != nil {
		box.isolatedNet = plan.isolated
	}
	var pids *pidsCgroups
	if box != nil && cfg.Limits.Pids > 0 {
		if pids, err = openPidsCgroups(cfg.Instance, cfg.Limits.Pids); err != nil {
			cfg.Logger.Warn("org units have NO PROCESS LIMIT: a fork bomb in one can exhaust the host", "runtime", "process", "pids", cfg.Limits.Pids, "reason", err.Error())
		}
	}
	p := &Process{
		pids:       pids,
		net:        plan,
		cfg:        cfg,
		log:        cfg.Logger.With("runtime", "process"),
		units:      make(map[string]*processUnit),
		box:        box,
		unconfined: unconfined,
	}
	if box == nil {
		p.log.Warn(unisolatedWarning, "reason", unconfined.Error())
	} else {
		p.log.Info("org units sandboxed", "sandbox", "bwrap", "bwrap", box.bwrap, "uid", box.runsAs())
	}
	return p, nil
}

// Kind implements Runtime.
func (p *Process) Kind() string { return "process" }

// ServiceURL implements Runtime.
func (p *Process) ServiceURL(org, name string) string { return p.net.serviceURL(unitnet.Dir, name) }

// DashboardAddr implements Runtime: in a sandbox the dashboard's folder is bound at
// unitnet.DashboardDir, elsewhere it serves at the host's path.
func (p *Process) DashboardAddr(org string) (string, string) {
	host := filepath.Join(p.cfg.RunRoot, runDashboards, org, dashboardSocket)
	if p.box == nil {
		return unitnet.URL(host), unitnet.URL(host)
	}
	return unitnet.URL(filepath.Join(unitnet.DashboardDir, dashboardSocket)), unitnet.URL(host)
}

// EnsureWorker implements Runtime.
func (p *Process) EnsureWorker(ctx context.Context, org string) (Ensured, error) {
	return p.ensure(ctx, org, RoleWorker, p.cfg.WorkerIdle, nil, nil)
}

// EnsureDashboard implements Runtime.
func (p *Process) EnsureDashboard(ctx context.Context, org string, d Dashboard) (Ensured, error) {
	if len(d.Args) == 0 {
		return Ensured{}, errors.New("ensure dashboard: no command")
	}
	return p.ensure(ctx, org, RoleDashboard, d.Args, d.Secrets, d.Env)
}

func (p *Process) ensure(ctx context.Context, org string, role Role, args, secrets, env []string) (Ensured, error) {
	dirs, err := p.cfg.prepareOrg(org)
	if err != nil {
		return Ensured{}, err
	}
	name := UnitName(org, role)
	defer p.locks.lock(name)()

	soul := fileIdentity(dirs.soul)
	uid, gid, err := p.unitUser(ctx, org)
	if err != nil {
		return Ensured{}, err
	}
	p.mu.Lock()
	u := p.units[name]
	if u != nil && !hasEnded(u.exited) {
		if p.box == nil || u.soul == soul && u.uid == uid && u.gid == gid {
			u.lastUsed = p.cfg.Now()
			p.mu.Unlock()
			p.cfg.Metrics.ensured(p.Kind(), role, false)
			return Ensured{Unit: u.unit(true)}, nil
		}
		// Its sandbox binds the SOUL.md the host has since replaced, as a container would,
		// or runs as a uid that is no longer the org's.
		p.mu.Unlock()
		reason := "SOUL.md replaced"
		if u.soul == soul {
			reason = fmt.Sprintf("runs as %d:%d, not the org's %d:%d", u.uid, u.gid, uid, gid)
		}
		p.log.Info("process restarted", "unit", name, "pid", u.pid, "reason", reason)
		u.tree.kill()
		select {
		case <-u.exited:
		case <-ctx.Done():
			return Ensured{}, fmt.Errorf("restart %s: %w", name, context.Cause(ctx))
		}
	} else {
		p.mu.Unlock()
	}

	cmd, info, err := p.command(org, name, dirs, uid, gid, args, env)
	if err != nil {
		return Ensured{}, err
	}
	cmd.Stdout, cmd.Stderr = p.cfg.Output, p.cfg.Output
	if role == RoleDashboard {
		cmd.Stdin = strings.NewReader(secretLines(secrets))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		closeInfo(cmd, info)
		return Ensured{}, errClosed
	}
	t, err := start(cmd, info)
	if err != nil {
		return Ensured{}, fmt.Errorf("start %s: %w", name, err)
	}
	u = &processUnit{
		org:      org,
		role:     role,
		name:     name,
		pid:      cmd.Process.Pid,
		tree:     t,
		soul:     soul,
		uid:      uid,
		gid:      gid,
		exited:   make(chan struct{}),
		execs:    make(map[*processExec]struct{}),
		lastUsed: p.cfg.Now(),
	}
	p.units[name] = u
	p.waits.Add(1)
	go func() {
		defer p.waits.Done()
		p.unitEnded(u, cmd.Wait())
	}()
	p.cfg.Metrics.ensured(p.Kind(), role, true)
	attrs := []any{"unit", name, "pid", u.pid, "org", org, "role", role, "sandboxed", p.box != nil}
	if p.pids != nil {
		attrs = append(attrs, "pids_cgroup", p.pids.dir(name))
	}
	p.log.Info("process started", attrs...)
	return Ensured{Unit: u.unit(true), Cold: true}, nil
}

// unitEnded runs once a unit's main process has exited: like a container's, its death
// takes everything started in it along.
func (p *Process) unitEnded(u *processUnit, waitErr error) {
	u.tree.kill()
	u.tree.waitGone(sandboxGoneWait)
	u.tree.release()
	p.mu.Lock()
	close(u.exited)
	for e := range u.execs {
		e.gone.Store(true)
		if e.tree != nil {
			e.tree.kill()
		}
	}
	p.mu.Unlock()
	if p.pids != nil {
		p.pids.remove(u.name)
	}
	p.log.Info("process exited", "unit", u.name, "pid", u.pid, "status", waitStatus(waitErr))
}

// Exec implements Runtime. Cancelling kills the program's process group, or in a sandbox
// everything in the program's pid namespace; the worker keeps running. In a sandbox every
// process the program started, detached or not, is gone when Exec returns.
func (p *Process) Exec(ctx context.Context, org string, cmd Command) (ExitStatus, error) {
	if err := ValidateOrg(org); err != nil {
		return ExitStatus{}, err
	}
	if len(cmd.Args) == 0 {
		return ExitStatus{}, errors.New("exec: no command")
	}
	name := UnitName(org, RoleWorker)
	p.mu.Lock()
	u := p.units[name]
	if u == nil || hasEnded(u.exited) {
		p.mu.Unlock()
		return ExitStatus{}, fmt.Errorf("exec %s in %s: %w", cmd.Args[0], name, ErrNotRunning)
	}
	if p.closed {
		p.mu.Unlock()
		return ExitStatus{}, fmt.Errorf("exec %s in %s: %w", cmd.Args[0], name, errClosed)
	}
	e := &processExec{}
	u.execs[e] = struct{}{}
	p.waits.Add(1)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(u.execs, e)
		u.lastUsed = p.cfg.Now()
		p.mu.Unlock()
		p.waits.Done()
	}()

	began := p.cfg.Now()
	status, outcome, err := p.exec(ctx, u, e, cmd)
	return recordExec(p.log, p.cfg.Metrics, p.Kind(), name, cmd, p.cfg.Now().Sub(began), status, outcome, err)
}

func (p *Process) exec(ctx context.Context, u *processUnit, e *processExec, command Command) (ExitStatus, string, error) {
	cmd, info, err := p.command(u.org, u.name, p.cfg.dirs(u.org), u.uid, u.gid, command.Args, command.Env)
	if err != nil {
		return ExitStatus{}, outcomeNotStarted, fmt.Errorf("%w: %w", ErrNotStarted, err)
	}
	// Pipes made here, rather than by os/exec, let Wait return as soon as the program
	// exits: its leftovers are then killed, and only after that is the output drained.
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		closeInfo(cmd, info)
		return ExitStatus{}, outcomeFailed, err
	}
	defer stdinW.Close()
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		closeInfo(cmd, info)
		return ExitStatus{}, outcomeFailed, err
	}
	defer stdoutR.Close()
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		stdoutW.Close()
		closeInfo(cmd, info)
		return ExitStatus{}, outcomeFailed, err
	}
	defer stderrR.Close()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, stdoutW, stderrW
	t, err := start(cmd, info)
	stdinR.Close()
	stdoutW.Close()
	stderrW.Close()
	if err != nil {
		return ExitStatus{}, outcomeNotStarted, fmt.Errorf("%w: %w", ErrNotStarted, err)
	}
	defer t.release()
	p.mu.Lock()
	e.tree = t
	if hasEnded(u.exited) || p.closed {
		e.gone.Store(true)
		t.kill()
	}
	p.mu.Unlock()

	go func() {
		// A caller's Stdin that never returns keeps this goroutine until it does; the
		// exec itself does not wait for it.
		if command.Stdin != nil {
			_, _ = io.Copy(stdinW, command.Stdin)
		}
		stdinW.Close()
	}()
	var output sync.WaitGroup
	stdout, stderr := &pipeCopy{r: stdoutR}, &pipeCopy{r: stderrR}
	output.Go(func() { stdout.copyTo(orDiscard(command.Stdout)) })
	output.Go(func() { stderr.copyTo(orDiscard(command.Stderr)) })
	stopSampling := make(chan struct{})
	var sampler sync.WaitGroup
	if limit := p.cfg.Limits.MemoryBytes; limit > 0 {
		sampler.Go(func() { limitMemory(e, t, limit, stopSampling) })
	}
	stopWatching := context.AfterFunc(ctx, t.kill)

	waitErr := cmd.Wait()
	canceled := !stopWatching()
	close(stopSampling)
	sampler.Wait()
	t.kill()
	// In a sandbox everything the program started, detached or not, dies with the
	// namespace's pid 1: gone before Exec returns.
	t.waitGone(sandboxGoneWait)
	drained := make(chan struct{})
	go func() {
		output.Wait()
		close(drained)
	}()
	ended := time.Now()
	tick := time.NewTicker(outputDrainWait / 8)
	defer tick.Stop()
	for waiting := true; waiting; {
		select {
		case <-drained:
			waiting = false
		case now := <-tick.C:
			stdout.cutIfHeld(ended, now)
			stderr.cutIfHeld(ended, now)
		}
	}

	var exitErr *exec.ExitError
	switch {
	case canceled:
		return ExitStatus{}, outcomeCanceled, context.Cause(ctx)
	case e.gone.Load():
		return ExitStatus{}, outcomeWorkerGone, ErrWorkerGone
	case waitErr != nil && !errors.As(waitErr, &exitErr):
		return ExitStatus{}, outcomeFailed, waitErr
	}
	status := ExitStatus{Code: exitCode(cmd.ProcessState)}
	if e.outOfMemory.Load() {
		status.OutOfMemory = true
		return status, outcomeOutOfMemory, nil
	}
	return status, outcomeExited, nil
}

// command prepares a program of an org's unit with the org's environment, in its own
// process group, and in a sandbox when there is one: then it also returns the pipe on
// which bubblewrap reports the sandbox (see start). Pdeathsig kills it with the host
// (strictly: with the host thread that started it, and Go retires threads only for
// goroutines that exit while locked to one); a sandbox dies with its bubblewrap.
func (p *Process) command(org, unit string, dirs orgDirs, uid, gid int, args, env []string) (*exec.Cmd, *os.File, error) {
	program, err := p.program(args[0])
	if err != nil {
		return nil, nil, err
	}
	env = append([]string{
		"PATH=" + p.cfg.BinDir + string(os.PathListSeparator) + os.Getenv("PATH"),
		"HOME=" + dirs.home,
		"HERMES_HOME=" + dirs.home,
		"HERMES_WORKSPACES=" + dirs.workspaces,
		"HERMES_ORG=" + org,
	}, env...)
	sockets, dash, err := p.net.ensure(org, uid, gid)
	if err != nil {
		return nil, nil, err
	}
	var cmd *exec.Cmd
	var info *os.File
	if p.box == nil {
		cmd = exec.Command(program, args[1:]...)
	} else {
		if err := p.box.own(dirs, uid, gid); err != nil {
			return nil, nil, err
		}
		var mounts []boxMount
		if sockets != "" {
			mounts = append(mounts, boxMount{"--ro-bind", sockets, unitnet.Dir})
		}
		if unit == UnitName(org, RoleDashboard) {
			mounts = append(mounts, boxMount{"--bind", dash, unitnet.DashboardDir})
		}
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		info = r
		// ExtraFiles[0] is descriptor 3 in bubblewrap.
		argv := append([]string{p.box.bwrap}, p.box.args(unit, dirs, uid, gid, program, args[1:], agentPaths(env), mounts, 3)...)
		if p.pids != nil {
			procs, err := p.pids.ensure(unit)
			if err != nil {
				r.Close()
				w.Close()
				return nil, nil, err
			}
			argv = enterArgs(procs, argv)
		}
		cmd = exec.Command(argv[0], argv[1:]...)
		cmd.ExtraFiles = []*os.File{w}
	}
	cmd.Dir = dirs.home
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd, info, nil
}

// start starts a command made by command and returns its tree.
func start(cmd *exec.Cmd, info *os.File) (*tree, error) {
	err := cmd.Start()
	for _, f := range cmd.ExtraFiles {
		f.Close()
	}
	if err != nil {
		if info != nil {
			info.Close()
		}
		return nil, err
	}
	if info == nil {
		return groupTree(cmd.Process.Pid), nil
	}
	return sandboxTree(info, cmd.Process.Pid), nil
}

// closeInfo releases the pipes of a command made by command that is not started.
func closeInfo(cmd *exec.Cmd, info *os.File) {
	for _, f := range cmd.ExtraFiles {
		f.Close()
	}
	if info != nil {
		info.Close()
	}
}

func (p *Process) program(name string) (string, error) {
	if strings.ContainsRune(name, '/') {
		return name, nil
	}
	if p.cfg.BinDir == "" {
		path, err := exec.LookPath(name)
		if err != nil {
			return "", fmt.Errorf("program %s: %w", name, err)
		}
		return path, nil
	}
	path := filepath.Join(p.cfg.BinDir, name)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("program %s: %w", name, err)
	}
	return path, nil
}

// Stop implements Runtime.
func (p *Process) Stop(ctx context.Context, org string, role Role) error {
	if err := ValidateOrg(org); err != nil {
		return err
	}
	name := UnitName(org, role)
	defer p.locks.lock(name)()
	p.mu.Lock()
	u := p.units[name]
	delete(p.units, name)
	p.mu.Unlock()
	if u == nil {
		return nil
	}
	u.tree.kill()
	select {
	case <-u.exited:
	case <-ctx.Done():
		return fmt.Errorf("stop %s: %w", name, context.Cause(ctx))
	}
	p.log.Info("process stopped", "unit", name, "pid", u.pid)
	return nil
}

// List implements Runtime.
func (p *Process) List(ctx context.Context) ([]Unit, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	units := make([]Unit, 0, len(p.units))
	for _, u := range p.units {
		units = append(units, u.unit(!hasEnded(u.exited)))
	}
	return units, nil
}

// Reap implements Runtime.
func (p *Process) Reap(ctx context.Context) (Reaped, error) {
	var reaped Reaped
	var idle []*processUnit
	now := p.cfg.Now()
	p.mu.Lock()
	for name, u := range p.units {
		switch {
		case hasEnded(u.exited):
			delete(p.units, name)
			reaped.Exited++
			p.log.Info("process reaped", "unit", name, "pid", u.pid, "reason", "exited")
		case u.role == RoleWorker && p.cfg.IdleTimeout > 0 && len(u.execs) == 0 &&
			now.Sub(u.lastUsed) >= p.cfg.IdleTimeout:
			delete(p.units, name)
			idle = append(idle, u)
		}
	}
	p.mu.Unlock()
	var err error
	for _, u := range idle {
		u.tree.kill()
		select {
		case <-u.exited:
			reaped.Idle++
			p.log.Info("process reaped", "unit", u.name, "pid", u.pid, "reason", "idle")
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
	}
	p.cfg.Metrics.reapedUnits(p.Kind(), "idle", reaped.Idle)
	p.cfg.Metrics.reapedUnits(p.Kind(), "exited", reaped.Exited)
	return reaped, err
}

// Close kills every subprocess, with everything each started, and waits until each is
// reaped.
func (p *Process) Close() error {
	p.mu.Lock()
	p.closed = true
	for _, u := range p.units {
		u.tree.kill()
		for e := range u.execs {
			if e.tree != nil {
				e.tree.kill()
			}
		}
	}
	p.units = make(map[string]*processUnit)
	p.mu.Unlock()
	p.waits.Wait()
	p.net.close()
	if p.pids != nil {
		p.pids.close()
	}
	return nil
}

func (u *processUnit) unit(running bool) Unit {
	return Unit{Org: u.org, Role: u.role, Name: u.name, ID: strconv.Itoa(u.pid), Running: running}
}

// limitMemory kills the exec's tree once its resident memory passes limit.
func limitMemory(e *processExec, t *tree, limit int64, stop <-chan struct{}) {
	tick := time.NewTicker(memorySampleInterval)
	defer tick.Stop()
	for {
		if t.resident() > limit {
			e.outOfMemory.Store(true)
			t.kill()
			return
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// residentWhere sums the resident memory of the processes that match, given the pid and
// the fields of /proc/<pid>/stat after the command name (state ppid pgrp ...).
func residentWhere(match func(pid string, fields []string) bool) int64 {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	pageSize := int64(os.Getpagesize())
	var total int64
	for _, entry := range entries {
		if _, err := strconv.Atoi(entry.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", entry.Name(), "stat"))
		if err != nil {
			continue // the process ended while we looked
		}
		// Fields after the command name, which may itself hold spaces and parentheses:
		// state ppid pgrp ... with rss the 22nd.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 22 || !match(entry.Name(), fields) {
			continue
		}
		pages, err := strconv.ParseInt(fields[21], 10, 64)
		if err == nil {
			total += pages * pageSize
		}
	}
	return total
}

// killGroup kills every process of the group and waits, briefly, until the kernel has
// taken them all: SIGKILL is delivered asynchronously, so a grandchild can still be dying
// when its parent has already been reaped, and "cancel kills everything" must hold when the
// exec returns.
func killGroup(pgid int) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		// ESRCH says the group is gone.
		if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func exitCode(state *os.ProcessState) int {
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return state.ExitCode()
}

func waitStatus(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}

func hasEnded(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// unitUser is the uid:gid org's sandboxed programs run as where the sandbox drops to one
// (a host running as root): the org's own from Config.Users, else the sandbox's; -1, -1
// where there is no drop.
func (p *Process) unitUser(ctx context.Context, org string) (uid, gid int, err error) {
	if p.box == nil || p.box.setpriv == "" {
		return -1, -1, nil
	}
	if p.cfg.Users == nil {
		return p.box.uid, p.box.gid, nil
	}
	user, err := p.cfg.userOf(ctx, org)
	if err != nil {
		return 0, 0, err
	}
	return parseUser(user)
}

// pipeCopy copies an exec's output pipe to its consumer, and knows since when it has been
// waiting on the pipe (rather than on the consumer).
type pipeCopy struct {
	r       *os.File
	reading atomic.Int64 // UnixNano when the pending read began; 0 while none is
}

func (c *pipeCopy) copyTo(w io.Writer) {
	buf := make([]byte, 32<<10)
	for {
		c.reading.Store(time.Now().UnixNano())
		n, err := c.r.Read(buf)
		c.reading.Store(0)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// cutIfHeld closes the pipe when its reader has waited on it, with nothing coming, for
// outputDrainWait since the exec ended: a process that left the group holds it open.
func (c *pipeCopy) cutIfHeld(ended, now time.Time) {
	since := c.reading.Load()
	if since == 0 {
		return
	}
	if now.Sub(time.Unix(0, max(since, ended.UnixNano()))) >= outputDrainWait {
		c.r.Close()
	}
}
