package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"hermeshost/internal/unitnet"
)

// Labels on every container Docker manages. The SOUL label records the inode that the
// container's read-only SOUL.md bind was made from: when the host replaces SOUL.md by
// rename, the kernel detaches that bind in the container (leaving the home's writable file
// in its place), so the container must be recreated before an agent runs in it again.
const (
	LabelManaged  = "hermes.managed"
	LabelScope    = "hermes.scope"
	LabelOrg      = "hermes.org"
	LabelRole     = "hermes.role"
	LabelInstance = "hermes.instance"
	labelSoul     = "hermes.soul"
	// labelUser is the uid:gid the unit's programs run as (its execs, or a dashboard).
	labelUser = "hermes.user"
)

// oomEventWait bounds how long an exec killed by SIGKILL waits for the engine to say
// whether the kernel's OOM killer did it.
const oomEventWait = 2 * time.Second

// oomAfterExit is how long an oom event may still come after the exec's exec_die: the
// engine learns of the two from separate notices (the cgroup's memory events, the
// process's exit) and passes them on in whichever order they arrive (CI saw an OOM kill
// reported as a plain exit 137).
const oomAfterExit = 500 * time.Millisecond

// goneWait bounds how long an exec ended by a signal waits to learn whether its container
// is dying too; only a program killed alone, with its container alive, waits it out.
const goneWait = 2 * time.Second

// engineCleanupTimeout bounds removals done after the caller's context ended.
const engineCleanupTimeout = 30 * time.Second

// sweepTimeout bounds one sweep of a worker, the engine's round trip included; the sweep
// program itself gives up after 5s, so the rest is the engine's. An engine that slow is
// overloaded, not the worker unsound: removing the worker and starting another costs it
// more than the sweep (the Docker scale run, at a load average near 300, saw an exec take
// 10 s at the median and 100 s at p99, and with a 15 s bound removed a worker in one job
// of five).
const sweepTimeout = time.Minute

// ensureTimeout bounds one ensure's calls to the engine (inspect, create, start): an engine
// that hangs on a container (dockerd 20.10 held 42 container starts, and every inspect of
// those containers, for good in a scale run at a load average of 400) fails the ensure, so
// the job is released and the org's unit lock freed, instead of holding the org for ever.
const ensureTimeout = 3 * time.Minute

// errEngineHung is why an ensure ended at its bound.
var errEngineHung = errors.New("the engine did not answer")

// A sweep the engine could not start (ErrNotStarted) is tried again, sweepTries times in
// all, sweepRetryPause apart, within sweepTimeout, before the worker is given up.
const (
	sweepTries      = 3
	sweepRetryPause = time.Second
)

// Docker runs each org's worker and dashboard as labelled containers on a Docker engine.
type Docker struct {
	cfg          Config
	sweepCmd     []string      // kills what execs left in a worker (see sweep)
	sweepTimeout time.Duration // sweepTimeout; tests shorten it
	sweepPause   time.Duration // sweepRetryPause; tests shorten it
	// ensureTimeout is ensureTimeout; tests shorten it.
	ensureTimeout time.Duration
	cli           *client.Client
	log           *slog.Logger
	locks         unitLocks
	net           netPlan
	// images are the IDs the configured images had when the runtime started, by role: a
	// unit of another image (an adopted one, from before an upgrade) is replaced when next
	// ensured.
	images map[Role]string

	mu    sync.Mutex
	units map[string]*dockerUnit // by container name: what this process knows it runs

	// followed are the containers whose logs are being copied to Output (FollowLogs), by
	// ID; stopFollowing ends every copy (Close).
	followed      map[string]bool
	following     context.Context
	stopFollowing context.CancelFunc
	followers     sync.WaitGroup
}

type dockerUnit struct {
	id       string
	user     string    // the uid:gid its execs run as (labelUser)
	inFlight int       // execs running now
	lastUsed time.Time // last ensure, or end of the last exec
	// countedAt is when the engine was last asked for its task count (nothingLeft); only
	// the sweep under way touches it.
	countedAt time.Time
	// dirty says the container was not started by this process (adopted, or found
	// running): what an earlier exec left in it is swept before the next exec runs.
	dirty bool
	// sweeping is closed when the sweep under way ends; nil when none is. Execs wait for
	// it before they start.
	sweeping chan struct{}
}

// NewDocker connects to the engine named by the DOCKER_* environment, checks that the
// configured images exist, then takes over the containers of its scope: it adopts this
// instance's running ones and removes those of other instances and those that exited.
func NewDocker(ctx context.Context, cfg Config) (*Docker, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	d, err := newDocker(ctx, cfg, cli)
	if err != nil {
		cli.Close()
		return nil, err
	}
	return d, nil
}

