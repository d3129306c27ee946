package runtime

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// DefaultUser is the uid:gid of programs in a Docker unit when Config.User is empty (it
// replaces the Config default, the host process's own uid): not root, and no user of a
// usual host. The org's home and workspaces are given to the user when a container
// starts (see chownTree).
const DefaultUser = "10001:10001"

// keeperUser is the uid:gid of a Docker worker's init and main process (worker idle). It
// differs from Config.User, the uid of everything executed in the worker, so that an exec
// of Config.User may kill every process of its own uid (the sweep after each job, see
// Docker.sweep) without touching them, and so that an agent cannot signal them either.
// 65534 is nobody/nogroup: the main process reads and writes nothing of the org's.
const keeperUser = "65534:65534"

// parseUser reads a numeric uid:gid.
func parseUser(s string) (uid, gid int, err error) {
	u, g, ok := strings.Cut(s, ":")
	uid, uerr := strconv.Atoi(u)
	gid, gerr := strconv.Atoi(g)
	if !ok || uerr != nil || gerr != nil || uid < 0 || gid < 0 {
		return 0, 0, fmt.Errorf("runtime config: User %q is not a numeric uid:gid", s)
	}
	return uid, gid, nil
}

// chownTree gives dir and everything in it to uid:gid, so that a unit running as that user
// can read and write the org's home and workspaces, whoever made them (the dispatcher
// makes the home and rewrites SOUL.md as itself; a host before non-root units left files
// of root's). Entries already owned so are only looked at. It works inside an os.Root
// with Lchown: a link is given away itself, never followed, and a folder swapped for a
// link while the walk runs (by a unit of the org still running) cannot steer it out of
// dir.
func chownTree(dir string, uid, gid int) (changed int, err error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	err = fs.WalkDir(root.FS(), ".", func(name string, de fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed while we walked
		}
		if err != nil {
			return err
		}
		info, err := de.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) == uid && int(st.Gid) == gid {
			return nil
		}
		if err := root.Lchown(name, uid, gid); err != nil && !errors.Is(err, fs.ErrNotExist) {
			if errors.Is(err, fs.ErrPermission) {
				return fmt.Errorf("give %s to the units' user %d:%d: %w (the host must run as root, or units as its own uid)",
					name, uid, gid, err)
			}
			return err
		}
		changed++
		return nil
	})
	return changed, err
}
