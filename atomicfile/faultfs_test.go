package atomicfile

import (
	"io/fs"
	"os"
)

// writeFault says what a faultFile does to the write that crosses its offset;
// the zero writeFault leaves writes alone.
type writeFault int

const (
	// failWrite stores the bytes before the offset and returns err, as a disk
	// that fills up mid-write does.
	failWrite writeFault = iota + 1
	// shortWrite stores the bytes before the offset and returns no error,
	// once; the caller must write the rest itself.
	shortWrite
	// lostWrite drops every byte from the offset on while claiming success,
	// as failing storage can.
	lostWrite
)

// faultFS is the real file system with one chosen step made to fail. Tests
// use it to reach every failure path of Write without a broken disk.
type faultFS struct {
	osFileSystem
	fault  writeFault
	offset int
	err    error // returned by failWrite

	syncErr   error
	renameErr error
	linkErr   error
	mkdirErr  error
	// syncDirErr fails SyncDir on the directory of that name.
	syncDirErr map[string]error
	// removeErr, when set, decides whether removing name fails.
	removeErr func(name string) error

	calls []string // the operations made, in order
}

func (f *faultFS) record(call string) { f.calls = append(f.calls, call) }

func (f *faultFS) OpenFile(name string, flag int, perm fs.FileMode) (file, error) {
	f.record("open")
	real, err := f.osFileSystem.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: real.(*os.File), fs: f}, nil
}

func (f *faultFS) Rename(oldpath, newpath string) error {
	f.record("rename")
	if f.renameErr != nil {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: f.renameErr}
	}
	return f.osFileSystem.Rename(oldpath, newpath)
}

func (f *faultFS) Link(oldname, newname string) error {
	f.record("link")
	if f.linkErr != nil {
		return &os.LinkError{Op: "link", Old: oldname, New: newname, Err: f.linkErr}
	}
	return f.osFileSystem.Link(oldname, newname)
}

func (f *faultFS) Mkdir(name string, perm fs.FileMode) error {
	f.record("mkdir")
	if f.mkdirErr != nil {
		return &fs.PathError{Op: "mkdir", Path: name, Err: f.mkdirErr}
	}
	return f.osFileSystem.Mkdir(name, perm)
}

func (f *faultFS) Remove(name string) error {
	f.record("remove")
	if f.removeErr != nil {
		if err := f.removeErr(name); err != nil {
			return &fs.PathError{Op: "remove", Path: name, Err: err}
		}
	}
	return f.osFileSystem.Remove(name)
}

func (f *faultFS) SyncDir(name string) error {
	f.record("syncdir")
	if err := f.syncDirErr[name]; err != nil {
		return &fs.PathError{Op: "sync", Path: name, Err: err}
	}
	return f.osFileSystem.SyncDir(name)
}

type faultFile struct {
	*os.File
	fs      *faultFS
	written int
	shorted bool
}

func (f *faultFile) Write(p []byte) (int, error) {
	room := max(f.fs.offset-f.written, 0)
	crosses := len(p) > room
	switch {
	case f.fs.fault == failWrite && crosses:
		n, _ := f.File.Write(p[:room])
		f.written += n
		return n, &fs.PathError{Op: "write", Path: f.Name(), Err: f.fs.err}
	case f.fs.fault == shortWrite && crosses && !f.shorted:
		f.shorted = true
		n, err := f.File.Write(p[:room])
		f.written += n
		return n, err
	case f.fs.fault == lostWrite && crosses:
		n, err := f.File.Write(p[:room])
		f.written += n
		if err != nil {
			return n, err
		}
		return len(p), nil
	}
	n, err := f.File.Write(p)
	f.written += n
	return n, err
}

func (f *faultFile) Sync() error {
	f.fs.record("sync")
	if f.fs.syncErr != nil {
		return &fs.PathError{Op: "sync", Path: f.Name(), Err: f.fs.syncErr}
	}
	return f.File.Sync()
}