func newDocker(ctx context.Context, cfg Config, cli *client.Client) (*Docker, error) {
	if cfg.User == "" {
		cfg.User = DefaultUser // never the host's own uid, which may well be root
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.WorkerImage == "" || cfg.DashboardImage == "" {
		return nil, errors.New("runtime config: WorkerImage and DashboardImage are required for docker")
	}
	uid, _, err := parseUser(cfg.User)
	if err != nil {
		return nil, err
	}
	if kuid, _, _ := parseUser(keeperUser); uid == kuid {
		return nil, fmt.Errorf("runtime config: User %q: uid %d is the worker's keeper's, whose processes execs must not reach", cfg.User, kuid)
	}
	if _, err := cli.Ping(ctx); err != nil {
		return nil, fmt.Errorf("docker engine at %s: %w", cli.DaemonHost(), err)
	}
	images := map[Role]string{}
	for role, image := range map[Role]string{RoleWorker: cfg.WorkerImage, RoleDashboard: cfg.DashboardImage} {
		info, err := cli.ImageInspect(ctx, image)
		if err != nil {
			return nil, fmt.Errorf("image %s on %s: %w", image, cli.DaemonHost(), err)
		}
		images[role] = info.ID
	}
	plan, err := cfg.netPlan()
	if err != nil {
		return nil, err
	}
	d := &Docker{
		net:      plan,
		images:   images,
		followed: map[string]bool{},
		// The sweep is the worker's own program: WorkerIdle with its last argument, idle,
		// replaced (hermes-host worker sweep).
		sweepCmd:      append(append([]string(nil), cfg.WorkerIdle[:len(cfg.WorkerIdle)-1]...), "sweep"),
		sweepTimeout:  sweepTimeout,
		sweepPause:    sweepRetryPause,
		ensureTimeout: ensureTimeout,
		cfg:           cfg,
		cli:           cli,
		log:           cfg.Logger.With("runtime", "docker"),
		units:         make(map[string]*dockerUnit),
	}
	d.following, d.stopFollowing = context.WithCancel(context.Background())
	if err := d.ensureNetwork(ctx); err != nil {
		d.stopFollowing()
		plan.close()
		return nil, err
	}
	if err := d.adopt(ctx); err != nil {
		d.stopFollowing()
		plan.close()
		return nil, err
	}
	return d, nil
}

// Kind implements Runtime.
func (d *Docker) Kind() string { return "docker" }

// Close stops serving the units' sockets, releases the engine connection and leaves
// containers running for adoption (the next start serves their sockets again).
func (d *Docker) Close() error {
	d.net.close()
	d.stopFollowing()
	d.followers.Wait()
	return d.cli.Close()
}

// follow copies the output of container id (named name) to Output until it stops or the
// runtime closes, once per container, when FollowLogs is set.
func (d *Docker) follow(id, name string) {
	if !d.cfg.FollowLogs {
		return
	}
	d.mu.Lock()
	if d.followed[id] || d.following.Err() != nil {
		d.mu.Unlock()
		return
	}
	d.followed[id] = true
	d.followers.Add(1)
	d.mu.Unlock()
	go func() {
		defer d.followers.Done()
		defer func() {
			d.mu.Lock()
			delete(d.followed, id)
			d.mu.Unlock()
		}()
		// From now on: an adopted container's earlier lines were shown by whoever ran it.
		r, err := d.cli.ContainerLogs(d.following, id, container.LogsOptions{ShowStdout: true, ShowStderr: true, Follow: true,
			Since: strconv.FormatInt(d.cfg.Now().Unix(), 10)})
		if err != nil {
			if d.following.Err() == nil {
				d.log.Warn("follow a container's output", "container", name, "err", err)
			}
			return
		}
		defer r.Close()
		_, _ = stdcopy.StdCopy(d.cfg.Output, d.cfg.Output, r)
	}()
}

// ServiceURL implements Runtime.
func (d *Docker) ServiceURL(org, name string) string { return d.net.serviceURL(unitnet.Dir, name) }

// DashboardAddr implements Runtime.
func (d *Docker) DashboardAddr(org string) (string, string) {
	return unitnet.URL(path.Join(unitnet.DashboardDir, dashboardSocket)),
		unitnet.URL(filepath.Join(d.cfg.RunRoot, runDashboards, org, dashboardSocket))
}

func (d *Docker) managedFilter(onlyOurs bool) filters.Args {
	f := filters.NewArgs(
		filters.Arg("label", LabelManaged+"=true"),
		filters.Arg("label", LabelScope+"="+d.cfg.Scope),
	)
	if onlyOurs {
		f.Add("label", LabelInstance+"="+d.cfg.Instance)
	}
	return f
}

func (d *Docker) adopt(ctx context.Context) error {
	list, err := d.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: d.managedFilter(false)})
	if err != nil {
		return fmt.Errorf("list managed containers: %w", err)
	}
	now := d.cfg.Now()
	var adopted, stale, exited int
	for _, c := range list {
		name := containerName(c.Names)
		org, role := c.Labels[LabelOrg], Role(c.Labels[LabelRole])
		reason := ""
		switch {
		case c.Labels[LabelInstance] != d.cfg.Instance:
			reason = "stale"
		case ValidateOrg(org) != nil || name != UnitName(org, role):
			reason = "stale"
		case c.State != container.StateRunning:
			reason = "exited"
		}
		if reason == "" {
			d.units[name] = &dockerUnit{id: c.ID, user: d.unitUser(c.Labels), lastUsed: now, dirty: true}
			adopted++
			d.log.Info("container adopted", "container", name, "id", shortID(c.ID))
			continue
		}
		if c.Labels[LabelInstance] != d.cfg.Instance {
			busy, err := d.inUse(ctx, c.ID, c.Labels[LabelInstance])
			if err != nil {
				return err
			}
			if busy != "" {
				d.log.Info("container of another instance left alone", "container", name, "id", shortID(c.ID),
					"instance", c.Labels[LabelInstance], "why", busy)
				continue
			}
		}
		if err := d.remove(ctx, c.ID); err != nil {
			return err
		}
		d.log.Info("container removed", "container", name, "id", shortID(c.ID), "reason", reason,
			"instance", c.Labels[LabelInstance], "state", c.State)
		if reason == "stale" {
			stale++
		} else {
			exited++
		}
	}
	d.cfg.Metrics.reapedUnits(d.Kind(), "stale", stale)
	d.cfg.Metrics.reapedUnits(d.Kind(), "exited", exited)
	d.log.Info("containers taken over", "instance", d.cfg.Instance, "adopted", adopted,
		"removed_stale", stale, "removed_exited", exited)
	return nil
}

// EnsureWorker implements Runtime.
func (d *Docker) EnsureWorker(ctx context.Context, org string) (Ensured, error) {
	return d.ensure(ctx, org, RoleWorker, d.cfg.WorkerIdle, nil, nil)
}

// EnsureDashboard implements Runtime.
func (d *Docker) EnsureDashboard(ctx context.Context, org string, dash Dashboard) (Ensured, error) {
	if len(dash.Args) == 0 {
		return Ensured{}, errors.New("ensure dashboard: no command")
	}
	return d.ensure(ctx, org, RoleDashboard, dash.Args, dash.Secrets, dash.Env)
}

