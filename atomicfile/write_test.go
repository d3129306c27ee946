package atomicfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	oldContent = []byte(`{"access_token":"old-access","refresh_token":"old-refresh"}` + "\n")
	newContent = []byte(strings.Repeat(`{"access_token":"new-access","refresh_token":"new-refresh"}`+"\n", 4))
)

// dirNames lists dir, sorted.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func assertDirHolds(t *testing.T, dir string, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := dirNames(t, dir); !slices.Equal(got, want) {
		t.Fatalf("%s holds %q, want %q (a leftover temp file or half receipt?)", dir, got, want)
	}
}

func assertContent(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s holds %d bytes %q, want %d bytes %q", path, len(got), got, len(want), want)
	}
}

// assertWriteError checks that err is a *WriteError for path at step op whose
// cause is want and whose message names the file and the cause in words.
func assertWriteError(t *testing.T, err error, path, op string, want error, words string) *WriteError {
	t.Helper()
	var werr *WriteError
	if !errors.As(err, &werr) {
		t.Fatalf("error %v (%T) is not a *WriteError", err, err)
	}
	if werr.Path != path || werr.Op != op {
		t.Fatalf("WriteError names %q at %q, want %q at %q", werr.Path, werr.Op, path, op)
	}
	if !errors.Is(err, want) {
		t.Fatalf("errors.Is(%v, %v) = false", err, want)
	}
	msg := err.Error()
	for _, part := range []string{path, op, words} {
		if !strings.Contains(msg, part) {
			t.Fatalf("message %q does not say %q", msg, part)
		}
	}
	return werr
}

// startingWith writes content to dir/name with the real file system.
func startingWith(t *testing.T, name string, content []byte) (dir, path string) {
	t.Helper()
	dir = t.TempDir()
	path = filepath.Join(dir, name)
	if err := Write(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, path
}

func TestWriteCreatesAndReplaces(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "auth.json")
	if err := Write(path, oldContent, 0o640); err != nil {
		t.Fatal(err)
	}
	assertContent(t, path, oldContent)
	if err := Write(path, newContent, 0o600); err != nil {
		t.Fatal(err)
	}
	assertContent(t, path, newContent)
	assertDirHolds(t, dir, "auth.json")
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600: the new perm applies to a replaced file too", info.Mode().Perm())
	}
}

func TestWriteEmptyContent(t *testing.T) {
	dir, path := startingWith(t, "state", oldContent)
	if err := Write(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	assertContent(t, path, nil)
	assertDirHolds(t, dir, "state")
}

func TestWriteIntoMissingDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no-such-dir", "auth.json")
	err := Write(path, newContent, 0o600)
	assertWriteError(t, err, path, opCreateTemp, fs.ErrNotExist, "no such file")
}

// The steps must happen in this order: a rename before the fsync could expose
// an empty file after a crash, and without the directory fsync the rename
// itself may not survive one.
func TestWriteSyncsBeforeRenameAndDirectoryAfter(t *testing.T) {
	_, path := startingWith(t, "auth.json", oldContent)
	fsys := &faultFS{}
	if err := Write(path, newContent, 0o600, withFileSystem(fsys)); err != nil {
		t.Fatal(err)
	}
	if want := []string{"open", "sync", "rename", "syncdir"}; !slices.Equal(fsys.calls, want) {
		t.Fatalf("operations %q, want %q", fsys.calls, want)
	}

	fsys = &faultFS{}
	if err := Write(path, oldContent, 0o600, WithReceipts(2), withFileSystem(fsys)); err != nil {
		t.Fatal(err)
	}
	want := []string{"open", "sync", "mkdir", "syncdir", "link", "syncdir", "rename", "syncdir"}
	if !slices.Equal(fsys.calls, want) {
		t.Fatalf("operations with receipts %q, want %q", fsys.calls, want)
	}
}

// faultCauses are the errors a full or failing disk returns, with the words
// the message must use for each.
var faultCauses = []struct {
	errno syscall.Errno
	words string
}{
	{syscall.ENOSPC, "disk full"},
	{syscall.EDQUOT, "disk quota exceeded"},
	{syscall.EIO, "I/O error"},
	{syscall.EFBIG, "file too large"},
	{syscall.EACCES, "permission denied"},
}

