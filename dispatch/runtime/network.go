package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/network"

	"hermeshost/internal/unitnet"
)

// The networks a unit can be on (Config.Network).
const (
	// NetworkIsolated, the default, keeps units off the host's network: Docker puts them
	// on a bridge network of the host's own (no container reaches another, and what the
	// host binds to loopback is out of reach), and the process runtime's sandbox gives each
	// program a network namespace of its own with only a loopback. What a unit may use of
	// the host (Config.Services) it reaches through unix sockets mounted into it.
	NetworkIsolated = "isolated"
	// NetworkHost puts units on the host's network, where they reach every service the
	// host runs at its own address: for tests and setups that ask for it.
	NetworkHost = "host"
)

// Where a unit's sockets live under Config.RunRoot: one folder per org for the host
// services it may use, and one per org for its dashboard's own socket.
const (
	runUnits      = "units"
	runDashboards = "dashboards"
	// dashboardSocket is the socket a dashboard serves on, in its folder.
	dashboardSocket = "dashboard.sock"
)

// netPlan is how a runtime's units reach the host.
type netPlan struct {
	isolated bool
	// sockets serves Config.Services to isolated units; nil when units share the host's
	// network or there are no services.
	sockets *unitnet.Sockets
	runRoot string
}

func (c Config) netPlan() (netPlan, error) {
	p := netPlan{runRoot: c.RunRoot}
	switch c.Network {
	case "", NetworkIsolated:
		p.isolated = true
	case NetworkHost:
	default:
		return p, fmt.Errorf("runtime config: Network %q is not %s or %s", c.Network, NetworkIsolated, NetworkHost)
	}
	if p.isolated && len(c.Services) > 0 {
		s, err := unitnet.NewSockets(filepath.Join(c.RunRoot, runUnits), c.Services, c.Logger)
		if err != nil {
			return p, err
		}
		p.sockets = s
	}
	return p, nil
}

// ensure serves org's sockets (isolated units only) and makes its dashboard's folder,
// owned by uid:gid (the dashboard makes its socket there), and returns both folders; the
// first is "" when nothing is served.
func (p netPlan) ensure(org string, uid, gid int) (units, dash string, err error) {
	if p.sockets != nil {
		if units, err = p.sockets.Ensure(org); err != nil {
			return "", "", err
		}
	}
	dash = filepath.Join(p.runRoot, runDashboards, org)
	if err := os.MkdirAll(dash, 0o755); err != nil {
		return "", "", fmt.Errorf("dashboard folder of %s: %w", org, err)
	}
	if os.Geteuid() == 0 && uid >= 0 {
		if err := os.Chown(dash, uid, gid); err != nil {
			return "", "", fmt.Errorf("dashboard folder of %s: %w", org, err)
		}
	}
	return units, dash, nil
}

// serviceURL is where a unit whose sockets are mounted at mount reaches service name.
func (p netPlan) serviceURL(mount, name string) string {
	if p.sockets == nil {
		return ""
	}
	for _, n := range p.sockets.Services() {
		if n == name {
			return unitnet.URL(filepath.Join(mount, name+".sock"))
		}
	}
	return ""
}

func (p netPlan) close() {
	if p.sockets != nil {
		p.sockets.Close()
	}
}

// unitsNetwork is the name of the Docker network isolated units are on.
func (d *Docker) unitsNetwork() string {
	if d.cfg.Scope == "hermes" {
		return "hermes-units"
	}
	return "hermes-units-" + d.cfg.Scope
}

// networkMode is what a container of this runtime is started on.
func (d *Docker) networkMode() string {
	if d.net.isolated {
		return d.unitsNetwork()
	}
	return NetworkHost
}

// unitsNetworkOptions are the driver options of the units network: no traffic between its
// containers (one org's unit cannot reach another's) and no address of the host on its
// bridge, so a unit cannot reach the host's services on any of the host's addresses.
var unitsNetworkOptions = map[string]string{
	"com.docker.network.bridge.enable_icc":   "false",
	"com.docker.network.bridge.inhibit_ipv4": "true",
}

// unitsNetworkAsMade says why a network is not the units network as this runtime makes it
// ("" when it is): a bridge with unitsNetworkOptions, internal (nothing is routed off it:
// no other host, no cloud metadata address, no internet).
func unitsNetworkAsMade(n network.Inspect) string {
	if n.Driver != "bridge" {
		return "driver " + n.Driver + ", not bridge"
	}
	if !n.Internal {
		return "not internal"
	}
	for k, v := range unitsNetworkOptions {
		if n.Options[k] != v {
			return fmt.Sprintf("option %s is %q, not %q", k, n.Options[k], v)
		}
	}
	return ""
}

// ensureNetwork adopts the scope's units network, or creates it: an internal bridge with
// unitsNetworkOptions, labelled as the host's. A unit on it reaches nothing by IP but its
// own loopback. A network of that name that is not the host's is left alone: ErrNameTaken.
// The host's own network made otherwise (by an earlier version) is made again when no
// container is on it, and refused, saying what to do, while one is.
func (d *Docker) ensureNetwork(ctx context.Context) error {
	if !d.net.isolated {
		return nil
	}
	name := d.unitsNetwork()
	for try := 0; try < 3; try++ {
		n, err := d.cli.NetworkInspect(ctx, name, network.InspectOptions{})
		if err == nil {
			if n.Labels[LabelManaged] != "true" || n.Labels[LabelScope] != d.cfg.Scope {
				return fmt.Errorf("%w: network %s is not the host's (labels %v)", ErrNameTaken, name, n.Labels)
			}
			why := unitsNetworkAsMade(n)
			if why == "" {
				return nil
			}
			if len(n.Containers) > 0 {
				return fmt.Errorf("network %s is not the units network this host makes (%s) and %d containers are on it: stop them and start again", name, why, len(n.Containers))
			}
			if err := d.cli.NetworkRemove(ctx, n.ID); err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("network %s is not the units network this host makes (%s), and removing it failed: %w", name, why, err)
			}
			d.log.Warn("units network made again", "network", name, "was", why)
			continue
		}
		if !errdefs.IsNotFound(err) {
			return fmt.Errorf("inspect network %s: %w", name, err)
		}
		_, err = d.cli.NetworkCreate(ctx, name, network.CreateOptions{
			Driver:   "bridge",
			Internal: true,
			Labels:   map[string]string{LabelManaged: "true", LabelScope: d.cfg.Scope},
			Options:  unitsNetworkOptions,
		})
		if err == nil {
			d.log.Info("units network created", "network", name)
			return nil
		}
		if !errdefs.IsConflict(err) {
			return fmt.Errorf("create network %s: %w", name, err)
		}
		// Another runtime of the scope made it first: adopt it.
	}
	return errors.New("create network " + name + ": it kept changing")
}