func (d *Docker) ensure(ctx context.Context, org string, role Role, cmd, secrets, env []string) (Ensured, error) {
	dirs, err := d.cfg.prepareOrg(org)
	if err != nil {
		return Ensured{}, err
	}
	name := UnitName(org, role)
	defer d.locks.lock(name)()
	bounded, cancel := context.WithTimeoutCause(ctx, d.ensureTimeout, fmt.Errorf("%w within %s", errEngineHung, d.ensureTimeout))
	defer cancel()
	ensured, err := d.ensureLocked(bounded, org, name, role, dirs, cmd, secrets, env)
	if err != nil && errors.Is(context.Cause(bounded), errEngineHung) {
		err = fmt.Errorf("ensure %s: %w (%w)", name, context.Cause(bounded), err)
	}
	return ensured, err
}

func (d *Docker) ensureLocked(ctx context.Context, org, name string, role Role, dirs orgDirs, cmd, secrets, env []string) (Ensured, error) {
	unit := Unit{Org: org, Role: role, Name: name, Running: true}
	user, err := d.cfg.userOf(ctx, org)
	if err != nil {
		return Ensured{}, err
	}
	id, err := d.running(ctx, name, role, dirs, user)
	if err != nil {
		return Ensured{}, err
	}
	if id != "" {
		// A unit found running (adopted after a restart, say) still needs this process to
		// serve its sockets: the last one's went with it.
		uid, gid, _ := parseUser(user)
		if _, _, err := d.net.ensure(org, uid, gid); err != nil {
			return Ensured{}, err
		}
		unit.ID = id
		d.follow(id, name)
		d.cfg.Metrics.ensured(d.Kind(), role, false)
		return Ensured{Unit: unit}, nil
	}
	id, err = d.start(ctx, name, org, role, dirs, user, cmd, secrets, env)
	if err != nil {
		return Ensured{}, err
	}
	unit.ID = id
	d.follow(id, name)
	d.mu.Lock()
	d.units[name] = &dockerUnit{id: id, user: user, lastUsed: d.cfg.Now()}
	d.mu.Unlock()
	d.cfg.Metrics.ensured(d.Kind(), role, true)
	d.log.Info("container started", "container", name, "id", shortID(id), "org", org, "role", role)
	return Ensured{Unit: unit, Cold: true}, nil
}

// running returns the ID of the named container when it is running, is this instance's,
// binds the current SOUL.md and runs the role's current image; any other container of
// that name in this scope is removed, and one of another scope is left alone and reported
// as ErrNameTaken.
func (d *Docker) running(ctx context.Context, name string, role Role, dirs orgDirs, user string) (string, error) {
	info, err := d.cli.ContainerInspect(ctx, name)
	if cerrdefs.IsNotFound(err) {
		d.forget(name, "")
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("inspect container %s: %w", name, err)
	}
	labels := info.Config.Labels
	if labels[LabelManaged] != "true" || labels[LabelScope] != d.cfg.Scope {
		// Another scope's (or nobody's) container: never ours to remove, running or not.
		return "", fmt.Errorf("container %s: %w by scope %q (managed %q)", name, ErrNameTaken,
			labels[LabelScope], labels[LabelManaged])
	}
	reason := ""
	switch {
	case info.State == nil || !info.State.Running:
		reason = "not running"
	case labels[LabelInstance] != d.cfg.Instance:
		reason = "owned by instance " + strconv.Quote(labels[LabelInstance])
	case labels[labelSoul] != fileIdentity(dirs.soul):
		reason = "SOUL.md replaced"
	case d.unitUser(labels) != user:
		// The org's uid changed (per-org uids turned on, say): its files go to the new one.
		reason = "runs as " + d.unitUser(labels) + ", not the org's " + user
	case info.Image != d.images[role]:
		// Started from an image the host has since replaced (an upgrade): the unit runs
		// the old programs until it is made again.
		reason = "image " + shortID(strings.TrimPrefix(info.Image, "sha256:")) + " is not the current " + shortID(strings.TrimPrefix(d.images[role], "sha256:"))
	case info.HostConfig == nil || string(info.HostConfig.NetworkMode) != d.networkMode():
		// Started by a host of other settings (or before units left the host's network).
		reason = "not on network " + d.networkMode()
	}
	if reason == "" {
		d.mu.Lock()
		u := d.units[name]
		if u == nil || u.id != info.ID {
			u = &dockerUnit{id: info.ID, user: user, dirty: true}
			d.units[name] = u
		}
		u.lastUsed = d.cfg.Now()
		d.mu.Unlock()
		return info.ID, nil
	}
	if labels[LabelInstance] != d.cfg.Instance {
		busy, err := d.inUse(ctx, info.ID, labels[LabelInstance])
		if err != nil {
			return "", err
		}
		if busy != "" {
			return "", fmt.Errorf("container %s: %w: %s", name, ErrNameTaken, busy)
		}
	}
	d.log.Info("container replaced", "container", name, "id", shortID(info.ID), "reason", reason)
	d.forget(name, "")
	return "", d.remove(ctx, info.ID)
}

// inUse says why a container of another instance must be left alone, or "" when it may be
// removed as a dead instance's: its instance runs (Config.InstanceLive: its dispatcher holds
// the instance's lease), or an exec runs in it now. An instance whose liveness cannot be
// told is taken as live: a container left behind costs less than one removed under a job.
func (d *Docker) inUse(ctx context.Context, id, instance string) (string, error) {
	if d.cfg.InstanceLive != nil {
		live, err := d.cfg.InstanceLive(ctx, instance)
		if err != nil {
			d.log.Warn("cannot tell whether instance runs; its container is left alone", "instance", instance, "err", err)
			return "its instance " + strconv.Quote(instance) + " may be running", nil
		}
		if live {
			return "its instance " + strconv.Quote(instance) + " is running", nil
		}
	}
	busy, err := d.execRunning(ctx, id)
	if err != nil || !busy {
		return "", err
	}
	return "an exec is running in it", nil
}

