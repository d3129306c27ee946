package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// pidsCgroups bounds the processes of each sandboxed unit (Limits.Pids) with the kernel's
// pids controller: one cgroup per unit under a folder of the runtime's own, which every
// program of the unit (its main process, each exec) enters before it starts, so that a fork
// bomb in one org's unit stops at its limit and the host and other orgs carry on.
type pidsCgroups struct {
	root  string // <hierarchy>/hermes-<instance>
	limit int64
	v2    bool
}

// pidsHierarchies are where the pids controller may be mounted: cgroup v1's own
// hierarchy, or the unified (v2) one.
var pidsHierarchies = []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup"}

// openPidsCgroups makes the runtime's folder in the first writable pids hierarchy, after
// removing what an earlier run of the instance left empty there.
func openPidsCgroups(instance string, limit int64) (*pidsCgroups, error) {
	var errs []error
	for _, h := range pidsHierarchies {
		c, err := tryPidsHierarchy(h, instance, limit)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("no writable pids cgroup: %w", errors.Join(errs...))
}

func tryPidsHierarchy(h, instance string, limit int64) (*pidsCgroups, error) {
	c := &pidsCgroups{root: filepath.Join(h, "hermes-"+instance), limit: limit}
	switch raw, err := os.ReadFile(filepath.Join(h, "cgroup.subtree_control")); {
	case strings.HasSuffix(h, "/pids") && fileExists(filepath.Join(h, "tasks")):
		// cgroup v1: the controller's own hierarchy.
	case err == nil && slices.Contains(strings.Fields(string(raw)), "pids"):
		c.v2 = true
	default:
		return nil, fmt.Errorf("%s: no pids controller", h)
	}
	if err := os.MkdirAll(c.root, 0o755); err != nil {
		return nil, err
	}
	if c.v2 {
		if err := os.WriteFile(filepath.Join(c.root, "cgroup.subtree_control"), []byte("+pids"), 0o644); err != nil {
			return nil, fmt.Errorf("%s: enable pids: %w", c.root, err)
		}
	}
	if entries, err := os.ReadDir(c.root); err == nil {
		for _, e := range entries {
			if e.IsDir() {
				_ = os.Remove(filepath.Join(c.root, e.Name())) // fails while processes remain
			}
		}
	}
	// The folder must bound what is put in it.
	if _, err := c.ensure("probe"); err != nil {
		return nil, err
	}
	c.remove("probe")
	return c, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// ensure makes the unit's cgroup with its limit and returns the file a program writes its
// pid to so as to enter it.
func (c *pidsCgroups) ensure(unit string) (string, error) {
	dir := filepath.Join(c.root, unit)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("pids cgroup of %s: %w", unit, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.FormatInt(c.limit, 10)), 0o644); err != nil {
		return "", fmt.Errorf("pids cgroup of %s: %w", unit, err)
	}
	return filepath.Join(dir, "cgroup.procs"), nil
}

// dir is where the unit's cgroup is.
func (c *pidsCgroups) dir(unit string) string { return filepath.Join(c.root, unit) }

// remove removes the unit's cgroup once it is empty; one still holding processes stays
// (the next start of the instance removes it).
func (c *pidsCgroups) remove(unit string) { _ = os.Remove(filepath.Join(c.root, unit)) }

// enterArgs run argv inside the cgroup whose procs file is procs: a shell writes its own
// pid there, then becomes argv, so that nothing argv starts is ever outside it.
func enterArgs(procs string, argv []string) []string {
	return append([]string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, procs}, argv...)
}

// close removes the runtime's cgroups that are empty.
func (c *pidsCgroups) close() {
	entries, err := os.ReadDir(c.root)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.IsDir() {
			_ = os.Remove(filepath.Join(c.root, e.Name()))
		}
	}
	_ = os.Remove(c.root)
}
