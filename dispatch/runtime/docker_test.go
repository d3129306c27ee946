package runtime

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"hermeshost/internal/testio"
	"hermeshost/internal/unitnet"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func dockerHarness() harness { return harnesses()[0] }

func TestDockerAdoptsItsOwnAndRemovesTheRest(t *testing.T) {
	requireEngine(t)
	ctx := testContext(t)
	cfg := testConfig(t, nil)
	keep, exited, foreign := newOrg(t, cfg, "adopt-keep"), newOrg(t, cfg, "adopt-exited"), newOrg(t, cfg, "adopt-foreign")

	// Two instances share the engine, each running its own.
	before, err := NewDocker(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	other := cfg
	other.Instance = cfg.Instance + "-gone"
	other.Metrics = nil
	gone, err := NewDocker(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	kept := mustEnsureWorker(t, before, keep)
	dead := mustEnsureWorker(t, before, exited)
	killContainer(t, before, dead.Unit)
	orphan := mustEnsureWorker(t, gone, foreign)
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	if err := before.Close(); err != nil {
		t.Fatal(err)
	}

	// Beside them, a runtime of another scope on the same engine.
	bystanderCfg := testConfig(t, nil)
	bystanderCfg.Scope = testScope() + "-bystander"
	bystander := dockerHarness().start(t, bystanderCfg)
	bystanderOrg := newOrg(t, bystanderCfg, "adopt-bystander")
	untouched := mustEnsureWorker(t, bystander, bystanderOrg)

	// The same instance starts again.
	cfg.Metrics = NewMetrics(prometheus.NewRegistry())
	after := dockerHarness().start(t, cfg)
	for _, u := range []Unit{dead.Unit, orphan.Unit} {
		if _, err := suite.engine.ContainerInspect(ctx, u.ID); !cerrdefs.IsNotFound(err) {
			t.Errorf("%s survived the restart (inspect: %v)", u.Name, err)
		}
	}
	units, err := after.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(units) != 1 || units[0].ID != kept.ID || !units[0].Running {
		t.Errorf("after restart List = %+v, want only %s running", units, kept.Name)
	}
	if e := mustEnsureWorker(t, after, keep); e.Cold || e.ID != kept.ID {
		t.Errorf("ensure after restart = %+v, want the adopted %s", e, kept.ID)
	}
	if out, _, _ := run(t, after, keep, "adopted\n", nil, "testagent", "echo"); out != "adopted\n" {
		t.Errorf("exec in the adopted worker printed %q", out)
	}
	for reason, want := range map[string]float64{"stale": 1, "exited": 1} {
		if got := testutil.ToFloat64(cfg.Metrics.reaped.WithLabelValues("docker", reason)); got != want {
			t.Errorf("removed %s at start counted %v, want %v", reason, got, want)
		}
	}
	if e := mustEnsureWorker(t, bystander, bystanderOrg); e.Cold || e.ID != untouched.ID {
		t.Errorf("the restart removed another scope's container: %+v, was %s", e, untouched.ID)
	}
}

func TestDockerContainerShape(t *testing.T) {
	requireEngine(t)
	ctx := testContext(t)
	cfg := testConfig(t, nil)
	cfg.Limits = Limits{MemoryBytes: 128 << 20, NanoCPUs: 500_000_000, Pids: 64}
	rt := dockerHarness().start(t, cfg)
	org := newOrg(t, cfg, "shape")
	e := mustEnsureWorker(t, rt, org)

	info, err := suite.engine.ContainerInspect(ctx, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "/hermes-org-"+org {
		t.Errorf("name %q", info.Name)
	}
	for k, want := range map[string]string{LabelManaged: "true", LabelOrg: org, LabelRole: "worker", LabelInstance: cfg.Instance} {
		if got := info.Config.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	home := filepath.Join(cfg.OrgsRoot, org)
	wantMounts := map[string]struct {
		source string
		rw     bool
	}{
		"/home/hermes":         {home, true},
		"/workspaces":          {filepath.Join(cfg.WorkspacesRoot, org), true},
		"/home/hermes/SOUL.md": {filepath.Join(home, "SOUL.md"), false},
	}
	var binds int
	for _, m := range info.Mounts {
		if m.Type != mount.TypeBind {
			continue
		}
		binds++
		want, ok := wantMounts[m.Destination]
		if !ok || m.Source != want.source || m.RW != want.rw {
			t.Errorf("mount %s from %s (rw %v) is not one of %v", m.Destination, m.Source, m.RW, wantMounts)
		}
	}
	if binds != len(wantMounts) {
		t.Errorf("%d bind mounts, want %d: %+v", binds, len(wantMounts), info.Mounts)
	}
	hc := info.HostConfig
	if hc.Memory != 128<<20 || hc.MemorySwap != 128<<20 || hc.NanoCPUs != 500_000_000 || hc.PidsLimit == nil || *hc.PidsLimit != 64 {
		t.Errorf("limits memory %d swap %d cpus %d pids %v", hc.Memory, hc.MemorySwap, hc.NanoCPUs, hc.PidsLimit)
	}
	if hc.NetworkMode != "host" || !hc.ReadonlyRootfs || !slices.Equal(hc.CapDrop, []string{"ALL"}) ||
		hc.Init == nil || !*hc.Init || !slices.Contains(hc.SecurityOpt, "no-new-privileges") {
		t.Errorf("host config network %q read-only %v cap-drop %v init %v security %v",
			hc.NetworkMode, hc.ReadonlyRootfs, hc.CapDrop, hc.Init, hc.SecurityOpt)
	}
	// The worker's init and main process run as the keeper; what is executed in it runs
	// as the units' user (see TestDockerExecsRunAsTheUnitsUser).
	if info.Config.User != keeperUser || info.Config.WorkingDir != "/" {
		t.Errorf("user %q in %q, want the keeper %q in /", info.Config.User, info.Config.WorkingDir, keeperUser)
	}
	for _, kv := range info.Config.Env {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains([]string{"PATH", "HOME", "HERMES_HOME", "HERMES_WORKSPACES", "HERMES_ORG"}, name) {
			t.Errorf("unexpected container environment variable %s", name)
		}
	}
}

func TestDockerRecreatesWorkerWhenSoulReplaced(t *testing.T) {
	requireEngine(t)
	cfg := testConfig(t, nil)
	rt := dockerHarness().start(t, cfg)
	org := newOrg(t, cfg, "soul")
	first := mustEnsureWorker(t, rt, org)
	soul := filepath.Join(cfg.OrgsRoot, org, "SOUL.md")

	// The host replaces files by rename (atomic write); in a running container the kernel
	// then detaches the read-only bind of the old file.
	tmp := soul + ".tmp"
	if err := os.WriteFile(tmp, []byte("soul v2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, soul); err != nil {
		t.Fatal(err)
	}
	next := mustEnsureWorker(t, rt, org)
	if !next.Cold || next.ID == first.ID {
		t.Errorf("ensure after SOUL.md was replaced = %+v, want a new container", next)
	}
	if out, _, _ := run(t, rt, org, "", nil, "testagent", "cat", "/home/hermes/SOUL.md"); out != "soul v2\n" {
		t.Errorf("the new worker sees SOUL.md %q, want the replacement", out)
	}
	if _, _, status := run(t, rt, org, "forged", nil, "testagent", "write", "/home/hermes/SOUL.md"); status.Code == 0 {
		t.Error("SOUL.md is writable in the recreated worker")
	}
	if again := mustEnsureWorker(t, rt, org); again.Cold {
		t.Error("an unchanged SOUL.md recreated the worker again")
	}
}

// An upgrade replaces the image: a unit adopted from before it runs the old programs, so it
// is made again from the current image when next ensured, and only then.
func TestDockerReplacesAUnitOfAnOlderImage(t *testing.T) {
	requireEngine(t)
	ctx := t.Context()
	cfg := testConfig(t, nil)
	rt := dockerHarness().start(t, cfg)
	org := newOrg(t, cfg, "upgrade")
	old := mustEnsureWorker(t, rt, org)

	upgraded := suite.image + "-upgraded"
	if _, err := BuildScratchImage(ctx, suite.engine, ScratchImage{
		Tag: upgraded, Binaries: []string{suite.agent}, Cmd: []string{"testagent", "idle"},
		Labels: map[string]string{"hermes.test": "runtime", "hermes.test.version": "2"},
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = suite.engine.ContainerRemove(ctx, UnitName(org, RoleWorker), container.RemoveOptions{Force: true})
		_, _ = suite.engine.ImageRemove(ctx, upgraded, image.RemoveOptions{Force: true, PruneChildren: true})
	})
	want, err := suite.engine.ImageInspect(ctx, upgraded)
	if err != nil {
		t.Fatal(err)
	}

	// The same instance started again on the new image (the dispatcher after an upgrade).
	next := cfg
	next.WorkerImage = upgraded
	rt2 := dockerHarness().start(t, next)
	got := mustEnsureWorker(t, rt2, org)
	if !got.Cold || got.ID == old.ID {
		t.Fatalf("ensure on the upgraded image = %+v, want a new container in place of %s", got, old.ID)
	}
	info, err := suite.engine.ContainerInspect(ctx, got.ID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Image != want.ID {
		t.Errorf("the new worker runs image %s, want the upgraded %s", info.Image, want.ID)
	}
	if _, err := suite.engine.ContainerInspect(ctx, old.ID); err == nil {
		t.Error("the worker of the old image is still there")
	}
	if again := mustEnsureWorker(t, rt2, org); again.Cold {
		t.Error("a worker already on the current image was made again")
	}
}

// orgUser is a Users that gives every org one fixed uid:gid (the allocator's part is
// dispatch.UnitUsers, tested there).
type orgUser struct{ uid, gid int }

func (u orgUser) UserOf(context.Context, string) (int, int, error) { return u.uid, u.gid, nil }

// Turning per-org uids on (UNIT_UIDS) while a unit runs as the shared UNIT_USER: the
// container is made again as the org's uid when next ensured, and only then, so none of the
// org's programs go on running as the uid every other org shares.
func TestDockerReplacesAUnitOfAnotherUser(t *testing.T) {
	requireEngine(t)
	ctx := t.Context()
	cfg := testConfig(t, nil)
	rt := dockerHarness().start(t, cfg)
	org := newOrg(t, cfg, "uid")
	shared := mustEnsureWorker(t, rt, org)
	if out, _, _ := run(t, rt, org, "", nil, "testagent", "id"); strings.TrimSpace(out) != DefaultUser {
		t.Fatalf("before: an exec runs as %q, want the shared %s", out, DefaultUser)
	}

	// The same instance started again with per-org uids (the dispatcher after the change).
	next := cfg
	next.Users = orgUser{uid: 200777, gid: 200777}
	rt2 := dockerHarness().start(t, next)
	got := mustEnsureWorker(t, rt2, org)
	if !got.Cold || got.ID == shared.ID {
		t.Fatalf("ensure with the org's own uid = %+v, want a new container in place of %s", got, shared.ID)
	}
	if _, err := suite.engine.ContainerInspect(ctx, shared.ID); !cerrdefs.IsNotFound(err) {
		t.Errorf("the container running as the shared uid is still there (inspect: %v)", err)
	}
	info, err := suite.engine.ContainerInspect(ctx, got.ID)
	if err != nil {
		t.Fatal(err)
	}
	// The keeper (the container's main process) stays nobody; the label records the uid
	// every exec runs as, which the exec below shows.
	if info.Config.User != keeperUser || info.Config.Labels[labelUser] != "200777:200777" {
		t.Errorf("the new worker's keeper runs as %q labelled %q, want %s labelled 200777:200777", info.Config.User, info.Config.Labels[labelUser], keeperUser)
	}
	if out, _, _ := run(t, rt2, org, "", nil, "testagent", "id"); strings.TrimSpace(out) != "200777:200777" {
		t.Errorf("after: an exec runs as %q, want the org's 200777:200777", out)
	}
	if again := mustEnsureWorker(t, rt2, org); again.Cold || again.ID != got.ID {
		t.Errorf("a worker already running as the org's uid was made again: %+v", again)
	}
}

// With FollowLogs (dev) what a container's program prints reaches Output, as a Process
// unit's does; without it (production) only the engine's logs keep it.
func TestDockerFollowsItsUnitsOutputWhenAsked(t *testing.T) {
	requireEngine(t)
	for _, follow := range []bool{true, false} {
		var out testio.Buffer
		cfg := testConfig(t, nil)
		cfg.Output, cfg.FollowLogs = &out, follow
		rt := dockerHarness().start(t, cfg)
		org := newOrg(t, cfg, fmt.Sprintf("follow-%t", follow))
		// A dashboard that cannot reach its address says so on stderr and exits.
		if _, err := rt.EnsureDashboard(testContext(t), org, Dashboard{Args: []string{"testagent", "dashboard", "127.0.0.1:1"}}); err != nil {
			t.Fatal(err)
		}
		said := func() bool { return strings.Contains(out.String(), "testagent: dial tcp 127.0.0.1:1") }
		if follow {
			deadline := time.Now().Add(30 * time.Second)
			for !said() && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if !said() {
				t.Errorf("with FollowLogs the dashboard's stderr did not reach Output: %q", out.String())
			}
			continue
		}
		info, err := suite.engine.ContainerInspect(testContext(t), UnitName(org, RoleDashboard))
		if err != nil {
			t.Fatal(err)
		}
		for info.State.Running {
			time.Sleep(50 * time.Millisecond)
			if info, err = suite.engine.ContainerInspect(testContext(t), info.ID); err != nil {
				t.Fatal(err)
			}
		}
		if err := rt.Close(); err != nil {
			t.Fatal(err)
		}
		if out.String() != "" {
			t.Errorf("without FollowLogs Output received %q", out.String())
		}
	}
}

// A dispatcher restarted under its instance adopts its org units, and serves their sockets
// again: what they reach of the host (the backend, the gateway) goes with the process that
// served it, so an adopted worker whose sockets were not served again could only crash.
func TestDockerServesAnAdoptedUnitsSocketsAgain(t *testing.T) {
	requireEngine(t)
	cfg := testConfig(t, nil)
	removeNetworkAtEnd(t, ownScope(&cfg, "adopt"))
	cfg.RunRoot = filepath.Join(t.TempDir(), "run")
	cfg.Services = map[string]http.Handler{"api": http.NotFoundHandler()}
	org := newOrg(t, cfg, "adopted-sockets")
	socket := unitnet.Dir + "/api.sock"
	first := dockerHarness().start(t, cfg)
	was := mustEnsureWorker(t, first, org)
	if out, _, _ := run(t, first, org, "", nil, "testagent", "dial", "unix", socket); out != socket+": connected\n" {
		t.Fatalf("the worker's socket before the restart: %q", out)
	}
	if err := first.Close(); err != nil { // the worker stays, for the next start to adopt
		t.Fatal(err)
	}

	next := dockerHarness().start(t, cfg)
	now := mustEnsureWorker(t, next, org)
	if now.Cold || now.ID != was.ID {
		t.Fatalf("ensure after the restart = %+v, want the adopted worker %s", now, was.ID)
	}
	if out, _, _ := run(t, next, org, "", nil, "testagent", "dial", "unix", socket); out != socket+": connected\n" {
		t.Errorf("the adopted worker's socket: %q, want it served again", out)
	}
}

func TestDetect(t *testing.T) {
	t.Run("NoEngineMeansProcess", func(t *testing.T) {
		t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "no-engine.sock"))
		var logs testio.Buffer
		rt, err := Detect(testContext(t), testConfig(t, &logs))
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		if rt.Kind() != "process" {
			t.Errorf("Detect chose %s without an engine", rt.Kind())
		}
		if !strings.Contains(logs.String(), "runtime=process") || !strings.Contains(logs.String(), "no-engine.sock") {
			t.Errorf("the choice and its reason are not logged: %s", logs.String())
		}
	})
	t.Run("EngineMeansDocker", func(t *testing.T) {
		requireEngine(t)
		var logs testio.Buffer
		rt, err := Detect(testContext(t), testConfig(t, &logs))
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		if rt.Kind() != "docker" || !strings.Contains(logs.String(), "runtime=docker") {
			t.Errorf("Detect chose %s with an engine; logged %s", rt.Kind(), logs.String())
		}
	})
	t.Run("EngineWithoutImagesIsAnError", func(t *testing.T) {
		requireEngine(t)
		cfg := testConfig(t, nil)
		cfg.WorkerImage = "hermes-runtime-test:no-such-image"
		rt, err := Detect(testContext(t), cfg)
		if err == nil {
			rt.Close()
			t.Fatalf("Detect fell back to %s instead of failing on a missing image", rt.Kind())
		}
		if !strings.Contains(err.Error(), "no-such-image") {
			t.Errorf("error does not name the image: %v", err)
		}
	})
}

func TestScratchImages(t *testing.T) {
	t.Run("RefusesDynamicBinaries", func(t *testing.T) {
		const dynamic = "/bin/ls"
		if err := checkStatic(dynamic); err == nil {
			t.Skipf("%s is static on this machine", dynamic)
		}
		_, err := scratchContext(ScratchImage{Tag: "x", Binaries: []string{suite.agent, dynamic}})
		if err == nil || !strings.Contains(err.Error(), "dynamically linked") {
			t.Errorf("context with %s: %v, want a dynamically linked error", dynamic, err)
		}
	})
	t.Run("RefusesTwoBinariesOfOneName", func(t *testing.T) {
		_, err := scratchContext(ScratchImage{Tag: "x", Binaries: []string{suite.agent, suite.agent}})
		if err == nil || !strings.Contains(err.Error(), "two binaries named testagent") {
			t.Errorf("duplicate binaries: %v", err)
		}
	})
	t.Run("ReportsBuilderErrors", func(t *testing.T) {
		stream := `{"stream":"Step 1/3 : FROM scratch\n"}` + "\n" + `{"errorDetail":{"message":"COPY failed"},"error":"COPY failed"}`
		_, err := readBuildStream(strings.NewReader(stream))
		if err == nil || !strings.Contains(err.Error(), "COPY failed") || !strings.Contains(err.Error(), "Step 1/3") {
			t.Errorf("builder error reported as %v", err)
		}
	})
	t.Run("BuildsHostImages", func(t *testing.T) {
		requireEngine(t)
		ctx := testContext(t)
		worker, dashboard := "hermes-runtime-test-worker:"+suite.runID, "hermes-runtime-test-dashboard:"+suite.runID
		if err := BuildHostImages(ctx, worker, dashboard, []string{suite.agent}); err != nil {
			t.Fatal(err)
		}
		for tag, cmd := range map[string][]string{worker: {"hermes-host", "worker", "idle"}, dashboard: {"hermes-host", "dashboard"}} {
			t.Cleanup(func() {
				if _, err := suite.engine.ImageRemove(context.Background(), tag, image.RemoveOptions{Force: true, PruneChildren: true}); err != nil {
					t.Errorf("remove %s: %v", tag, err)
				}
			})
			img, err := suite.engine.ImageInspect(ctx, tag)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(img.Config.Cmd, cmd) || !slices.Contains(img.Config.Env, "PATH=/bin") {
				t.Errorf("%s: cmd %v env %v", tag, img.Config.Cmd, img.Config.Env)
			}
		}
	})
}

// Two instances on one engine: a restarting one removes a dead instance's containers but
// leaves those of an instance whose dispatcher runs (InstanceLive), and one with an exec
// running in it whoever started it; the reaper never removes an idle worker that an exec
// runs in.
func TestDockerLeavesALiveInstancesAndABusyContainer(t *testing.T) {
	requireEngine(t)
	ctx := testContext(t)
	cfg := testConfig(t, nil)
	liveOrg, busyOrg, deadOrg := newOrg(t, cfg, "inst-live"), newOrg(t, cfg, "inst-busy"), newOrg(t, cfg, "inst-dead")
	started := map[string]Ensured{}
	for org, instance := range map[string]string{liveOrg: "-live", busyOrg: "-busy", deadOrg: "-dead"} {
		other := cfg
		other.Instance, other.Metrics = cfg.Instance+instance, nil
		// While the three start, each takes the others for live: none removes another's.
		other.InstanceLive = func(context.Context, string) (bool, error) { return true, nil }
		rt, err := NewDocker(ctx, other)
		if err != nil {
			t.Fatal(err)
		}
		started[org] = mustEnsureWorker(t, rt, org)
		id := started[org].ID
		t.Cleanup(func() {
			_ = suite.engine.ContainerRemove(context.Background(), id, container.RemoveOptions{Force: true})
		})
		if org == busyOrg {
			// An exec still running when another runtime starts: a job of a dispatcher at work.
			bctx, stop := context.WithCancel(context.Background())
			ran := make(chan struct{})
			go func() {
				defer close(ran)
				_, _ = rt.Exec(bctx, org, Command{Args: []string{"testagent", "sleep", "1m", "busy"}})
			}()
			deadline := time.Now().Add(20 * time.Second)
			for !strings.Contains(containerProcesses(t, started[org].ID), "busy") {
				if time.Now().After(deadline) {
					t.Fatal("the busy exec never started")
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Cleanup(func() { stop(); <-ran; _ = rt.Close() })
			continue
		}
		if err := rt.Close(); err != nil {
			t.Fatal(err)
		}
	}
	cfg.InstanceLive = func(_ context.Context, instance string) (bool, error) {
		return instance == cfg.Instance+"-live", nil
	}
	after := dockerHarness().start(t, cfg)
	for org, want := range map[string]bool{liveOrg: true, busyOrg: true, deadOrg: false} {
		_, err := suite.engine.ContainerInspect(ctx, started[org].ID)
		if kept := err == nil; kept != want {
			t.Errorf("%s's container kept %v, want %v (inspect: %v)", org, kept, want, err)
		}
	}
	// Ensuring the live instance's org here is refused, its container untouched.
	if _, err := after.EnsureWorker(ctx, liveOrg); !errors.Is(err, ErrNameTaken) {
		t.Errorf("ensure over a live instance's container: %v", err)
	}
	if _, err := suite.engine.ContainerInspect(ctx, started[liveOrg].ID); err != nil {
		t.Errorf("the live instance's container is gone: %v", err)
	}

	// This instance's own idle worker, with an exec started outside this process in it.
	idleCfg := testConfig(t, nil)
	idleCfg.IdleTimeout = time.Millisecond
	own := dockerHarness().start(t, idleCfg)
	idleOrg := newOrg(t, idleCfg, "inst-idle")
	e := mustEnsureWorker(t, own, idleOrg)
	exec, err := suite.engine.ContainerExecCreate(ctx, e.ID, container.ExecOptions{Cmd: []string{"testagent", "sleep", "1m", "outside"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := suite.engine.ContainerExecStart(ctx, exec.ID, container.ExecStartOptions{Detach: true}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if reaped, err := own.Reap(ctx); err != nil || reaped.Idle != 0 {
		t.Fatalf("reap with an exec running: %+v %v", reaped, err)
	}
	if _, err := suite.engine.ContainerInspect(ctx, e.ID); err != nil {
		t.Fatalf("the busy worker was reaped: %v", err)
	}
}

// Two removals of one container at once both succeed: the engine refuses the later one
// with "removal ... is already in progress" (a failed sweep's removal racing an ensure,
// seen under a load average of 270), which remove waits out.
func TestDockerRemoveWaitsOutARemovalUnderWay(t *testing.T) {
	requireEngine(t)
	ctx := t.Context()
	cfg := testConfig(t, nil)
	rt := dockerHarness().start(t, cfg).(*Docker)
	for i := range 8 {
		org := newOrg(t, cfg, fmt.Sprintf("remove%d", i))
		u := mustEnsureWorker(t, rt, org)
		rt.forget(UnitName(org, RoleWorker), u.ID)
		errs := make(chan error, 2)
		for range 2 {
			go func() { errs <- rt.remove(ctx, u.ID) }()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("removal %d: %v", i, err)
			}
		}
		if _, err := suite.engine.ContainerInspect(ctx, u.ID); !cerrdefs.IsNotFound(err) {
			t.Fatalf("removal %d: the container is still there: %v", i, err)
		}
	}
}

// The engine passes on an OOM kill's oom event and the killed exec's exec_die in whichever
// order it learns of them: an oom shortly after the exec_die is still an OOM kill (CI saw
// one reported as a plain exit 137 when the exec_die ended the wait). Another exec's
// exec_die does not end it; without an oom the wait ends a grace after the exec_die.
func TestOOMReportedInEitherOrder(t *testing.T) {
	execDie := func(id string) events.Message {
		return events.Message{Action: events.ActionExecDie, Actor: events.Actor{Attributes: map[string]string{"execID": id}}}
	}
	oom := events.Message{Action: events.ActionOOM}
	cases := []struct {
		name   string
		stream []events.Message
		want   bool
	}{
		{"oom first", []events.Message{oom, execDie("x")}, true},
		{"oom after the exec_die", []events.Message{execDie("x"), oom}, true},
		{"another exec's exit, then oom", []events.Message{execDie("other"), oom}, true},
		{"exit alone", []events.Message{execDie("x")}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			messages := make(chan events.Message, len(tc.stream))
			for _, m := range tc.stream {
				messages <- m
			}
			failed := false
			got := oomReported(messages, make(chan error), "x", 200*time.Millisecond, func(error) { failed = true })
			if got != tc.want || failed {
				t.Errorf("oom reported %v (stream error logged %v), want %v", got, failed, tc.want)
			}
		})
	}
	// A stream that fails before the exit is logged; one that ends after it is not.
	errs := make(chan error, 1)
	errs <- errors.New("gone")
	logged := false
	if oomReported(make(chan events.Message), errs, "x", time.Second, func(error) { logged = true }) || !logged {
		t.Errorf("a failed stream: logged %v", logged)
	}
}