func TestWriteFailingAtEveryOffset(t *testing.T) {
	dir, path := startingWith(t, "auth.json", oldContent)
	for offset := 0; offset <= len(newContent); offset++ {
		cause := faultCauses[offset%len(faultCauses)]
		fsys := &faultFS{fault: failWrite, offset: offset, err: cause.errno}
		err := Write(path, newContent, 0o600, withFileSystem(fsys))
		if offset == len(newContent) {
			// Every byte went through before the fault point: a success.
			if err != nil {
				t.Fatalf("offset %d (whole content): %v", offset, err)
			}
			assertContent(t, path, newContent)
			break
		}
		werr := assertWriteError(t, err, path, opWriteTemp, cause.errno, cause.words)
		if werr.Replaced() || !strings.Contains(err.Error(), "the previous content is unchanged") {
			t.Fatalf("offset %d: %q claims the file was replaced", offset, err)
		}
		assertContent(t, path, oldContent)
		assertDirHolds(t, dir, "auth.json")
	}
}

func TestWriteLoopsOnShortWrites(t *testing.T) {
	dir, path := startingWith(t, "auth.json", oldContent)
	for offset := 0; offset <= len(newContent); offset++ {
		if err := Write(path, oldContent, 0o600); err != nil {
			t.Fatal(err)
		}
		fsys := &faultFS{fault: shortWrite, offset: offset}
		err := Write(path, newContent, 0o600, withFileSystem(fsys))
		if offset == 0 {
			// A write that takes nothing and reports nothing would loop forever.
			assertWriteError(t, err, path, opWriteTemp, io.ErrShortWrite, "accepted only part")
			assertContent(t, path, oldContent)
		} else {
			if err != nil {
				t.Fatalf("short write at offset %d: %v", offset, err)
			}
			assertContent(t, path, newContent)
		}
		assertDirHolds(t, dir, "auth.json")
	}
}

func TestWriteDetectsLostBytesAtEveryOffset(t *testing.T) {
	dir, path := startingWith(t, "auth.json", oldContent)
	for offset := 0; offset < len(newContent); offset++ {
		fsys := &faultFS{fault: lostWrite, offset: offset}
		err := Write(path, newContent, 0o600, withFileSystem(fsys))
		assertWriteError(t, err, path, opVerifySize, errSizeMismatch, fmt.Sprintf("%d bytes on disk, %d written", offset, len(newContent)))
		assertContent(t, path, oldContent)
		assertDirHolds(t, dir, "auth.json")
	}
}

func TestWriteFaultsAfterTheData(t *testing.T) {
	for _, step := range []struct {
		name  string
		fault func(cause error) *faultFS
		op    string
	}{
		{"fsync", func(cause error) *faultFS { return &faultFS{syncErr: cause} }, opSyncTemp},
		{"rename", func(cause error) *faultFS { return &faultFS{renameErr: cause} }, opReplace},
	} {
		for _, cause := range faultCauses {
			t.Run(step.name+"/"+cause.errno.Error(), func(t *testing.T) {
				dir, path := startingWith(t, "auth.json", oldContent)
				err := Write(path, newContent, 0o600, withFileSystem(step.fault(cause.errno)))
				werr := assertWriteError(t, err, path, step.op, cause.errno, cause.words)
				if werr.Replaced() {
					t.Fatalf("%q claims the file was replaced", err)
				}
				assertContent(t, path, oldContent)
				assertDirHolds(t, dir, "auth.json")
			})
		}
	}
}

// When only the directory fsync fails, the rename has happened: the new
// content is in place and the error must say so rather than claim the old
// file survived.
func TestWriteDirectorySyncFault(t *testing.T) {
	dir, path := startingWith(t, "auth.json", oldContent)
	fsys := &faultFS{syncDirErr: map[string]error{dir: syscall.EIO}}
	err := Write(path, newContent, 0o600, withFileSystem(fsys))
	werr := assertWriteError(t, err, path, opSyncDir, syscall.EIO, "I/O error")
	if !werr.Replaced() || !strings.Contains(err.Error(), "may not survive a power loss") {
		t.Fatalf("%q does not say the new content is in place", err)
	}
	assertContent(t, path, newContent)
	assertDirHolds(t, dir, "auth.json")
}

// version is the content writer w writes in its round r: a header that names
// it, repeated to a length that differs between versions, so that a reader
// can tell a complete version from a mix or a prefix.
func version(w, r int) []byte {
	header := fmt.Sprintf("writer %02d round %03d\n", w, r)
	return bytes.Repeat([]byte(header), 1+(w*37+r*11)%300)
}

