// Package runtime starts and stops what runs for an organization: its long-lived worker, the
// jobs executed in that worker, and its dashboard. Two implementations keep one contract:
// Docker (one labelled container per org and role on a Docker engine) and Process (local
// subprocesses, the embedded default where no engine answers). Detect picks between them.
//
// Secrets reach a program only through its exec environment (Command.Env) or, for a
// dashboard, its standard input (Dashboard.Secrets); never through arguments, images,
// labels or files.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"hermeshost/orgid"
)

// Runtime is what the dispatcher needs to run an org's work. Org IDs are validated with
// ValidateOrg before they become names or paths; an invalid one fails with ErrInvalidOrg.
type Runtime interface {
	// Kind names the implementation ("docker" or "process"), for logs and metrics.
	Kind() string
	// EnsureWorker starts the org's worker unless a healthy one is already running. A
	// container whose read-only SOUL.md was replaced on the host since it started is
	// recreated, so call it after rewriting SOUL.md and before an agent starts.
	EnsureWorker(ctx context.Context, org string) (Ensured, error)
	// Exec runs cmd in the org's running worker and waits for it. A non-zero exit is a
	// status, not an error. When ctx ends first the program and everything it started
	// are killed and the error wraps ctx.Err(). ErrWorkerGone says the worker died
	// under the program; ErrNotRunning that there was no worker to run in; ErrNotStarted
	// that the program never started (nothing it would have done happened, so running
	// it again is safe).
	Exec(ctx context.Context, org string, cmd Command) (ExitStatus, error)
	// EnsureDashboard starts the org's dashboard unless one is running. A running
	// dashboard is kept as it is, whatever d says, except that it is recreated, like a
	// worker, when SOUL.md was replaced.
	EnsureDashboard(ctx context.Context, org string, d Dashboard) (Ensured, error)
	// Stop stops and removes the org's unit of the given role; stopping what is not
	// running is not an error. A container of another scope under the unit's name is
	// left alone: ErrNameTaken.
	Stop(ctx context.Context, org string, role Role) error
	// ServiceURL is where a program in org's units reaches the host service name of
	// Config.Services (a unix: URL), or "" when units share the host's network and reach
	// the services at their own addresses.
	ServiceURL(org, name string) string
	// DashboardAddr is the address org's dashboard is to serve on, as its unit sees it (a
	// unix: URL), and the URL the host reaches it at.
	DashboardAddr(org string) (listen, reach string)
	// List reports the units this host instance owns, running or not.
	List(ctx context.Context) ([]Unit, error)
	// Reap stops workers idle past Config.IdleTimeout and removes units that exited.
	Reap(ctx context.Context) (Reaped, error)
	// Close releases the runtime. Docker leaves containers running for the next start
	// to adopt; Process kills its subprocesses, which cannot be adopted.
	Close() error
}

// Role says what a unit is for.
type Role string

// The two roles a unit can have.
const (
	RoleWorker    Role = "worker"
	RoleDashboard Role = "dashboard"
)

// Command is one program run in an org's worker. Args[0] names a program (for example
// "hermes-host"): a Docker worker finds it on the image's PATH, a Process worker in
// Config.BinDir.
type Command struct {
	Args []string
	// Env holds KEY=VALUE pairs added to the program's environment: the only place a
	// secret such as a job token may go.
	Env    []string
	Stdin  io.Reader // nil means empty
	Stdout io.Writer // nil discards
	Stderr io.Writer // nil discards
}

// Dashboard is how to start an org's dashboard.
type Dashboard struct {
	Args []string // program and arguments, as in Command; never secrets
	// Secrets are KEY=VALUE lines written to the dashboard's standard input, which is then
	// closed: the dashboard reads them to EOF before serving.
	Secrets []string
	// Env holds KEY=VALUE settings added to its environment (the agent command its chat
	// runs, say); never a secret, since an engine keeps a container's environment.
	Env []string
}

// ExitStatus is how a program ended.
type ExitStatus struct {
	// Code is the exit code; a program killed by a signal has 128 plus its number.
	Code int
	// OutOfMemory says the program was killed for passing the org's memory limit.
	OutOfMemory bool
}

func (s ExitStatus) String() string {
	if s.OutOfMemory {
		return "killed: out of memory"
	}
	return fmt.Sprintf("exit %d", s.Code)
}

// Ensured is the unit an ensure left running.
type Ensured struct {
	Unit
	// Cold says the unit was started by this call rather than found running.
	Cold bool
}

// Unit is one worker or dashboard of an org.
type Unit struct {
	Org     string
	Role    Role
	Name    string // hermes-org-<org> or hermes-dash-<org>
	ID      string // container ID, or process ID
	Running bool
}

// Reaped counts what one Reap removed.
type Reaped struct {
	Idle   int // workers idle past the timeout, stopped and removed
	Exited int // units that had exited, removed
}