func (d *Docker) start(ctx context.Context, name, org string, role Role, dirs orgDirs, user string, cmd, secrets, env []string) (string, error) {
	// The home and workspaces are the unit user's: the programs run as it, and whatever
	// the host wrote there since the last start (SOUL.md, replaced by the dispatcher,
	// forces one) becomes theirs to read.
	uid, gid, _ := parseUser(user)
	sockets, dashDir, err := d.net.ensure(org, uid, gid)
	if err != nil {
		return "", err
	}
	for _, dir := range []string{dirs.home, dirs.workspaces} {
		n, err := chownTree(dir, uid, gid)
		if err != nil {
			return "", fmt.Errorf("org %s: %w", org, err)
		}
		if n > 0 {
			d.log.Info("org files given to the units' user", "dir", dir, "user", user, "entries", n)
		}
	}
	labels := map[string]string{
		LabelManaged:  "true",
		LabelScope:    d.cfg.Scope,
		LabelOrg:      org,
		LabelRole:     string(role),
		LabelInstance: d.cfg.Instance,
		labelSoul:     fileIdentity(dirs.soul),
		labelUser:     user,
	}
	config := &container.Config{
		Image:      d.cfg.WorkerImage,
		Cmd:        cmd,
		User:       user,
		WorkingDir: d.cfg.HomeMount,
		Env: []string{
			"HOME=" + d.cfg.HomeMount,
			"HERMES_HOME=" + d.cfg.HomeMount,
			"HERMES_WORKSPACES=" + d.cfg.WorkspacesMount,
			"HERMES_ORG=" + org,
		},
		Labels: labels,
	}
	config.Env = append(config.Env, env...)
	if role == RoleWorker {
		// The init and the idle main process run as the keeper, outside the reach of
		// the execs' uid; they need nothing of the home, so start them at the root.
		config.User, config.WorkingDir = keeperUser, "/"
	}
	if role == RoleDashboard {
		config.Image = d.cfg.DashboardImage
		// Secrets arrive on stdin, which closes after them: nothing stored by the engine
		// (config, inspect, files) ever holds them.
		config.OpenStdin, config.StdinOnce, config.AttachStdin = true, true, true
	}
	host := &container.HostConfig{
		NetworkMode: container.NetworkMode(d.networkMode()),
		Mounts: []mount.Mount{
			{Type: mount.TypeBind, Source: dirs.home, Target: d.cfg.HomeMount},
			{Type: mount.TypeBind, Source: dirs.workspaces, Target: d.cfg.WorkspacesMount},
			{Type: mount.TypeBind, Source: filepath.Join(dirs.home, "SOUL.md"),
				Target: path.Join(d.cfg.HomeMount, "SOUL.md"), ReadOnly: true},
		},
		Resources: container.Resources{
			Memory:   d.cfg.Limits.MemoryBytes,
			NanoCPUs: d.cfg.Limits.NanoCPUs,
		},
		// An init as PID 1 reaps what jobs leave orphaned, so the image's idle entry
		// point need not.
		Init:           ptr(true),
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges"},
		ReadonlyRootfs: true,
		Tmpfs:          map[string]string{"/tmp": "rw,nosuid,nodev,size=256m"},
	}
	if sockets != "" {
		// The host services the org may use, as sockets; the folder, not the sockets, so
		// that a host restarted serves them anew in place.
		host.Mounts = append(host.Mounts, mount.Mount{Type: mount.TypeBind, Source: sockets, Target: unitnet.Dir, ReadOnly: true})
	}
	if role == RoleDashboard {
		host.Mounts = append(host.Mounts, mount.Mount{Type: mount.TypeBind, Source: dashDir, Target: unitnet.DashboardDir})
	}
	if d.cfg.Limits.MemoryBytes > 0 {
		host.MemorySwap = d.cfg.Limits.MemoryBytes // no swap beyond the limit
	}
	if d.cfg.Limits.Pids > 0 {
		host.PidsLimit = ptr(d.cfg.Limits.Pids)
	}
	created, err := d.cli.ContainerCreate(ctx, config, host, nil, nil, name)
	for try := 0; cerrdefs.IsConflict(err) && try < 20; try++ {
		// The name is taken by a container running() did not see: a create an earlier
		// ensure gave up on (ensureTimeout), which the engine goes on with (the name is
		// taken before the container can be inspected). Once it can be, it is looked at,
		// and removed, like any other; then the create is tried again.
		if id, rerr := d.running(ctx, name, role, dirs, user); rerr != nil || id != "" {
			return "", fmt.Errorf("create container %s: %w (and then: %v, %q)", name, err, rerr, id)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("create container %s: %w", name, context.Cause(ctx))
		case <-time.After(250 * time.Millisecond):
		}
		created, err = d.cli.ContainerCreate(ctx, config, host, nil, nil, name)
	}
	if err != nil {
		return "", fmt.Errorf("create container %s: %w", name, err)
	}
	if err := d.startCreated(ctx, name, created.ID, secrets, role == RoleDashboard); err != nil {
		return "", errors.Join(err, d.remove(context.WithoutCancel(ctx), created.ID))
	}
	return created.ID, nil
}

func (d *Docker) startCreated(ctx context.Context, name, id string, secrets []string, withStdin bool) error {
	if !withStdin {
		if err := d.cli.ContainerStart(ctx, id, container.StartOptions{}); err != nil {
			return fmt.Errorf("start container %s: %w", name, err)
		}
		return nil
	}
	hj, err := d.cli.ContainerAttach(ctx, id, container.AttachOptions{Stream: true, Stdin: true})
	if err != nil {
		return fmt.Errorf("attach to container %s: %w", name, err)
	}
	defer hj.Close()
	if err := d.cli.ContainerStart(ctx, id, container.StartOptions{}); err != nil {
		return fmt.Errorf("start container %s: %w", name, err)
	}
	if _, err := io.WriteString(hj.Conn, secretLines(secrets)); err != nil {
		return fmt.Errorf("write secrets to container %s: %w", name, err)
	}
	if err := hj.CloseWrite(); err != nil {
		return fmt.Errorf("close stdin of container %s: %w", name, err)
	}
	return nil
}