func checkVersion(data []byte) error {
	var w, r int
	if _, err := fmt.Sscanf(string(data), "writer %02d round %03d\n", &w, &r); err != nil {
		return fmt.Errorf("%d bytes without a version header: %.40q", len(data), data)
	}
	if !bytes.Equal(data, version(w, r)) {
		return fmt.Errorf("%d bytes that are not the complete version of writer %d round %d (%d bytes)", len(data), w, r, len(version(w, r)))
	}
	return nil
}

// watchFile reads path over and over until the returned stop is called, and
// fails the test if any read sees something check rejects. It returns only
// after the first read, so the reads overlap whatever the test does next;
// stop also runs at cleanup.
func watchFile(t *testing.T, path string, check func([]byte) error) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	firstRead := make(chan struct{})
	var (
		wg    sync.WaitGroup
		reads int
		bad   []string
	)
	wg.Go(func() {
		for {
			data, err := os.ReadFile(path)
			if err == nil {
				err = check(data)
			}
			if err != nil && len(bad) < 5 {
				bad = append(bad, err.Error())
			}
			reads++
			if reads == 1 {
				close(firstRead)
			}
			select {
			case <-done:
				return
			default:
			}
		}
	})
	<-firstRead
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(done)
			wg.Wait()
			if len(bad) > 0 {
				t.Errorf("a reader of %s saw, in %d reads: %s", path, reads, strings.Join(bad, "; "))
			}
		})
	}
	// A test that stops early must not leave the reader holding the file.
	t.Cleanup(stop)
	return stop
}

func TestConcurrentWritersLeaveOneCompleteVersion(t *testing.T) {
	for _, tc := range []struct {
		name     string
		writers  int
		rounds   int
		receipts int
	}{
		{"plain", 16, 25, 0},
		{"with receipts", 8, 10, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "checkpoint")
			if err := Write(path, version(99, 0), 0o600); err != nil {
				t.Fatal(err)
			}
			stopReaders := make([]func(), 3)
			for i := range stopReaders {
				stopReaders[i] = watchFile(t, path, checkVersion)
			}
			var wg sync.WaitGroup
			errs := make(chan error, tc.writers*tc.rounds)
			for w := range tc.writers {
				wg.Go(func() {
					for r := range tc.rounds {
						if err := Write(path, version(w, r), 0o600, WithReceipts(tc.receipts)); err != nil {
							errs <- err
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for _, stop := range stopReaders {
				stop()
			}
			for err := range errs {
				t.Error(err)
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkVersion(data); err != nil {
				t.Fatalf("final content: %v", err)
			}
			receipts, err := Receipts(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(receipts) > tc.receipts {
				t.Fatalf("%d receipts kept, want at most %d", len(receipts), tc.receipts)
			}
			for _, r := range receipts {
				data, err := os.ReadFile(r.Path)
				if err != nil {
					t.Fatal(err)
				}
				if err := checkVersion(data); err != nil {
					t.Fatalf("receipt %s: %v", r.Path, err)
				}
			}
			want := []string{"checkpoint"}
			if tc.receipts > 0 {
				want = append(want, ".checkpoint.receipts")
			}
			assertDirHolds(t, dir, want...)
		})
	}
}

// stepClock is a clock for tests: each reading is step later than the last.
type stepClock struct {
	mu   sync.Mutex
	next time.Time
	step time.Duration
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.next
	c.next = c.next.Add(c.step)
	return now
}

// A temp file that cannot be removed after a failure is news for the
// operator, but must not hide the cause.
func TestWriteReportsALeftoverTempFile(t *testing.T) {
	_, path := startingWith(t, "auth.json", oldContent)
	fsys := &faultFS{fault: failWrite, offset: 5, err: syscall.ENOSPC, removeErr: func(name string) error {
		if strings.Contains(filepath.Base(name), ".tmp-") {
			return syscall.EIO
		}
		return nil
	}}
	err := Write(path, newContent, 0o600, withFileSystem(fsys))
	assertWriteError(t, err, path, opWriteTemp, syscall.ENOSPC, "disk full")
	if !strings.Contains(err.Error(), "remove temp file") || !errors.Is(err, syscall.EIO) {
		t.Fatalf("%q does not report the temp file left behind", err)
	}
	assertContent(t, path, oldContent)
}