// Errors a caller can check with errors.Is.
var (
	ErrInvalidOrg = errors.New("invalid organization id")
	ErrNotRunning = errors.New("worker not running")
	ErrWorkerGone = errors.New("worker gone")
	ErrNotStarted = errors.New("program not started")
	ErrNoSoul     = errors.New("org home has no SOUL.md")
	// ErrNameTaken says an org's container name is held on the engine by a container of
	// another scope (or one not managed by the host), which is never removed.
	ErrNameTaken = errors.New("container name taken")
)

// ValidateOrg accepts the organization IDs that are safe as container names and path
// elements.
func ValidateOrg(org string) error {
	if !orgid.Valid(org) {
		return fmt.Errorf("%w: %q", ErrInvalidOrg, org)
	}
	return nil
}

// UnitName is the name of an org's unit of a role.
func UnitName(org string, role Role) string {
	if role == RoleDashboard {
		return "hermes-dash-" + org
	}
	return "hermes-org-" + org
}

// Limits bound what one org's unit may use; zero means unbounded.
type Limits struct {
	MemoryBytes int64 // Process enforces this by sampling resident memory
	NanoCPUs    int64 // CPU in units of 1e-9 CPUs; Docker only
	Pids        int64 // processes; Process enforces it with a pids cgroup per unit where one is writable
}

// Config is shared by both implementations; fields marked Docker only are ignored by
// Process.
type Config struct {
	// Instance identifies this host on the engine; it should survive restarts so that a
	// restarted host adopts its own containers. Containers of the same Scope labelled
	// with another instance are taken as left by a dead one and removed.
	Instance string
	// Scope sets apart runtimes that share an engine but must never remove each other's
	// containers, such as a test suite beside a real host (Docker only); default
	// "hermes". Container names are still one per org on an engine: an ensure that finds
	// the name held by another scope fails with ErrNameTaken.
	Scope string
	// OrgsRoot holds one HERMES_HOME per org, <OrgsRoot>/<org>, each with a SOUL.md.
	OrgsRoot string
	// WorkspacesRoot holds each org's job workspaces, <WorkspacesRoot>/<org>, created on
	// demand.
	WorkspacesRoot string
	// WorkerIdle is the worker's long-lived main process, program name first (for the
	// product: hermes-host worker idle). Jobs run beside it.
	WorkerIdle []string
	Limits     Limits
	// IdleTimeout is how long a worker may go without an exec before Reap stops it;
	// zero keeps idle workers.
	IdleTimeout time.Duration

	// WorkerImage and DashboardImage are image references (Docker only).
	WorkerImage    string
	DashboardImage string
	// Network is NetworkIsolated (the default) or NetworkHost: see them.
	Network string
	// Services are what an isolated unit may use of the host, by name (gateway, control,
	// api): each is served on <RunRoot>/units/<org>/<name>.sock, which the org's units see
	// under unitnet.Dir; ServiceURL names it. Units on the host's network get none and
	// reach the services at their own addresses.
	Services map[string]http.Handler
	// RunRoot holds those sockets and each org's dashboard socket folder,
	// <RunRoot>/dashboards/<org>; default <parent of OrgsRoot>/run.
	RunRoot string
	// HomeMount is where the org's home appears inside a container (Docker only);
	// default /home/hermes. Workspaces appear at WorkspacesMount, default /workspaces.
	HomeMount       string
	WorkspacesMount string
	// User is the uid:gid an org's programs run as. Docker takes DefaultUser (10001:10001)
	// when it is empty, never the host's own uid, and gives the home and workspaces to it;
	// elsewhere empty means the host process's own.
	User string
	// Users, when set, gives each org a uid:gid of its own (the dispatcher's allocator,
	// dispatch.UnitUsers), which its units run as instead of User: an agent that got out
	// of its unit still finds no other org's files its own. Docker always takes it; Process
	// where it drops to another uid (a sandbox started by root).
	Users Users

	// InstanceLive says whether a dispatcher of that instance runs now (Docker only): the
	// containers of a live instance are never removed as a dead one's. Nil takes every
	// other instance for dead.
	InstanceLive func(ctx context.Context, instance string) (bool, error)

	// BinDir is where Process finds the programs that commands name.
	BinDir string
	// Sandbox is how Process confines each org's programs (Process only); the zero
	// value uses bubblewrap where it works and says loudly where it does not.
	Sandbox Sandbox
	// Output receives what Process workers and dashboards print outside an exec;
	// default os.Stderr. Docker containers' output goes to the engine's logs (docker logs),
	// and to Output as well with FollowLogs.
	Output io.Writer
	// FollowLogs copies the output of the Docker containers this runtime starts or adopts
	// to Output while they run (dev, whose terminal shows every unit's lines); without it
	// the engine's logging driver alone keeps them, as production wants.
	FollowLogs bool

	Logger  *slog.Logger // default slog.Default()
	Metrics *Metrics     // default unregistered metrics
	Now     func() time.Time
}

