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

// ensureNetwork adopts the scope's units network, or creates it: a bridge with no traffic
// between its containers (one org's unit cannot reach another's), labelled as the host's.
// A network of that name that is not the host's is left alone: ErrNameTaken.
func (d *Docker) ensureNetwork(ctx context.Context) error {
	if !d.net.isolated {
		return nil
	}
	name := d.unitsNetwork()
	for try := 0; try < 2; try++ {
		n, err := d.cli.NetworkInspect(ctx, name, network.InspectOptions{})
		if err == nil {
			if n.Labels[LabelManaged] != "true" || n.Labels[LabelScope] != d.cfg.Scope {
				return fmt.Errorf("%w: network %s is not the host's (labels %v)", ErrNameTaken, name, n.Labels)
			}
			if n.Driver != "bridge" || n.Options["com.docker.network.bridge.enable_icc"] != "false" {
				return fmt.Errorf("network %s is not a bridge without traffic between containers (driver %s): remove it and start again", name, n.Driver)
			}
			return nil
		}
		if !errdefs.IsNotFound(err) {
			return fmt.Errorf("inspect network %s: %w", name, err)
		}
		_, err = d.cli.NetworkCreate(ctx, name, network.CreateOptions{
			Driver: "bridge",
			Labels: map[string]string{LabelManaged: "true", LabelScope: d.cfg.Scope},
			Options: map[string]string{
				"com.docker.network.bridge.enable_icc": "false",
			},
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