// Exec implements Runtime. Docker cannot kill one exec, so a cancelled exec takes the
// whole worker container with it; the next EnsureWorker starts a fresh one. An exec that
// ends is followed by a sweep of what it left (see sweep). ExitStatus.OutOfMemory is also
// set for a program that failed after the kernel killed a process it started for passing
// the memory limit (a worker whose agent was killed).
func (d *Docker) Exec(ctx context.Context, org string, cmd Command) (ExitStatus, error) {
	if err := ValidateOrg(org); err != nil {
		return ExitStatus{}, err
	}
	if len(cmd.Args) == 0 {
		return ExitStatus{}, errors.New("exec: no command")
	}
	name := UnitName(org, RoleWorker)
	u, err := d.enter(ctx, name)
	if err != nil {
		return ExitStatus{}, fmt.Errorf("exec %s in %s: %w", cmd.Args[0], name, err)
	}
	if u == nil {
		return ExitStatus{}, fmt.Errorf("exec %s in %s: %w", cmd.Args[0], name, ErrNotRunning)
	}

	began := d.cfg.Now()
	status, outcome, err := d.exec(ctx, name, u, cmd)
	took := d.cfg.Now().Sub(began)
	d.leave(ctx, name, u)
	return recordExec(d.log, d.cfg.Metrics, d.Kind(), name, cmd, took, status, outcome, err)
}

// A job's processes end with it. Docker can neither kill one exec nor everything an exec
// started (a process the agent detached with setsid leaves the exec's session and
// process group and is re-parented to the container's init), so after every exec the
// runtime makes sure nothing is left in the worker. It first asks the engine for the
// container's processes (nothingLeft): when none runs as the units' user, which is the
// usual end of a job, that is all. Otherwise it sweeps the worker: it runs the worker's
// sweep (hermes-host worker sweep) as the units' user, which sends kill(-1, SIGKILL) inside the container's pid namespace and waits until
// every other process of that uid is gone. The container's init and main process run as
// another uid (keeperUser) and survive it: the worker stays warm. kill(-1) is one atomic
// pass of the kernel, so even a fork bomb ends in one call. A sweep that fails (it cannot
// start in a container whose pids limit a fork bomb holds, say; one the engine could not
// start is tried again first) removes the container instead: the next ensure starts a fresh one. The sweep runs when the last exec in
// flight ends, and before the first exec in a container this process did not start (one
// adopted from an earlier dispatcher, which may have died before it could sweep); execs
// wait while it runs. A cancelled exec needs none: it removes the container.

// enter counts an exec in on its unit once no sweep runs there, sweeping first a dirty
// unit; nil when the org has no worker.
func (d *Docker) enter(ctx context.Context, name string) (*dockerUnit, error) {
	d.mu.Lock()
	for {
		u := d.units[name]
		switch {
		case u == nil:
			d.mu.Unlock()
			return nil, nil
		case u.sweeping != nil:
			wait := u.sweeping
			d.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			d.mu.Lock()
		case u.dirty && u.inFlight == 0:
			u.dirty = false
			u.sweeping = make(chan struct{})
			d.mu.Unlock()
			d.sweep(ctx, name, u)
			d.mu.Lock()
		default:
			u.inFlight++
			d.mu.Unlock()
			return u, nil
		}
	}
}

// leave counts an exec out and sweeps the unit when it was the last one in flight.
func (d *Docker) leave(ctx context.Context, name string, u *dockerUnit) {
	d.mu.Lock()
	u.inFlight--
	u.lastUsed = d.cfg.Now()
	last := u.inFlight == 0 && u.sweeping == nil && d.units[name] == u
	if last {
		u.sweeping = make(chan struct{})
	}
	d.mu.Unlock()
	if last {
		d.sweep(ctx, name, u)
	}
}

// sweep kills what execs left in u's container, or removes the container when that
// fails, then lets waiting execs go. It outlives ctx's end: a job's processes end even
// when the dispatcher stops.
func (d *Docker) sweep(ctx context.Context, name string, u *dockerUnit) {
	defer func() {
		d.mu.Lock()
		close(u.sweeping)
		u.sweeping = nil
		d.mu.Unlock()
	}()
	if d.nothingLeft(ctx, name, u) {
		d.cfg.Metrics.nothingLeft(d.Kind())
		return
	}
	d.killLeft(ctx, name, u)
}

// killLeft runs the worker's sweep in u's container, or removes the container when that
// fails.
func (d *Docker) killLeft(ctx context.Context, name string, u *dockerUnit) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.sweepTimeout)
	defer cancel()
	began := time.Now()
	var out, errOut strings.Builder
	var status ExitStatus
	var err error
	for try := 1; ; try++ {
		out.Reset()
		errOut.Reset()
		status, _, err = d.exec(sctx, name, u, Command{Args: d.sweepCmd, Stdout: &out, Stderr: &errOut})
		if !errors.Is(err, ErrNotStarted) || try == sweepTries {
			break
		}
		d.log.Warn("worker sweep did not start: trying again", "container", name, "try", try, "error", err)
		pause := time.NewTimer(d.sweepPause)
		select {
		case <-pause.C:
			continue
		case <-sctx.Done():
			pause.Stop()
		}
		break
	}
	var killed int
	if err == nil && status.Code == 0 {
		if _, serr := fmt.Sscanf(out.String(), "swept %d", &killed); serr != nil {
			err = fmt.Errorf("sweep printed %q: %w", out.String(), serr)
		}
	} else if err == nil {
		err = fmt.Errorf("sweep %s: %s", status, strings.TrimSpace(errOut.String()))
	}
	if err == nil {
		d.cfg.Metrics.swept(d.Kind(), killed, true)
		if killed > 0 {
			d.log.Info("processes left by an exec killed", "container", name, "killed", killed, "took", time.Since(began))
		}
		return
	}
	d.cfg.Metrics.swept(d.Kind(), 0, false)
	d.forget(name, u.id)
	// A context of its own: a sweep that timed out has spent sctx.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), engineCleanupTimeout)
	defer rcancel()
	if rerr := d.remove(rctx, u.id); rerr != nil {
		err = errors.Join(err, rerr)
	}
	d.log.Warn("worker sweep failed: container removed", "container", name, "id", shortID(u.id), "error", err)
}

