package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

var clockStart = time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)

func newStepClock() *stepClock { return &stepClock{next: clockStart, step: time.Minute} }

func numbered(i int) []byte { return []byte(fmt.Sprintf("version %d\n", i)) }

// receiptContents reads every receipt of path, newest first.
func receiptContents(t *testing.T, path string) []string {
	t.Helper()
	receipts, err := Receipts(path)
	if err != nil {
		t.Fatal(err)
	}
	var contents []string
	for _, r := range receipts {
		data, err := os.ReadFile(r.Path)
		if err != nil {
			t.Fatal(err)
		}
		contents = append(contents, string(data))
	}
	return contents
}

func TestReceiptsKeepBoundedPreviousVersions(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "SOUL.md")
	clock := newStepClock()
	for i := 1; i <= 6; i++ {
		if err := Write(path, numbered(i), 0o600, WithReceipts(3), WithClock(clock.Now)); err != nil {
			t.Fatal(err)
		}
	}
	assertContent(t, path, numbered(6))
	receipts, err := Receipts(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(receipts) != 3 {
		t.Fatalf("%d receipts, want 3 (the oldest removed)", len(receipts))
	}
	for i, r := range receipts {
		// Version 6 is current; 5, 4, 3 are kept, newest first. The first
		// write kept nothing and read no clock, so version v was replaced
		// at the clock's reading number v-1, counting from 0.
		v := 5 - i
		want := Receipt{
			Path:     filepath.Join(dir, ".SOUL.md.receipts", fmt.Sprintf("%06d-%s", v, clockStart.Add(time.Duration(v-1)*time.Minute).Format("20060102T150405Z"))),
			Seq:      v,
			Replaced: clockStart.Add(time.Duration(v-1) * time.Minute),
			Size:     int64(len(numbered(v))),
		}
		if r != want {
			t.Fatalf("receipt %d is %+v, want %+v", i, r, want)
		}
		assertContent(t, r.Path, numbered(v))
	}
	if got := filepath.Base(receipts[0].Path); got != "000005-20260102T150805Z" {
		t.Fatalf("newest receipt is named %q, want the documented layout 000005-20260102T150805Z", got)
	}
	info, err := os.Stat(filepath.Join(dir, ".SOUL.md.receipts"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o700 {
		t.Fatalf("receipt directory mode %v, want 0700: receipts of credentials are credentials", info.Mode().Perm())
	}
}

func TestFirstWriteKeepsNoReceipt(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "auth.json")
	if err := Write(path, oldContent, 0o600, WithReceipts(3)); err != nil {
		t.Fatal(err)
	}
	receipts, err := Receipts(path)
	if err != nil || len(receipts) != 0 {
		t.Fatalf("Receipts = %v, %v; want none", receipts, err)
	}
	assertDirHolds(t, dir, "auth.json")
}

func TestReceiptsIgnoreStrayFiles(t *testing.T) {
	_, path := startingWith(t, "auth.json", numbered(1))
	if err := Write(path, numbered(2), 0o600, WithReceipts(3)); err != nil {
		t.Fatal(err)
	}
	receiptsDir := filepath.Join(filepath.Dir(path), ".auth.json.receipts")
	for _, name := range []string{"notes.txt", "000000-20260102T150405Z", "000009-yesterday", ".auth.json.tmp-abc"} {
		if err := os.WriteFile(filepath.Join(receiptsDir, name), []byte("stray"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got := receiptContents(t, path); !slices.Equal(got, []string{string(numbered(1))}) {
		t.Fatalf("receipts hold %q, want only version 1", got)
	}
}

// A receipt is made just before the rename; every fault from there on must
// leave the receipts as they were, with the old file intact.
func TestFailedWriteKeepsNoHalfReceipt(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(dir string) *faultFS
		op    string
	}{
		{"write", func(string) *faultFS { return &faultFS{fault: failWrite, offset: 7, err: syscall.ENOSPC} }, opWriteTemp},
		{"fsync", func(string) *faultFS { return &faultFS{syncErr: syscall.EIO} }, opSyncTemp},
		{"link", func(string) *faultFS { return &faultFS{linkErr: syscall.ENOSPC} }, opKeepReceipt},
		{"receipt directory sync", func(dir string) *faultFS {
			return &faultFS{syncDirErr: map[string]error{filepath.Join(dir, ".auth.json.receipts"): syscall.EIO}}
		}, opKeepReceipt},
		{"rename", func(string) *faultFS { return &faultFS{renameErr: syscall.EDQUOT} }, opReplace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, path := startingWith(t, "auth.json", numbered(1))
			if err := Write(path, numbered(2), 0o600, WithReceipts(2)); err != nil {
				t.Fatal(err)
			}
			receiptsDir := filepath.Join(dir, ".auth.json.receipts")
			before := dirNames(t, receiptsDir)
			err := Write(path, numbered(3), 0o600, WithReceipts(2), withFileSystem(tc.fault(dir)))
			var werr *WriteError
			if !errors.As(err, &werr) || werr.Op != tc.op || werr.Replaced() {
				t.Fatalf("error %v, want a *WriteError at %q that leaves the old file", err, tc.op)
			}
			assertContent(t, path, numbered(2))
			assertDirHolds(t, dir, "auth.json", ".auth.json.receipts")
			assertDirHolds(t, receiptsDir, before...)
			if got := receiptContents(t, path); !slices.Equal(got, []string{string(numbered(1))}) {
				t.Fatalf("receipts hold %q, want only version 1", got)
			}
		})
	}
}

func TestReceiptDirectoryFaultOnFirstReceipt(t *testing.T) {
	dir, path := startingWith(t, "auth.json", numbered(1))
	err := Write(path, numbered(2), 0o600, WithReceipts(2), withFileSystem(&faultFS{mkdirErr: syscall.ENOSPC}))
	assertWriteError(t, err, path, opKeepReceipt, syscall.ENOSPC, "disk full")
	assertContent(t, path, numbered(1))
	assertDirHolds(t, dir, "auth.json")
}

func TestReceiptOfANonRegularFileIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "auth.json")
	if err := os.Symlink("elsewhere.json", path); err != nil {
		t.Fatal(err)
	}
	err := Write(path, numbered(1), 0o600, WithReceipts(2))
	var werr *WriteError
	if !errors.As(err, &werr) || werr.Op != opKeepReceipt || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("error %v, want a refusal to keep a receipt of a symlink", err)
	}
	if target, err := os.Readlink(path); err != nil || target != "elsewhere.json" {
		t.Fatalf("symlink changed: %q, %v", target, err)
	}
}

