// Package atomicfile writes files so that a crash or a full disk never leaves
// them empty or half-written, keeps receipts (previous versions) of the files
// the host owns, and loads JSON credentials strictly, so that a damaged file is
// a loud error instead of "no credentials".
//
// A full disk once truncated a paired identity to zero bytes and the reader
// then minted a new one. Write never exposes a partial file: the content goes
// to a temp file in the same directory, is synced and checked, and only then
// renamed over the target. LoadJSON never turns an empty, truncated or
// unparseable file into a zero value.
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Write replaces the file at path with data, atomically: a reader sees either
// the old content or all of data, never a mix, never an empty file.
//
// The steps: create a temp file ".<name>.tmp-<random>" in the same directory
// with perm (less the umask, as with os.WriteFile), write every byte, fsync,
// check the size on disk, rename it over path, fsync the directory. Every
// failure removes the temp file; a failure before the rename leaves the old
// file byte for byte as it was. The error is a *WriteError.
//
// path ends up with perm whether or not it existed, and a symlink at path is
// replaced, not followed. Concurrent calls on one path each leave a complete
// version; the last rename wins. With receipts, every receipt is a complete
// version too, but which versions get one is then a matter of timing, so
// serialize writers that need each version kept. A crash (not an error) in the middle can
// leave a ".<name>.tmp-*" file behind, which is safe to delete.
func Write(path string, data []byte, perm fs.FileMode, opts ...Option) error {
	return newWriteConfig(opts).write(path, data, perm)
}

// Option configures Write and Restore.
type Option func(*writeConfig)

// WithReceipts keeps up to n previous versions of the file: before the
// replacement, the current file is kept as a receipt (see Receipts), and after
// it the oldest receipts beyond n are removed. n <= 0 keeps none, the default.
func WithReceipts(n int) Option {
	return func(c *writeConfig) { c.receipts = n }
}

// WithClock sets the clock that stamps receipts; the default is time.Now.
func WithClock(now func() time.Time) Option {
	return func(c *writeConfig) { c.now = now }
}

// WithinFolder keeps the write inside folder (which must hold path): every step resolves
// path below folder through an os.Root there, so a symbolic link among the folders in
// between that leads out of it fails the write instead of being followed. An org's home
// passes itself. Without it the write stays inside the file's own folder.
func WithinFolder(folder string) Option {
	return func(c *writeConfig) { c.within = folder }
}

// withFileSystem swaps the file operations Write uses; tests use it to inject
// faults at every step.
func withFileSystem(fsys fileSystem) Option {
	return func(c *writeConfig) { c.fsys = fsys }
}

type writeConfig struct {
	fsys     fileSystem
	now      func() time.Time
	receipts int
	within   string
}

func newWriteConfig(opts []Option) *writeConfig {
	c := &writeConfig{fsys: osFileSystem{}, now: time.Now}
	for _, opt := range opts {
		opt(c)
	}
	return c
}

// The steps of a write, as they appear in WriteError.Op.
const (
	opCreateTemp    = "create temp file"
	opWriteTemp     = "write temp file"
	opSyncTemp      = "sync temp file"
	opVerifySize    = "verify size"
	opCloseTemp     = "close temp file"
	opKeepReceipt   = "keep receipt"
	opReplace       = "replace"
	opSyncDir       = "sync directory"
	opPruneReceipts = "prune receipts"
)

// write is writeFile, its failure counted (WriteErrors).
func (c *writeConfig) write(path string, data []byte, perm fs.FileMode) error {
	err := c.writeFile(path, data, perm)
	countWriteError(err)
	return err
}