func (c Config) withDefaults() (Config, error) {
	if c.Instance == "" {
		return c, errors.New("runtime config: Instance is required")
	}
	if !labelValuePattern.MatchString(c.Instance) {
		return c, fmt.Errorf("runtime config: Instance %q must match %s", c.Instance, labelValuePattern)
	}
	if c.OrgsRoot == "" || c.WorkspacesRoot == "" {
		return c, errors.New("runtime config: OrgsRoot and WorkspacesRoot are required")
	}
	var err error
	if c.OrgsRoot, err = filepath.Abs(c.OrgsRoot); err != nil {
		return c, fmt.Errorf("runtime config: OrgsRoot: %w", err)
	}
	if c.WorkspacesRoot, err = filepath.Abs(c.WorkspacesRoot); err != nil {
		return c, fmt.Errorf("runtime config: WorkspacesRoot: %w", err)
	}
	if c.RunRoot == "" {
		c.RunRoot = filepath.Join(filepath.Dir(c.OrgsRoot), "run")
	}
	if c.RunRoot, err = filepath.Abs(c.RunRoot); err != nil {
		return c, fmt.Errorf("runtime config: RunRoot: %w", err)
	}
	if c.Scope == "" {
		c.Scope = "hermes"
	}
	if !labelValuePattern.MatchString(c.Scope) {
		return c, fmt.Errorf("runtime config: Scope %q must match %s", c.Scope, labelValuePattern)
	}
	if len(c.WorkerIdle) == 0 {
		return c, errors.New("runtime config: WorkerIdle is required")
	}
	if c.HomeMount == "" {
		c.HomeMount = "/home/hermes"
	}
	if c.WorkspacesMount == "" {
		c.WorkspacesMount = "/workspaces"
	}
	if c.User == "" {
		c.User = fmt.Sprintf("%d:%d", os.Getuid(), os.Getgid())
	}
	if c.Output == nil {
		c.Output = os.Stderr
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}

var labelValuePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// orgDirs are an org's home and workspaces on the host, after checking that the home
// exists and holds the SOUL.md that will be mounted read-only over it.
type orgDirs struct {
	home, workspaces string
	soul             os.FileInfo
}

func (c Config) dirs(org string) orgDirs {
	return orgDirs{
		home:       filepath.Join(c.OrgsRoot, org),
		workspaces: filepath.Join(c.WorkspacesRoot, org),
	}
}

func (c Config) prepareOrg(org string) (orgDirs, error) {
	if err := ValidateOrg(org); err != nil {
		return orgDirs{}, err
	}
	d := c.dirs(org)
	soul, err := os.Stat(filepath.Join(d.home, "SOUL.md"))
	if errors.Is(err, os.ErrNotExist) {
		return orgDirs{}, fmt.Errorf("%w: %s", ErrNoSoul, d.home)
	}
	if err != nil {
		return orgDirs{}, fmt.Errorf("org %s: %w", org, err)
	}
	d.soul = soul
	if err := os.MkdirAll(d.workspaces, 0o700); err != nil {
		return orgDirs{}, fmt.Errorf("org %s workspaces: %w", org, err)
	}
	return d, nil
}

// unitLocks serialises ensures and stops of one unit while letting different units
// proceed at once.
type unitLocks struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// lock takes the unit's lock and returns its release.
func (l *unitLocks) lock(name string) func() {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = make(map[string]*sync.Mutex)
	}
	m, ok := l.locks[name]
	if !ok {
		m = new(sync.Mutex)
		l.locks[name] = m
	}
	l.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// recordExec logs and counts an ended exec, and gives the caller its result.
func recordExec(log *slog.Logger, m *Metrics, kind, unit string, cmd Command, took time.Duration,
	status ExitStatus, outcome string, err error) (ExitStatus, error) {
	m.execEnded(kind, status, outcome)
	attrs := []any{"unit", unit, "program", cmd.Args[0], "outcome", outcome, "duration", took}
	if err != nil {
		log.Warn("exec ended", append(attrs, "error", err)...)
		return ExitStatus{}, fmt.Errorf("exec %s in %s: %w", cmd.Args[0], unit, err)
	}
	log.Info("exec ended", append(attrs, "status", status.String())...)
	return status, nil
}

// Users gives each org a uid:gid of its own (Config.Users).
type Users interface {
	UserOf(ctx context.Context, org string) (uid, gid int, err error)
}

// userOf is the uid:gid org's programs run as: its own from Users, or User for every org.
// Neither root nor the workers' keeper is ever an org's own.
func (c Config) userOf(ctx context.Context, org string) (string, error) {
	if c.Users == nil {
		return c.User, nil
	}
	uid, gid, err := c.Users.UserOf(ctx, org)
	if err != nil {
		return "", fmt.Errorf("org %s: its uid: %w", org, err)
	}
	kuid, _, _ := parseUser(keeperUser)
	if uid <= 0 || gid <= 0 || uid == kuid {
		return "", fmt.Errorf("org %s: uid:gid %d:%d is root's or the workers' keeper's, never an org's", org, uid, gid)
	}
	return fmt.Sprintf("%d:%d", uid, gid), nil
}