func TestRestore(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "auth.json")
	clock := newStepClock()
	write := func(i int, perm fs.FileMode) {
		t.Helper()
		if err := Write(path, numbered(i), perm, WithReceipts(5), WithClock(clock.Now)); err != nil {
			t.Fatal(err)
		}
	}
	write(1, 0o640)
	write(2, 0o600)
	write(3, 0o600)
	receipts := mustReceipts(t, path)
	oldest := receipts[len(receipts)-1]
	assertContent(t, oldest.Path, numbered(1))

	if err := Restore(path, oldest, WithReceipts(5), WithClock(clock.Now)); err != nil {
		t.Fatal(err)
	}
	assertContent(t, path, numbered(1))
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o640 {
		t.Fatalf("restored mode %v, want the receipt's 0640", info.Mode().Perm())
	}
	// The restore itself was receipted: version 3, which it replaced, is now
	// the newest receipt, and nothing older was lost.
	want := []string{string(numbered(3)), string(numbered(2)), string(numbered(1))}
	if got := receiptContents(t, path); !slices.Equal(got, want) {
		t.Fatalf("receipts after restore %q, want %q", got, want)
	}
	assertDirHolds(t, dir, "auth.json", ".auth.json.receipts")
}

func TestRestoreWithoutReceiptOptionRemovesNoReceipts(t *testing.T) {
	_, path := startingWith(t, "auth.json", numbered(1))
	for i := 2; i <= 4; i++ {
		if err := Write(path, numbered(i), 0o600, WithReceipts(3)); err != nil {
			t.Fatal(err)
		}
	}
	receipts := mustReceipts(t, path)
	if err := Restore(path, receipts[len(receipts)-1]); err != nil {
		t.Fatal(err)
	}
	assertContent(t, path, numbered(1))
	want := []string{string(numbered(4)), string(numbered(3)), string(numbered(2)), string(numbered(1))}
	if got := receiptContents(t, path); !slices.Equal(got, want) {
		t.Fatalf("receipts %q, want %q", got, want)
	}
}