func (c *writeConfig) writeFile(path string, data []byte, perm fs.FileMode) error {
	dir := filepath.Dir(path)
	if _, onDisk := c.fsys.(osFileSystem); onDisk {
		top := dir
		if c.within != "" {
			top = c.within
		}
		rooted, err := openRooted(top)
		if err != nil {
			return &WriteError{Path: path, Op: opCreateTemp, Err: err}
		}
		defer rooted.root.Close()
		c.fsys = rooted
		defer func() { c.fsys = osFileSystem{} }()
	}
	tmp := filepath.Join(dir, "."+filepath.Base(path)+".tmp-"+strconv.FormatUint(rand.Uint64(), 36))
	f, err := c.fsys.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return &WriteError{Path: path, Op: opCreateTemp, Err: err}
	}
	// fail removes the temp file and reports the step that failed. A failed
	// removal joins the cause, so the operator learns a temp file is left.
	fail := func(op string, cause error) error {
		if err := c.fsys.Remove(tmp); err != nil {
			cause = errors.Join(cause, fmt.Errorf("remove temp file: %w", err))
		}
		return &WriteError{Path: path, Op: op, Err: cause}
	}
	failOpen := func(op string, cause error) error {
		// The cause is what matters; closing a file about to be removed can
		// only add noise.
		_ = f.Close()
		return fail(op, cause)
	}
	if err := writeAll(f, data); err != nil {
		return failOpen(opWriteTemp, err)
	}
	if err := f.Sync(); err != nil {
		return failOpen(opSyncTemp, err)
	}
	if err := verifySize(f, len(data)); err != nil {
		return failOpen(opVerifySize, err)
	}
	if err := f.Close(); err != nil {
		return fail(opCloseTemp, err)
	}
	receipt, err := c.keepReceipt(path)
	if err != nil {
		return fail(opKeepReceipt, err)
	}
	if err := c.fsys.Rename(tmp, path); err != nil {
		if receipt != "" {
			// The receipt holds the version that is still current; left
			// behind it would pose as a version this failed write replaced.
			if rerr := c.fsys.Remove(receipt); rerr != nil {
				err = errors.Join(err, fmt.Errorf("remove receipt: %w", rerr))
			}
		}
		return fail(opReplace, err)
	}
	if err := c.fsys.SyncDir(dir); err != nil {
		return &WriteError{Path: path, Op: opSyncDir, Err: err}
	}
	if receipt != "" {
		if err := c.pruneReceipts(path); err != nil {
			return &WriteError{Path: path, Op: opPruneReceipts, Err: err}
		}
	}
	return nil
}

// writeAll loops on short writes: an io.Writer may return fewer bytes than
// asked, and the loop stops only when every byte is written or a write fails.
func writeAll(w io.Writer, data []byte) error {
	for len(data) > 0 {
		n, err := w.Write(data)
		data = data[n:]
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
	}
	return nil
}

// errSizeMismatch reports a file whose size after sync is not what was written,
// a sign that the storage dropped bytes without saying so.
var errSizeMismatch = errors.New("size on disk differs from the bytes written")

func verifySize(f file, want int) error {
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if info.Size() != int64(want) {
		return fmt.Errorf("%w: %d bytes on disk, %d written", errSizeMismatch, info.Size(), want)
	}
	return nil
}

// WriteError is the error Write and Restore return when a write fails. It
// names the file, the step and the cause; errors.Is(err, syscall.ENOSPC) and
// the like see the operating system's errno through it.
type WriteError struct {
	Path string // the file being replaced
	// Op is the step that failed: "create temp file", "write temp file",
	// "sync temp file", "verify size", "close temp file", "keep receipt",
	// "replace", "sync directory" or "prune receipts".
	Op  string
	Err error
}

func (e *WriteError) Error() string {
	msg := "write " + e.Path + ": " + e.Op + ": "
	if words := causeInWords(e.Err); words != "" {
		msg += words + ": "
	}
	msg += e.Err.Error() + "; "
	if e.Replaced() {
		if e.Op == opSyncDir {
			return msg + "the new content is in place but may not survive a power loss"
		}
		return msg + "the new content is in place"
	}
	return msg + "the previous content is unchanged"
}

func (e *WriteError) Unwrap() error { return e.Err }

// Replaced reports whether the new content reached the file despite the
// error: true only when a step after the rename failed.
func (e *WriteError) Replaced() bool {
	return e.Op == opSyncDir || e.Op == opPruneReceipts
}

