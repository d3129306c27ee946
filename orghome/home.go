// Package orghome is how the host reads an organization's HERMES_HOME, and writes it in the
// few places it owns: the generated block of SOUL.md and the skills disabled by the cap.
//
// Each organization is a standalone Hermes instance whose home is a folder under ORGS_ROOT
// named by the org id. Every path is opened through an os.Root, so nothing read or written
// can leave the home: "..", absolute paths and symlinks that point out are refused with
// ErrOutsideHome. What the package returns are plain structs a dashboard renders as is.
//
// What lives where (Hermes' own layout, see DESIGN section 8):
//
//	SOUL.md                           identity: a host-owned block plus a free section
//	config.yaml                       Hermes settings; the cap writes skills.disabled only
//	skills/**/SKILL.md                authored skills at any depth (bundled ones stay in the image)
//	memories/MEMORY.md, USER.md       the agent's memory, read-only for the host
//	state.db                          sessions and messages (SQLite, WAL), read-only
//	workspaces/<job-id>/              one folder per job, removed past the retention
package orghome

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"hermeshost/orgid"
)

// ErrInvalidID is returned for an org id that is not ^[a-z0-9][a-z0-9-]{0,62}$.
var ErrInvalidID = errors.New("invalid organization id")

// ErrOutsideHome is returned for a path that is absolute, climbs out with "..", holds a NUL
// byte, or resolves through a symlink to somewhere outside the home.
var ErrOutsideHome = errors.New("path leaves the organization home")

// ValidID reports whether id may name an organization home.
func ValidID(id string) error {
	if !orgid.Valid(id) {
		return fmt.Errorf("%w %q: want 1-63 lowercase letters, digits or hyphens, not starting with a hyphen", ErrInvalidID, id)
	}
	return nil
}

// Orgs is ORGS_ROOT, the folder that holds one home per organization.
type Orgs struct {
	dir  string
	root *os.Root
}

// OpenOrgs opens ORGS_ROOT.
func OpenOrgs(dir string) (*Orgs, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open orgs root %s: %w", dir, err)
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("open orgs root: %w", err)
	}
	return &Orgs{dir: abs, root: root}, nil
}

// Dir is the absolute path of ORGS_ROOT.
func (o *Orgs) Dir() string { return o.dir }

// Close releases ORGS_ROOT; homes opened from it stay usable.
func (o *Orgs) Close() error { return o.root.Close() }

// Index is what the launcher lists: the organizations found, and the entries that are not
// one (each with the reason), so a stray file or a bad name is visible rather than silent.
type Index struct {
	Orgs    []string
	Ignored []IgnoredEntry
}

// IgnoredEntry is an entry of ORGS_ROOT that is not an organization home.
type IgnoredEntry struct {
	Name   string
	Reason string
}

// List reads ORGS_ROOT: an organization is a directory (not a symlink) with a valid id.
func (o *Orgs) List() (Index, error) {
	f, err := o.root.Open(".")
	if err != nil {
		return Index{}, fmt.Errorf("list orgs in %s: %w", o.dir, err)
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return Index{}, fmt.Errorf("list orgs in %s: %w", o.dir, err)
	}
	var idx Index
	for _, e := range entries {
		name := e.Name()
		switch {
		case e.Type()&fs.ModeSymlink != 0:
			idx.Ignored = append(idx.Ignored, IgnoredEntry{name, "a symlink, not a directory"})
		case !e.IsDir():
			idx.Ignored = append(idx.Ignored, IgnoredEntry{name, "not a directory"})
		case ValidID(name) != nil:
			idx.Ignored = append(idx.Ignored, IgnoredEntry{name, "not a valid organization id"})
		default:
			idx.Orgs = append(idx.Orgs, name)
		}
	}
	sort.Strings(idx.Orgs)
	sort.Slice(idx.Ignored, func(i, j int) bool { return idx.Ignored[i].Name < idx.Ignored[j].Name })
	return idx, nil
}

// Open opens the home of one organization. It must already exist: the host never creates
// an organization by reading it.
func (o *Orgs) Open(id string) (*Home, error) {
	if err := ValidID(id); err != nil {
		return nil, err
	}
	fi, err := o.root.Lstat(id)
	if err != nil {
		return nil, fmt.Errorf("open home of org %s: %w", id, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("open home of org %s: %s is not a directory: %w", id, filepath.Join(o.dir, id), ErrOutsideHome)
	}
	root, err := o.root.OpenRoot(id)
	if err != nil {
		return nil, fmt.Errorf("open home of org %s: %w", id, err)
	}
	return &Home{ID: id, Dir: filepath.Join(o.dir, id), Log: slog.Default(), root: root}, nil
}

// Home is one organization's HERMES_HOME. Its methods are safe for concurrent use.
type Home struct {
	ID  string
	Dir string // absolute path on the host
	// Log receives one line per change the host makes to the home (SOUL.md restored,
	// skills disabled, workspaces removed). Open sets slog.Default(); set it before use.
	Log *slog.Logger

	root   *os.Root
	shared sharedState // State's kept state.db
}

// OpenHome opens the home at dir directly, for a process handed exactly one home (a
// dashboard, a worker inside the org's container). The id is checked like any other.
func OpenHome(id, dir string) (*Home, error) {
	if err := ValidID(id); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open home of org %s: %w", id, err)
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("open home of org %s: %w", id, err)
	}
	return &Home{ID: id, Dir: abs, Log: slog.Default(), root: root}, nil
}

