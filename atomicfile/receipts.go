package atomicfile

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// receiptTimeLayout stamps receipt names: UTC, to the second, no colons.
const receiptTimeLayout = "20060102T150405Z"

// Receipt is one kept previous version of a file.
//
// Receipts of <dir>/<name> live in the hidden directory <dir>/.<name>.receipts/,
// one file per kept version, named <seq>-<time>: a sequence number that grows
// by one with every replacement (six digits, so ls lists them in order) and the
// UTC time the version was replaced, for example
//
//	/srv/org/.auth.json.receipts/000007-20260102T150405Z
//
// The directory is mode 0700; each receipt keeps the replaced file's own mode.
// Receipt names carry no extension on purpose, so that tools looking for, say,
// SKILL.md files never pick up an old version. An operator can inspect them
// with ls and cat; Restore puts one back atomically.
//
// A receipt is a hard link to the current file, made after the new content is
// safely in its temp file and just before the rename. That costs no disk space,
// so a nearly full disk still keeps receipts, and the receipt is never a partial
// copy. It stays a faithful copy because Write only ever replaces the file,
// never rewrites it in place; a file edited in place by another program would
// change its newest receipt too. If the rename then fails, the receipt is removed again: it holds the
// version that is still current, and left behind it would pose as a version a
// write replaced. Old receipts are pruned only after a successful replacement.
type Receipt struct {
	Path     string    // the receipt file itself
	Seq      int       // 1 for the first version replaced, one more for each after
	Replaced time.Time // when this version was replaced, to the second, by the writer's clock
	Size     int64     // in bytes
}

func receiptDir(path string) string {
	dir, name := filepath.Split(path)
	return filepath.Join(dir, "."+name+".receipts")
}

func receiptName(seq int, replaced time.Time) string {
	return fmt.Sprintf("%06d-%s", seq, replaced.UTC().Format(receiptTimeLayout))
}

func parseReceiptName(name string) (seq int, replaced time.Time, ok bool) {
	seqText, timeText, found := strings.Cut(name, "-")
	if !found {
		return 0, time.Time{}, false
	}
	seq, err := strconv.Atoi(seqText)
	if err != nil || seq < 1 {
		return 0, time.Time{}, false
	}
	replaced, err = time.Parse(receiptTimeLayout, timeText)
	if err != nil {
		return 0, time.Time{}, false
	}
	return seq, replaced, true
}

// Receipts lists the kept previous versions of the file at path, newest
// first. A file that never had a receipt has none, and that is not an error.
// Files in the receipt directory that do not look like receipts are ignored.
//
// The receipts folder must be a folder of its own: one planted as a symbolic link (to
// another org's home, say) is an error naming it, and nothing is listed through it.
func Receipts(path string) ([]Receipt, error) {
	dir := receiptDir(path)
	entries, err := readReceiptDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list receipts of %s: %w", path, err)
	}
	var receipts []Receipt
	for _, entry := range entries {
		seq, replaced, ok := parseReceiptName(entry.Name())
		if !ok || !entry.Type().IsRegular() {
			continue
		}
		info, err := entry.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // pruned by a concurrent writer since ReadDir
		}
		if err != nil {
			return nil, fmt.Errorf("list receipts of %s: %w", path, err)
		}
		receipts = append(receipts, Receipt{
			Path:     filepath.Join(dir, entry.Name()),
			Seq:      seq,
			Replaced: replaced,
			Size:     info.Size(),
		})
	}
	slices.SortFunc(receipts, func(a, b Receipt) int {
		return cmp.Or(cmp.Compare(b.Seq, a.Seq), cmp.Compare(b.Path, a.Path))
	})
	return receipts, nil
}

