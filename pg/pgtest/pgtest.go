// Package pgtest is the test harness for code that needs a real Postgres (River's
// pattern): one shared pool per test binary from TEST_DATABASE_URL, rolled-back
// transactions for store tests, and a fresh goose-migrated schema for tests whose server
// must see committed rows.
//
// Without TEST_DATABASE_URL a test skips and says why; under CI (CI set) it fails
// instead, so CI can never pass by skipping.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"hermeshost/migrations"
	"hermeshost/pg"
)

// SharedSchema is where the shared pool's migrations live; it is kept between runs.
const SharedSchema = "hermes_host_test"

var shared struct {
	once sync.Once
	pool *pgxpool.Pool
	err  error
}

// URL is TEST_DATABASE_URL, or skips (fails under CI) when it is unset.
func URL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("TEST_DATABASE_URL")
	if u == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("TEST_DATABASE_URL is not set, and CI must not skip database tests (make test sets it)")
		}
		t.Skip("TEST_DATABASE_URL is not set: run `make test`, which starts Postgres, to include this test")
	}
	return u
}

// WithSchema is url with search_path set to schema.
func WithSchema(t testing.TB, rawURL, schema string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("TEST_DATABASE_URL must be a postgres:// URL: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// Pool is the shared pool of this test binary, with the host's migrations applied in
// SharedSchema.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	base := URL(t)
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		u := WithSchema(t, base, SharedSchema)
		if err := migrations.Host.Up(ctx, u, nil); err != nil {
			shared.err = err
			return
		}
		shared.pool, _, shared.err = pg.Open(ctx, u, SharedSchema)
	})
	if shared.err != nil {
		t.Fatalf("shared test database: %v", shared.err)
	}
	return shared.pool
}

// Tx is a transaction on the shared pool that is rolled back when the test ends: the
// store test's writes are never seen by anyone else.
func Tx(t testing.TB) pgx.Tx {
	t.Helper()
	tx, err := Pool(t).Begin(context.Background())
	if err != nil {
		t.Fatalf("begin test transaction: %v", err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// Schema is a fresh schema with the given migration sets applied (the host's when none is
// named), dropped when the test ends. It returns a URL whose search_path names the schema,
// for servers and subprocesses under test, and a pool on it.
func Schema(t testing.TB, sets ...migrations.Set) (string, *pgxpool.Pool) {
	t.Helper()
	if len(sets) == 0 {
		sets = []migrations.Set{migrations.Host}
	}
	u, schema := EmptySchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, s := range sets {
		if err := s.Up(ctx, u, nil); err != nil {
			t.Fatalf("migrate fresh schema %s: %v", schema, err)
		}
	}
	pool, _, err := pg.Open(ctx, u, schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return u, pool
}

// EmptySchema names a schema no one uses yet and drops whatever the test put in it when
// the test ends; the URL's search_path names it, so the first migration creates it.
func EmptySchema(t testing.TB) (url, schema string) {
	t.Helper()
	base := URL(t)
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	schema = "t_" + hex.EncodeToString(b[:])
	t.Cleanup(func() { DropSchema(t, base, schema) })
	return WithSchema(t, base, schema), schema
}

// DropSchema removes a schema made by a test.
func DropSchema(t testing.TB, baseURL, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		t.Errorf("drop test schema %s: %v", schema, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pg.QuoteIdent(schema)+" CASCADE"); err != nil {
		t.Errorf("drop test schema %s: %v", schema, err)
	}
}

// Main runs a package's tests, closes the shared pool, and then fails the run if any
// goroutine outlived the tests. Call it from TestMain.
func Main(m *testing.M, opts ...goleak.Option) { os.Exit(Run(m, opts...)) }

// Run is Main without the exit, for a TestMain with clean-up of its own; it returns the
// exit code.
func Run(m *testing.M, opts ...goleak.Option) int {
	code := m.Run()
	if shared.pool != nil {
		shared.pool.Close()
	}
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	return code
}