func TestRestoreRefusesAnotherFilesReceipt(t *testing.T) {
	dir, path := startingWith(t, "auth.json", numbered(1))
	other := filepath.Join(dir, "other.json")
	for i := 1; i <= 2; i++ {
		if err := Write(other, numbered(10+i), 0o600, WithReceipts(2)); err != nil {
			t.Fatal(err)
		}
	}
	err := Restore(path, mustReceipts(t, other)[0])
	if err == nil || !strings.Contains(err.Error(), "is not one of its receipts") {
		t.Fatalf("Restore with another file's receipt: %v", err)
	}
	assertContent(t, path, numbered(1))
}

func TestRestoreFailureIsAWriteError(t *testing.T) {
	dir, path := startingWith(t, "auth.json", numbered(1))
	if err := Write(path, numbered(2), 0o600, WithReceipts(2)); err != nil {
		t.Fatal(err)
	}
	r := mustReceipts(t, path)[0]
	err := Restore(path, r, withFileSystem(&faultFS{fault: failWrite, offset: 3, err: syscall.ENOSPC}))
	assertWriteError(t, err, path, opWriteTemp, syscall.ENOSPC, "disk full")
	if !strings.Contains(err.Error(), "restore "+path+" from receipt "+filepath.Base(r.Path)) {
		t.Fatalf("message %q does not name the restore", err)
	}
	assertContent(t, path, numbered(2))
	assertDirHolds(t, dir, "auth.json", ".auth.json.receipts")
	if got := receiptContents(t, path); !slices.Equal(got, []string{string(numbered(1))}) {
		t.Fatalf("receipts %q, want only version 1", got)
	}
}