// topTimeout bounds the engine's list and count of a worker's processes before a sweep;
// past it the sweep runs.
const topTimeout = 15 * time.Second

// statsInterval is how often the engine answers a container's one-shot stats at once:
// dockerd (20.10) answers in milliseconds, but a second ask within the second waits for
// its next tick (measured: 6 ms, then up to 1 s). An exec that ends sooner than that
// after the last count is swept instead, which costs less than the wait.
const statsInterval = 1100 * time.Millisecond

// nothingLeft says whether nothing an exec started is left in u's container, from the
// engine alone: then the sweep, an exec of its own (runc's heaviest call: the scale run on
// Docker spent half its execs on sweeps), is not needed. Two readings of the container's
// cgroup, which nothing in the container can hide from or forge, must agree:
//   - the engine's list of its processes (docker top: the cgroup's pids, then ps on the
//     engine's host) holds none of the units' uid;
//   - the cgroup's count of tasks (pids.current, read after the list) is no more than the
//     threads of the listed processes. A process that keeps changing pid (each generation
//     starting the next and exiting) can fall between the list's two steps, but it is
//     always one task at least, so it shows in the count. The keeper's own processes
//     only ever gain threads, which errs toward a sweep.
//
// Any doubt (an engine error, a list without its columns, no count, or a count asked
// within statsInterval of the last) answers false, and the sweep runs.
func (d *Docker) nothingLeft(ctx context.Context, name string, u *dockerUnit) bool {
	uid, _, err := parseUser(u.user)
	if err != nil {
		return false
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), topTimeout)
	defer cancel()
	top, err := d.cli.ContainerTop(tctx, u.id, []string{"-o", "pid,uid,nlwp"})
	if err != nil {
		d.log.Debug("worker's processes not listed: sweeping", "container", name, "error", err)
		return false
	}
	uidCol, threadsCol := slices.Index(top.Titles, "UID"), slices.Index(top.Titles, "NLWP")
	if uidCol < 0 || threadsCol < 0 {
		return false
	}
	want := strconv.Itoa(uid)
	var threads uint64
	for _, p := range top.Processes {
		if len(p) <= max(uidCol, threadsCol) || strings.TrimSpace(p[uidCol]) == want {
			return false
		}
		n, err := strconv.ParseUint(strings.TrimSpace(p[threadsCol]), 10, 32)
		if err != nil {
			return false
		}
		threads += n
	}
	if time.Since(u.countedAt) < statsInterval {
		return false
	}
	u.countedAt = time.Now()
	tasks, err := d.tasks(tctx, u.id)
	if err != nil {
		d.log.Debug("worker's tasks not counted: sweeping", "container", name, "error", err)
		return false
	}
	return tasks > 0 && tasks <= threads
}

// tasks is the number of tasks in a container's cgroup (its pids.current), as the engine's
// stats report it.
func (d *Docker) tasks(ctx context.Context, id string) (uint64, error) {
	st, err := d.cli.ContainerStatsOneShot(ctx, id)
	if err != nil {
		return 0, err
	}
	defer st.Body.Close()
	var s container.StatsResponse
	if err := json.NewDecoder(st.Body).Decode(&s); err != nil {
		return 0, fmt.Errorf("read stats: %w", err)
	}
	return s.PidsStats.Current, nil
}

func (d *Docker) exec(ctx context.Context, name string, u *dockerUnit, cmd Command) (ExitStatus, string, error) {
	id := u.id
	created, err := d.cli.ContainerExecCreate(ctx, id, container.ExecOptions{
		Cmd:          cmd.Args,
		Env:          cmd.Env,
		User:         u.user,
		WorkingDir:   d.cfg.HomeMount,
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
	})
	if ctx.Err() != nil {
		return ExitStatus{}, outcomeCanceled, context.Cause(ctx)
	}
	if err != nil {
		outcome, err := d.failure(ctx, name, id, err)
		return ExitStatus{}, outcome, err
	}
	since := time.Now()
	hj, err := d.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if ctx.Err() != nil {
		// Attaching is what starts the exec: it may be running unattended.
		if err == nil {
			hj.Close()
		}
		return d.canceled(ctx, name, id)
	}
	if err != nil {
		outcome, err := d.failure(ctx, name, id, err)
		return ExitStatus{}, outcome, err
	}
	defer hj.Close()
	// Closing the connection is what unblocks the copy below when ctx ends.
	stopWatching := context.AfterFunc(ctx, hj.Close)
	go func() {
		// A caller's Stdin that never returns keeps this goroutine until it does; the
		// exec itself does not wait for it.
		if cmd.Stdin != nil {
			_, _ = io.Copy(hj.Conn, cmd.Stdin)
		}
		_ = hj.CloseWrite()
	}()
	// The engine writes why it could not start the program to the stream's stdout.
	head := &headWriter{max: 512}
	_, copyErr := stdcopy.StdCopy(io.MultiWriter(head, orDiscard(cmd.Stdout)), orDiscard(cmd.Stderr), hj.Reader)
	if !stopWatching() {
		return d.canceled(ctx, name, id)
	}
	inspected, err := d.cli.ContainerExecInspect(ctx, created.ID)
	if err != nil {
		outcome, err := d.failure(ctx, name, id, errors.Join(copyErr, err))
		return ExitStatus{}, outcome, err
	}
	if copyErr == nil && !inspected.Running && inspected.Pid == 0 {
		// No process ever ran: the engine failed to start the exec (it then reports exit
		// 126, or 127 for a program not found). Under a load average in the hundreds
		// runc was seen to fail so now and then.
		return ExitStatus{}, outcomeNotStarted, fmt.Errorf("%w: the engine reported exit %d: %s",
			ErrNotStarted, inspected.ExitCode, strings.TrimSpace(head.String()))
	}
	status := ExitStatus{Code: inspected.ExitCode}
	// A program that failed may have been killed by the OOM killer, or have failed
	// because a process it started was (a worker whose agent was killed exits 1): the
	// engine's events say whether the kernel killed anything in the container while it
	// ran. The answer comes first because the engine has it by now; a container dying
	// under the exec is reported a moment after the exec's own end.
	if copyErr == nil && status.Code != 0 && d.cfg.Limits.MemoryBytes > 0 &&
		d.outOfMemory(ctx, id, created.ID, since) {
		status.OutOfMemory = true
		return status, outcomeOutOfMemory, nil
	}
	if copyErr == nil && status.Code < 128 {
		return status, outcomeExited, nil
	}
	// A signal ended the program, or its stream broke.
	stopped, err := d.stopsSoon(ctx, name, id)
	switch {
	case err != nil:
		return ExitStatus{}, outcomeFailed, errors.Join(copyErr, err)
	case stopped:
		return ExitStatus{}, outcomeWorkerGone, ErrWorkerGone
	case copyErr != nil:
		return ExitStatus{}, outcomeFailed, fmt.Errorf("read output: %w", copyErr)
	}
	return status, outcomeExited, nil
}