// Close releases the home.
func (h *Home) Close() error {
	h.shared.mu.Lock()
	h.dropShared()
	h.shared.mu.Unlock()
	return h.root.Close()
}

// CheckPath refuses, before touching the disk, a name that cannot stay inside a home:
// empty, absolute, climbing out with "..", or holding a NUL byte. Symlinks are caught by
// os.Root when the path is opened.
func CheckPath(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty path: %w", ErrOutsideHome)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("path %q holds a NUL byte: %w", name, ErrOutsideHome)
	case !filepath.IsLocal(name):
		return fmt.Errorf("path %q is absolute or climbs out: %w", name, ErrOutsideHome)
	}
	return nil
}

// escapeErr is the error os.Root returns for a path that escapes it. os does not export it,
// so it is learned once from a path os.Root refuses before any system call.
var escapeErr = sync.OnceValue(func() error {
	r, err := os.OpenRoot("/")
	if err != nil {
		return nil
	}
	defer r.Close()
	_, err = r.Lstat("/")
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return nil
})

// wrapPath gives an os.Root error its context, and marks escapes with ErrOutsideHome.
func (h *Home) wrapPath(op, name string, err error) error {
	if err == nil {
		return nil
	}
	if e := escapeErr(); e != nil && errors.Is(err, e) {
		return fmt.Errorf("%s %s in home of org %s: %w", op, name, h.ID, ErrOutsideHome)
	}
	return fmt.Errorf("%s %s in home of org %s: %w", op, name, h.ID, err)
}

// ReadFile reads a file of the home.
func (h *Home) ReadFile(name string) ([]byte, error) {
	if err := CheckPath(name); err != nil {
		return nil, fmt.Errorf("read in home of org %s: %w", h.ID, err)
	}
	b, err := h.root.ReadFile(name)
	return b, h.wrapPath("read", name, err)
}

// readLimited reads at most limit bytes of a file and says whether there was more.
func (h *Home) readLimited(name string, limit int64) ([]byte, bool, fs.FileInfo, error) {
	if err := CheckPath(name); err != nil {
		return nil, false, nil, fmt.Errorf("read in home of org %s: %w", h.ID, err)
	}
	f, err := h.root.Open(name)
	if err != nil {
		return nil, false, nil, h.wrapPath("read", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, false, nil, h.wrapPath("stat", name, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, false, fi, fmt.Errorf("read %s in home of org %s: not a regular file", name, h.ID)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, false, fi, h.wrapPath("read", name, err)
	}
	if int64(len(b)) > limit {
		return b[:limit], true, fi, nil
	}
	return b, false, fi, nil
}

// Stat follows symlinks that stay inside the home.
func (h *Home) Stat(name string) (fs.FileInfo, error) {
	if err := CheckPath(name); err != nil {
		return nil, fmt.Errorf("stat in home of org %s: %w", h.ID, err)
	}
	fi, err := h.root.Stat(name)
	return fi, h.wrapPath("stat", name, err)
}

// Lstat does not follow a final symlink.
func (h *Home) Lstat(name string) (fs.FileInfo, error) {
	if err := CheckPath(name); err != nil {
		return nil, fmt.Errorf("lstat in home of org %s: %w", h.ID, err)
	}
	fi, err := h.root.Lstat(name)
	return fi, h.wrapPath("lstat", name, err)
}

// ReadDir lists a directory of the home, sorted by name.
func (h *Home) ReadDir(name string) ([]fs.DirEntry, error) {
	if err := CheckPath(name); err != nil {
		return nil, fmt.Errorf("list in home of org %s: %w", h.ID, err)
	}
	f, err := h.root.Open(name)
	if err != nil {
		return nil, h.wrapPath("list", name, err)
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return nil, h.wrapPath("list", name, err)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	return entries, nil
}

// regularFile returns the absolute host path of a file the host is about to hand to a
// path-based API (atomicfile, SQLite): the name must stay inside the home, its directory
// must be a real directory of the home, and the file itself, when present, must not be a
// symlink, so the path-based call cannot be steered out by a link.
func (h *Home) regularFile(name string) (abs string, exists bool, err error) {
	if err := CheckPath(name); err != nil {
		return "", false, fmt.Errorf("in home of org %s: %w", h.ID, err)
	}
	if dir := filepath.Dir(name); dir != "." {
		if err := h.realDir(dir); err != nil {
			return "", false, err
		}
	}
	fi, err := h.root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return filepath.Join(h.Dir, name), false, nil
	case err != nil:
		return "", false, h.wrapPath("lstat", name, err)
	case fi.Mode()&fs.ModeSymlink != 0:
		return filepath.Join(h.Dir, name), true, fmt.Errorf("%s in home of org %s is a symlink: %w", name, h.ID, ErrOutsideHome)
	case !fi.Mode().IsRegular():
		return "", true, fmt.Errorf("%s in home of org %s is not a regular file", name, h.ID)
	}
	return filepath.Join(h.Dir, name), true, nil
}

// realDir checks that every component of dir is a directory, not a symlink.
func (h *Home) realDir(dir string) error {
	parts := strings.Split(filepath.ToSlash(filepath.Clean(dir)), "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		fi, err := h.root.Lstat(p)
		if err != nil {
			return h.wrapPath("lstat", p, err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%s in home of org %s is a symlink: %w", p, h.ID, ErrOutsideHome)
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s in home of org %s is not a directory", p, h.ID)
		}
	}
	return nil
}