func mustReceipts(t *testing.T, path string) []Receipt {
	t.Helper()
	receipts, err := Receipts(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(receipts) == 0 {
		t.Fatalf("%s has no receipts", path)
	}
	return receipts
}

// Pruning runs after the rename, so its failure must say the new content is
// in place, and the receipt it could not remove stays a real old version.
func TestPruneFailureSaysTheNewContentIsInPlace(t *testing.T) {
	_, path := startingWith(t, "auth.json", numbered(1))
	for i := 2; i <= 3; i++ {
		if err := Write(path, numbered(i), 0o600, WithReceipts(2)); err != nil {
			t.Fatal(err)
		}
	}
	receipts := mustReceipts(t, path)
	oldest := receipts[len(receipts)-1].Path
	fsys := &faultFS{removeErr: func(name string) error {
		if name == oldest {
			return syscall.EACCES
		}
		return nil
	}}
	err := Write(path, numbered(4), 0o600, WithReceipts(2), withFileSystem(fsys))
	werr := assertWriteError(t, err, path, opPruneReceipts, syscall.EACCES, "permission denied")
	if !werr.Replaced() || !strings.HasSuffix(err.Error(), "the new content is in place") {
		t.Fatalf("%q does not say the new content is in place", err)
	}
	assertContent(t, path, numbered(4))
	want := []string{string(numbered(3)), string(numbered(2)), string(numbered(1))}
	if got := receiptContents(t, path); !slices.Equal(got, want) {
		t.Fatalf("receipts %q, want %q", got, want)
	}
}

// snapshotDir is every file below dir with its bytes, for comparing before and after.
func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		out[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A receipts folder planted as a symbolic link to another org's home: the write fails
// naming it, nothing is linked into, listed in or pruned from the other home (its files and
// bytes as they were), and the file itself is not replaced.
func TestAPlantedReceiptsLinkIsRefusedAndLeadsNowhere(t *testing.T) {
	root := t.TempDir()
	acme, globex := filepath.Join(root, "acme"), filepath.Join(root, "globex")
	for _, d := range []string{acme, globex} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// globex's home holds what looks like receipts, which a prune would delete.
	for _, name := range []string{"SOUL.md", "000001-20260101T000000Z", "000002-20260102T000000Z"} {
		if err := os.WriteFile(filepath.Join(globex, name), []byte("globex "+name), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	before := snapshotDir(t, globex)
	target := filepath.Join(acme, "config.yaml")
	if err := Write(target, []byte("v1"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, link := range []string{globex, ".", "../globex"} {
		if err := os.Symlink(link, filepath.Join(acme, ".config.yaml.receipts")); err != nil {
			t.Fatal(err)
		}
		err := Write(target, []byte("v2 through "+link), 0o600, WithReceipts(1))
		if !errors.Is(err, ErrReceiptsNotAFolder) || !strings.Contains(err.Error(), ".config.yaml.receipts") {
			t.Fatalf("a receipts link to %s: %v", link, err)
		}
		if _, err := Receipts(target); !errors.Is(err, ErrReceiptsNotAFolder) {
			t.Fatalf("receipts listed through a link to %s: %v", link, err)
		}
		if got, _ := os.ReadFile(target); string(got) != "v1" {
			t.Fatalf("the file was replaced all the same: %q", got)
		}
		if err := os.Remove(filepath.Join(acme, ".config.yaml.receipts")); err != nil {
			t.Fatal(err)
		}
	}
	if after := snapshotDir(t, globex); !maps.Equal(before, after) {
		t.Fatalf("globex's home changed:\n%v\n%v", before, after)
	}
	if entries, _ := os.ReadDir(acme); len(entries) != 1 {
		t.Fatalf("acme's home holds %d entries, want config.yaml alone (no temp file left)", len(entries))
	}
}

// WithinFolder: a folder between the given one and the file that is a link out of it
// fails the write; the folder it led to is untouched.
func TestAWriteWithinAFolderFollowsNoLinkOutOfIt(t *testing.T) {
	root := t.TempDir()
	home, elsewhere := filepath.Join(root, "home"), filepath.Join(root, "elsewhere")
	for _, d := range []string{home, elsewhere, filepath.Join(home, "real")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(elsewhere, filepath.Join(home, "plugins")); err != nil {
		t.Fatal(err)
	}
	before := snapshotDir(t, elsewhere)
	if err := Write(filepath.Join(home, "plugins", "x.py"), []byte("planted"), 0o600, WithinFolder(home)); err == nil {
		t.Fatal("a write through a link out of the folder succeeded")
	}
	if after := snapshotDir(t, elsewhere); !maps.Equal(before, after) {
		t.Fatalf("the folder the link led to changed: %v", after)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("something landed out of the folder: %v", entries)
	}
	// A real folder inside is written as usual, with receipts.
	p := filepath.Join(home, "real", "config.yaml")
	for _, v := range []string{"v1", "v2"} {
		if err := Write(p, []byte(v), 0o600, WithinFolder(home), WithReceipts(2)); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := os.ReadFile(p); string(got) != "v2" {
		t.Fatalf("%q", got)
	}
	if rs, err := Receipts(p); err != nil || len(rs) != 1 {
		t.Fatalf("receipts %v %v", rs, err)
	}
}