// stopsSoon says whether the container stops within goneWait, and forgets it if so.
func (d *Docker) stopsSoon(ctx context.Context, name, id string) (bool, error) {
	waitCtx, cancel := context.WithTimeout(ctx, goneWait)
	defer cancel()
	waited, errs := d.cli.ContainerWait(waitCtx, id, container.WaitConditionNotRunning)
	select {
	case <-waited:
		d.forget(name, id)
		return true, nil
	case err := <-errs:
		if cerrdefs.IsNotFound(err) {
			d.forget(name, id)
			return true, nil
		}
		if waitCtx.Err() != nil && ctx.Err() == nil {
			return false, nil // still running when the wait ran out
		}
		return false, fmt.Errorf("wait for container %s: %w", name, err)
	}
}

// canceled removes the worker of an exec whose ctx ended: the only way the engine offers to
// kill an exec and everything it started.
func (d *Docker) canceled(ctx context.Context, name, id string) (ExitStatus, string, error) {
	d.forget(name, id)
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), engineCleanupTimeout)
	defer cancel()
	if err := d.remove(cleanup, id); err != nil {
		return ExitStatus{}, outcomeFailed, errors.Join(context.Cause(ctx), err)
	}
	d.log.Info("container removed", "container", name, "id", shortID(id), "reason", "exec canceled")
	return ExitStatus{}, outcomeCanceled, context.Cause(ctx)
}

// failure explains an exec that could not start or be inspected: ErrWorkerGone when the
// container is no longer running, else err.
func (d *Docker) failure(ctx context.Context, name, id string, err error) (string, error) {
	gone, gerr := d.gone(ctx, name, id)
	if gerr == nil && gone {
		return outcomeWorkerGone, ErrWorkerGone
	}
	return outcomeFailed, errors.Join(err, gerr)
}

// gone says whether the container is no longer running, and forgets it if so.
func (d *Docker) gone(ctx context.Context, name, id string) (bool, error) {
	info, err := d.cli.ContainerInspect(ctx, id)
	if cerrdefs.IsNotFound(err) || (err == nil && (info.State == nil || !info.State.Running)) {
		d.forget(name, id)
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("inspect container %s: %w", name, err)
	}
	return false, nil
}

// outOfMemory says whether the engine reported an OOM kill in the container between since
// and the end of the exec.
func (d *Docker) outOfMemory(ctx context.Context, containerID, execID string, since time.Time) bool {
	ctx, cancel := context.WithTimeout(ctx, oomEventWait)
	defer cancel()
	messages, errs := d.cli.Events(ctx, events.ListOptions{
		Since: fmt.Sprintf("%d.%09d", since.Unix(), since.Nanosecond()),
		Filters: filters.NewArgs(
			filters.Arg("type", string(events.ContainerEventType)),
			filters.Arg("container", containerID),
			filters.Arg("event", string(events.ActionOOM)),
			filters.Arg("event", string(events.ActionExecDie)),
		),
	})
	return oomReported(messages, errs, execID, oomAfterExit, func(err error) {
		d.log.Warn("engine events unavailable: OOM kill not confirmed", "id", shortID(containerID), "error", err)
	})
}

// oomReported reads a container's oom and exec_die events until an oom (true), or until
// after's grace past execID's exec_die, the stream's end or its error (false).
func oomReported(messages <-chan events.Message, errs <-chan error, execID string, after time.Duration, failed func(error)) bool {
	var grace <-chan time.Time
	for {
		select {
		case m := <-messages:
			if m.Action == events.ActionOOM {
				return true
			}
			if m.Action == events.ActionExecDie && m.Actor.Attributes["execID"] == execID && grace == nil {
				grace = time.After(after)
			}
		case <-grace:
			return false
		case err := <-errs:
			if grace == nil {
				failed(err)
			}
			return false
		}
	}
}

// Stop implements Runtime.
func (d *Docker) Stop(ctx context.Context, org string, role Role) error {
	if err := ValidateOrg(org); err != nil {
		return err
	}
	name := UnitName(org, role)
	defer d.locks.lock(name)()
	d.forget(name, "")
	info, err := d.cli.ContainerInspect(ctx, name)
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("inspect container %s: %w", name, err)
	}
	if labels := info.Config.Labels; labels[LabelManaged] != "true" || labels[LabelScope] != d.cfg.Scope {
		// Another scope's container under the org's name: not ours to stop.
		return fmt.Errorf("stop container %s: %w by scope %q (managed %q)", name, ErrNameTaken, labels[LabelScope], labels[LabelManaged])
	}
	if err := d.remove(ctx, info.ID); err != nil {
		return err
	}
	d.log.Info("container stopped", "container", name)
	return nil
}

