// Package statetest leaves a SQLite database as a process killed in the middle of a write
// leaves it, for the tests of what reads Hermes' state.db.
package statetest

import (
	"context"
	"database/sql"
	"io"
	"os"
	"syscall"
	"testing"

	_ "modernc.org/sqlite" // the driver Hermes' state.db is read with
)

// InterruptWrite leaves the database at path as a writer SIGKILLed mid-transaction leaves
// it (as Hermes is, when it dies while turning a new state.db to WAL): the database file
// holds part of the write and a hot rollback journal beside it holds the pages to restore.
// A read-only connection cannot open it (SQLITE_READONLY_ROLLBACK) until a read-write one
// rolls the journal back. Nothing may hold the database open.
//
// The write runs with a cache too small for it, so SQLite syncs the journal (its header
// then says it is live) and writes pages into the database before the commit; both files
// are copied at that moment, the transaction is rolled back, and the copies put in place.
func InterruptWrite(t testing.TB, path string) {
	t.Helper()
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(DELETE)&_pragma=cache_size(10)&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var mode string
	if err := conn.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "delete" {
		t.Fatalf("%s: journal mode %q, %v; want delete (is it held open?)", path, mode, err)
	}
	for _, q := range []string{
		"BEGIN IMMEDIATE",
		"CREATE TABLE cut_off_write (b BLOB)",
		"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200) INSERT INTO cut_off_write SELECT randomblob(4096) FROM n",
	} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	dir := t.TempDir()
	copyFile(t, path, dir+"/db")
	copyFile(t, path+"-journal", dir+"/journal")
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	db.Close()
	journal, err := os.ReadFile(dir + "/journal")
	if err != nil || len(journal) == 0 || journal[0] == 0 {
		t.Fatalf("the journal copied mid-write is not a live one (%d bytes, %v)", len(journal), err)
	}
	copyFile(t, dir+"/db", path)
	copyFile(t, dir+"/journal", path+"-journal")
	// The writer that died owned its journal, as it owns the database.
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if err := os.Chown(path+"-journal", int(st.Uid), int(st.Gid)); err != nil {
			t.Fatal(err)
		}
	}
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		t.Fatal(err)
	}
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