// causes puts the errors a full or failing disk returns into words an operator
// reads at a glance.
var causes = []struct {
	err   error
	words string
}{
	{syscall.ENOSPC, "disk full"},
	{syscall.EDQUOT, "disk quota exceeded"},
	{syscall.EIO, "I/O error from the storage device"},
	{syscall.EFBIG, "file too large for the file system"},
	{syscall.EROFS, "read-only file system"},
	{fs.ErrPermission, "permission denied"},
	{io.ErrShortWrite, "the storage accepted only part of the data"},
	{errSizeMismatch, "the storage lost part of the data"},
}

func causeInWords(err error) string {
	for _, c := range causes {
		if errors.Is(err, c.err) {
			return c.words
		}
	}
	return ""
}

// fileSystem is the set of operations that change files. Write goes through
// it so tests can fail or shorten any step; reads go straight to package os.
type fileSystem interface {
	OpenFile(name string, flag int, perm fs.FileMode) (file, error)
	Rename(oldpath, newpath string) error
	Link(oldname, newname string) error
	Remove(name string) error
	Mkdir(name string, perm fs.FileMode) error
	SyncDir(name string) error
}

type file interface {
	io.Writer
	Sync() error
	Stat() (fs.FileInfo, error)
	Close() error
}

// osFileSystem stands for the real disk; a write replaces it with a rootedFS at the
// written file's folder.
type osFileSystem struct{}

func (osFileSystem) OpenFile(name string, flag int, perm fs.FileMode) (file, error) {
	return os.OpenFile(name, flag, perm)
}

func (osFileSystem) Rename(oldpath, newpath string) error      { return os.Rename(oldpath, newpath) }
func (osFileSystem) Link(oldname, newname string) error        { return os.Link(oldname, newname) }
func (osFileSystem) Remove(name string) error                  { return os.Remove(name) }
func (osFileSystem) Mkdir(name string, perm fs.FileMode) error { return os.Mkdir(name, perm) }

// rootedFS is the disk as a write sees it: every operation goes through an os.Root at the
// written file's folder, so that no symbolic link (a receipts folder planted as a link to
// another org's home, say) takes a write, a link or a removal out of that folder.
type rootedFS struct {
	dir  string
	root *os.Root
}

func openRooted(dir string) (*rootedFS, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	return &rootedFS{dir: dir, root: root}, nil
}

// rel is name below the folder; a name outside it is refused.
func (r *rootedFS) rel(name string) (string, error) {
	rel, err := filepath.Rel(r.dir, name)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("%s is outside the folder %s", name, r.dir)
	}
	return rel, nil
}

func (r *rootedFS) OpenFile(name string, flag int, perm fs.FileMode) (file, error) {
	rel, err := r.rel(name)
	if err != nil {
		return nil, err
	}
	return r.root.OpenFile(rel, flag, perm)
}

// both is rel of two names, for the operations that take two.
func (r *rootedFS) both(oldname, newname string, op func(string, string) error) error {
	o, err := r.rel(oldname)
	if err != nil {
		return err
	}
	n, err := r.rel(newname)
	if err != nil {
		return err
	}
	return op(o, n)
}

func (r *rootedFS) Rename(oldpath, newpath string) error {
	return r.both(oldpath, newpath, r.root.Rename)
}

func (r *rootedFS) Link(oldname, newname string) error { return r.both(oldname, newname, r.root.Link) }

func (r *rootedFS) Remove(name string) error {
	rel, err := r.rel(name)
	if err != nil {
		return err
	}
	return r.root.Remove(rel)
}

func (r *rootedFS) Mkdir(name string, perm fs.FileMode) error {
	rel, err := r.rel(name)
	if err != nil {
		return err
	}
	return r.root.Mkdir(rel, perm)
}

func (r *rootedFS) SyncDir(name string) error {
	rel, err := r.rel(name)
	if err != nil {
		return err
	}
	d, err := r.root.Open(rel)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return err
	}
	return d.Close()
}

// SyncDir makes a rename or link in the directory durable; without it the
// directory entry can be lost on power failure even though the data was synced.
func (osFileSystem) SyncDir(name string) error {
	d, err := os.Open(name)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return err
	}
	return d.Close()
}