// List implements Runtime.
func (d *Docker) List(ctx context.Context) ([]Unit, error) {
	list, err := d.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: d.managedFilter(true)})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	units := make([]Unit, 0, len(list))
	for _, c := range list {
		units = append(units, Unit{
			Org:     c.Labels[LabelOrg],
			Role:    Role(c.Labels[LabelRole]),
			Name:    containerName(c.Names),
			ID:      c.ID,
			Running: c.State == container.StateRunning,
		})
	}
	return units, nil
}

// Reap implements Runtime.
func (d *Docker) Reap(ctx context.Context) (Reaped, error) {
	units, err := d.List(ctx)
	if err != nil {
		return Reaped{}, err
	}
	var reaped Reaped
	for _, u := range units {
		if err := ctx.Err(); err != nil {
			return reaped, err
		}
		reason, err := d.reapOne(ctx, u)
		if err != nil {
			return reaped, err
		}
		switch reason {
		case "idle":
			reaped.Idle++
		case "exited":
			reaped.Exited++
		}
	}
	d.cfg.Metrics.reapedUnits(d.Kind(), "idle", reaped.Idle)
	d.cfg.Metrics.reapedUnits(d.Kind(), "exited", reaped.Exited)
	return reaped, nil
}

func (d *Docker) reapOne(ctx context.Context, u Unit) (string, error) {
	defer d.locks.lock(u.Name)()
	reason := ""
	d.mu.Lock()
	tracked := d.units[u.Name]
	switch {
	case !u.Running:
		reason = "exited"
	case tracked == nil || tracked.id != u.ID:
		// Started by this instance but unknown to this process: from now on its idle
		// time counts.
		d.units[u.Name] = &dockerUnit{id: u.ID, lastUsed: d.cfg.Now(), dirty: true}
	case u.Role == RoleWorker && d.cfg.IdleTimeout > 0 && tracked.inFlight == 0 &&
		d.cfg.Now().Sub(tracked.lastUsed) >= d.cfg.IdleTimeout:
		reason = "idle"
	}
	if reason != "" && tracked != nil && tracked.id == u.ID {
		delete(d.units, u.Name)
	}
	d.mu.Unlock()
	if reason == "" {
		return "", nil
	}
	if reason == "idle" {
		// Idle as this process knows it; an exec another process started (a CLI, a
		// dispatcher restarted under it) still makes it busy, and busy is never reaped.
		busy, err := d.execRunning(ctx, u.ID)
		if err != nil {
			return "", err
		}
		if busy {
			d.log.Info("idle worker not reaped: an exec is running in it", "container", u.Name, "id", shortID(u.ID))
			return "", nil
		}
	}
	if err := d.remove(ctx, u.ID); err != nil {
		return "", err
	}
	d.log.Info("container reaped", "container", u.Name, "id", shortID(u.ID), "reason", reason)
	return reason, nil
}

// execRunning says whether any exec runs in the container now, whoever started it.
func (d *Docker) execRunning(ctx context.Context, id string) (bool, error) {
	info, err := d.cli.ContainerInspect(ctx, id)
	if cerrdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("inspect container %s: %w", shortID(id), err)
	}
	for _, e := range info.ExecIDs {
		if ei, err := d.cli.ContainerExecInspect(ctx, e); err == nil && ei.Running {
			return true, nil
		}
	}
	return false, nil
}

// remove kills and removes a container; one already gone is not an error, and one whose
// removal is under way already (a failed sweep's, say, racing an ensure) is waited for.
func (d *Docker) remove(ctx context.Context, idOrName string) error {
	err := d.cli.ContainerRemove(ctx, idOrName, container.RemoveOptions{Force: true})
	if cerrdefs.IsConflict(err) && strings.Contains(err.Error(), "already in progress") {
		err = d.awaitRemoved(ctx, idOrName)
	}
	if err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove container %s: %w", idOrName, err)
	}
	return nil
}

// awaitRemoved waits until the container is gone (nil, or a not-found error).
func (d *Docker) awaitRemoved(ctx context.Context, idOrName string) error {
	for {
		_, err := d.cli.ContainerInspect(ctx, idOrName)
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("its removal, under way already, did not end: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// forget drops what this process knows of a unit; with an id, only while that container is
// still the one known, so a worker started meanwhile is kept.
func (d *Docker) forget(name, id string) {
	d.mu.Lock()
	if u := d.units[name]; u != nil && (id == "" || u.id == id) {
		delete(d.units, name)
	}
	d.mu.Unlock()
}

func containerName(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return strings.TrimPrefix(names[0], "/")
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// fileIdentity names the inode a bind mount of the file would follow.
func fileIdentity(fi os.FileInfo) string {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fmt.Sprintf("%d-%d", st.Dev, st.Ino)
	}
	return ""
}

func secretLines(secrets []string) string {
	var b strings.Builder
	for _, s := range secrets {
		b.WriteString(s)
		b.WriteByte('\n')
	}
	return b.String()
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

func ptr[T any](v T) *T { return &v }

// headWriter keeps the first max bytes written to it and takes the rest without keeping it.
type headWriter struct {
	buf bytes.Buffer
	max int
}

func (h *headWriter) Write(p []byte) (int, error) {
	if room := h.max - h.buf.Len(); room > 0 {
		h.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (h *headWriter) String() string { return strings.ToValidUTF8(h.buf.String(), "") }

// unitUser is the uid:gid a container's programs run as, by its label; a container made
// before units had the label ran them as Config.User.
func (d *Docker) unitUser(labels map[string]string) string {
	if u := labels[labelUser]; u != "" {
		return u
	}
	return d.cfg.User
}
