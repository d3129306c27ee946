package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/network"

	"hermeshost/internal/unitnet"
)

// removeNetworkAtEnd removes a scope's units network when the test ends (after its
// containers, whose cleanups run first).
func removeNetworkAtEnd(t *testing.T, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := suite.engine.NetworkRemove(ctx, name); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("remove network %s: %v", name, err)
		}
	})
}

// ownScope gives cfg a scope of its own (so the test has its own units network), isolated
// units, and returns that network's name.
func ownScope(cfg *Config, prefix string) string {
	cfg.Scope = fmt.Sprintf("%s-%s-%d", prefix, suite.runID, time.Now().UnixNano()%1e6)
	cfg.Network = ""
	return "hermes-units-" + cfg.Scope
}

// oldUnitsNetwork makes the scope's units network as an earlier version did: labelled the
// host's, no traffic between containers, but a route off it and the host's address on it.
func oldUnitsNetwork(t *testing.T, name, scope string) network.CreateResponse {
	t.Helper()
	made, err := suite.engine.NetworkCreate(testContext(t), name, network.CreateOptions{Driver: "bridge",
		Labels:  map[string]string{LabelManaged: "true", LabelScope: scope},
		Options: map[string]string{"com.docker.network.bridge.enable_icc": "false"}})
	if err != nil {
		t.Fatal(err)
	}
	return made
}

// Isolated (the default), Docker units are on the scope's own bridge network, made once
// with its labels and no traffic between containers, and adopted by the next runtime; the
// org's sockets folder is mounted read-only where the unit looks for it and serves the
// host's services; a worker found on the host's network is replaced.
func TestDockerUnitsAreOnTheHostsOwnNetwork(t *testing.T) {
	requireEngine(t)
	ctx := testContext(t)
	cfg := testConfig(t, nil)
	name := ownScope(&cfg, "net")
	cfg.Network = NetworkHost
	cfg.RunRoot = filepath.Join(t.TempDir(), "run")
	org := newOrg(t, cfg, "net")
	removeNetworkAtEnd(t, name)

	// A worker of an earlier host, on the host's network.
	onHost, err := NewDocker(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	old := mustEnsureWorker(t, onHost, org)
	onHost.Close()
	// The units network as an earlier version made it: a bridge with a route off it and the
	// host's address on it. With no container on it, it is made again.
	oldUnitsNetwork(t, name, cfg.Scope)

	cfg.Network = ""
	cfg.Services = map[string]http.Handler{"api": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "the host's api")
	})}
	rt, err := NewDocker(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = rt.Stop(ctx, org, RoleWorker)
		rt.Close()
	})
	n, err := suite.engine.NetworkInspect(ctx, name, network.InspectOptions{})
	if err != nil {
		t.Fatalf("the units network: %v", err)
	}
	if n.Driver != "bridge" || n.Labels[LabelManaged] != "true" || n.Labels[LabelScope] != cfg.Scope ||
		n.Options["com.docker.network.bridge.enable_icc"] != "false" || n.Options["com.docker.network.bridge.inhibit_ipv4"] != "true" || !n.Internal {
		t.Errorf("network %s: driver %s labels %v options %v internal %v", name, n.Driver, n.Labels, n.Options, n.Internal)
	}
	e := mustEnsureWorker(t, rt, org)
	if !e.Cold || e.ID == old.ID {
		t.Errorf("the worker on the host's network was kept: %+v (was %s)", e, old.ID)
	}
	info, err := suite.engine.ContainerInspect(ctx, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	if string(info.HostConfig.NetworkMode) != name {
		t.Errorf("network mode %s, want %s", info.HostConfig.NetworkMode, name)
	}
	sockets := filepath.Join(cfg.RunRoot, "units", org)
	var mounted bool
	for _, m := range info.Mounts {
		if m.Destination == unitnet.Dir {
			mounted = m.Source == sockets && !m.RW
		}
	}
	if !mounted {
		t.Errorf("the org's sockets %s are not mounted read-only at %s: %+v", sockets, unitnet.Dir, info.Mounts)
	}
	if got := rt.ServiceURL(org, "api"); got != "unix:"+unitnet.Dir+"/api.sock" {
		t.Errorf("ServiceURL = %q", got)
	}
	if got := rt.ServiceURL(org, "nothing"); got != "" {
		t.Errorf("ServiceURL of an unknown service = %q", got)
	}
	resp, err := unitnet.HTTPClient(filepath.Join(sockets, "api.sock"), 5*time.Second).Get("http://unit/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "the host's api" {
		t.Errorf("the socket answered %q", body)
	}

	// The next runtime, after this one stopped (one dispatcher of an instance runs at a
	// time), adopts the network and the worker, and serves its sockets again.
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := NewDocker(ctx, cfg)
	if err != nil {
		t.Fatalf("a second runtime of the scope: %v", err)
	}
	if e2 := mustEnsureWorker(t, again, org); e2.Cold || e2.ID != e.ID {
		t.Errorf("the restarted runtime replaced the worker: %+v (was %s)", e2, e.ID)
	}
	again.Close()
}

// A network of the units network's name that is not the host's is never used or removed.
func TestDockerLeavesAForeignNetworkOfItsNameAlone(t *testing.T) {
	requireEngine(t)
	ctx := testContext(t)
	cfg := testConfig(t, nil)
	name := ownScope(&cfg, "foreign")
	if _, err := suite.engine.NetworkCreate(ctx, name, network.CreateOptions{Driver: "bridge"}); err != nil {
		t.Fatal(err)
	}
	removeNetworkAtEnd(t, name)
	rt, err := NewDocker(ctx, cfg)
	if err == nil {
		rt.Close()
		t.Fatal("the runtime took a network that is not the host's")
	}
	if !errors.Is(err, ErrNameTaken) {
		t.Fatalf("error %v, want ErrNameTaken", err)
	}
	if _, err := suite.engine.NetworkInspect(ctx, name, network.InspectOptions{}); err != nil {
		t.Fatalf("the foreign network is gone: %v", err)
	}
}

// The host's units network made otherwise (by an earlier version: a route off it, the
// host's address on it) is never used while a container is on it: the runtime refuses to
// start, saying what to do, and leaves the network and the container as they were.
func TestDockerRefusesAnOldUnitsNetworkWithContainersOnIt(t *testing.T) {
	requireEngine(t)
	ctx := testContext(t)
	cfg := testConfig(t, nil)
	name := ownScope(&cfg, "oldnet")
	made := oldUnitsNetwork(t, name, cfg.Scope)
	removeNetworkAtEnd(t, name)
	c, err := suite.engine.ContainerCreate(ctx, &container.Config{Image: suite.image, Labels: map[string]string{LabelScope: cfg.Scope}},
		&container.HostConfig{NetworkMode: container.NetworkMode(name)}, nil, nil, "hermes-oldnet-"+cfg.Scope)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = suite.engine.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
	})
	if err := suite.engine.ContainerStart(ctx, c.ID, container.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	rt, err := NewDocker(ctx, cfg)
	if err == nil {
		rt.Close()
		t.Fatal("the runtime used a units network with a route off it")
	}
	if !strings.Contains(err.Error(), "not internal") || !strings.Contains(err.Error(), "stop them and start again") {
		t.Errorf("refusal %q does not say why and what to do", err)
	}
	n, err := suite.engine.NetworkInspect(ctx, name, network.InspectOptions{})
	if err != nil || n.ID != made.ID || len(n.Containers) != 1 {
		t.Fatalf("the network was changed: %+v %v", n, err)
	}
}