// Restore puts the version kept in r back at path. It goes through Write, so
// it is atomic, and it keeps a receipt of the version it replaces: with
// WithReceipts(n) among opts the receipts are bounded by n as usual; without
// it Restore removes none. The restored file gets the receipt's mode.
func Restore(path string, r Receipt, opts ...Option) error {
	if filepath.Dir(r.Path) != receiptDir(path) {
		return fmt.Errorf("restore %s: %s is not one of its receipts", path, r.Path)
	}
	data, perm, err := readReceipt(r.Path)
	if err != nil {
		return fmt.Errorf("restore %s: read receipt: %w", path, err)
	}
	c := newWriteConfig(opts)
	if c.receipts <= 0 {
		c.receipts = math.MaxInt
	}
	if err := c.write(path, data, perm); err != nil {
		return fmt.Errorf("restore %s from receipt %s: %w", path, filepath.Base(r.Path), err)
	}
	return nil
}

// ErrReceiptsNotAFolder says a file's receipts folder is a symbolic link or another kind
// of file: receipts are neither kept nor listed through it.
var ErrReceiptsNotAFolder = errors.New("the receipts folder is not a folder (a symbolic link?): refusing to use it")

// readReceiptDir lists dir, a receipts folder, through an os.Root at its parent, and only
// when it is a real folder there.
func readReceiptDir(dir string) ([]fs.DirEntry, error) {
	root, err := os.OpenRoot(filepath.Dir(dir))
	if err != nil {
		return nil, err
	}
	defer root.Close()
	name := filepath.Base(dir)
	info, err := root.Lstat(name)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("%s: %w", dir, ErrReceiptsNotAFolder)
	}
	d, err := root.Open(name)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.ReadDir(-1)
}

func readReceipt(path string) ([]byte, fs.FileMode, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, 0, err
	}
	return data, info.Mode().Perm(), nil
}

// maxLinkAttempts bounds keepReceipt's retries, so that a receipt directory
// removed under it is an error rather than a loop.
const maxLinkAttempts = 100

// keepReceipt links the current file at path into its receipt directory and
// returns the receipt's path, or "" when receipts are off or there is no file
// yet to keep.
func (c *writeConfig) keepReceipt(path string) (string, error) {
	if c.receipts <= 0 {
		return "", nil
	}
	info, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("cannot keep a receipt of %s: it is not a regular file (%v)", path, info.Mode().Type())
	}
	dir := receiptDir(path)
	switch err := c.fsys.Mkdir(dir, 0o700); {
	case err == nil:
		if err := c.fsys.SyncDir(filepath.Dir(dir)); err != nil {
			return "", err
		}
	case !errors.Is(err, fs.ErrExist):
		return "", err
	default:
		// There already: it must be a folder, not a link planted to lead receipts out.
		if info, err := os.Lstat(dir); err != nil {
			return "", err
		} else if !info.IsDir() {
			return "", fmt.Errorf("%s: %w", dir, ErrReceiptsNotAFolder)
		}
	}
	existing, err := Receipts(path)
	if err != nil {
		return "", err
	}
	seq := 1
	if len(existing) > 0 {
		seq = existing[0].Seq + 1
	}
	replaced := c.now()
	// Concurrent writers on the same path make two races here, each a sign
	// that another writer progressed, so a few retries settle them.
	for attempt := 1; ; attempt++ {
		receipt := filepath.Join(dir, receiptName(seq, replaced))
		err := c.fsys.Link(path, receipt)
		if attempt < maxLinkAttempts {
			if errors.Is(err, fs.ErrExist) {
				seq++ // another writer took this number
				continue
			}
			if errors.Is(err, fs.ErrNotExist) {
				// Another writer renamed a new version over path between
				// the lookup and the link, and Linux refuses to link the
				// now unlinked old one; link the new one instead.
				continue
			}
		}
		if err != nil {
			return "", err
		}
		// The receipt must be durable before the rename that makes it the
		// only copy of the old version.
		if err := c.fsys.SyncDir(dir); err != nil {
			if rerr := c.fsys.Remove(receipt); rerr != nil {
				err = errors.Join(err, fmt.Errorf("remove receipt: %w", rerr))
			}
			return "", err
		}
		return receipt, nil
	}
}

// pruneReceipts removes the oldest receipts of path beyond the configured count.
func (c *writeConfig) pruneReceipts(path string) error {
	receipts, err := Receipts(path)
	if err != nil {
		return err
	}
	for _, r := range receipts[min(c.receipts, len(receipts)):] {
		if err := c.fsys.Remove(r.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
