// Package migrations holds the host's goose SQL migrations, embedded in the binary, and
// runs any embedded migration set (the host's, the reference backend's) in its own schema
// with its own goose version table, under goose's Postgres session lock so that replicas
// starting together do not race.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"hash/crc64"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"hermeshost/pg"
)

//go:embed *.sql
var hostSQL embed.FS

// Set is one product's migrations and the schema they live in by default.
type Set struct {
	Name          string
	FS            fs.FS
	DefaultSchema string
}

// Host is the host's own migration set (leases, claim attempts, job mirror, ...).
var Host = Set{Name: "host", FS: hostSQL, DefaultSchema: "hermes_host"}

// Runner applies a Set to one database and schema.
type Runner struct {
	set    Set
	db     *sql.DB
	schema string
	prov   *goose.Provider
}

// Open connects to url (schema from its search_path, else the set's default) and prepares
// goose. Close it when done.
func (s Set) Open(ctx context.Context, url string, log *slog.Logger) (*Runner, error) {
	cfg, schema, err := pg.Config(url, s.DefaultSchema)
	if err != nil {
		return nil, err
	}
	db := stdlib.OpenDB(*cfg.ConnConfig)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate %s: connect: %w", s.Name, err)
	}
	if err := createSchema(ctx, db, schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate %s: %w", s.Name, err)
	}
	// One lock per schema: the host and the backend migrate side by side, but two
	// replicas of either take turns.
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(int64(crc64.Checksum([]byte("hermes-migrate:"+schema), crc64.MakeTable(crc64.ECMA))>>1)),
		lock.WithLockTimeout(1, 300),
	)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate %s: %w", s.Name, err)
	}
	opts := []goose.ProviderOption{
		goose.WithSessionLocker(locker),
		goose.WithTableName(schema + ".goose_db_version"),
		goose.WithDisableGlobalRegistry(true),
	}
	if log != nil {
		opts = append(opts, goose.WithSlog(log))
	}
	prov, err := goose.NewProvider(goose.DialectPostgres, db, s.FS, opts...)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate %s: %w", s.Name, err)
	}
	return &Runner{set: s, db: db, schema: schema, prov: prov}, nil
}

// createSchema tolerates a concurrent creator: CREATE SCHEMA IF NOT EXISTS still fails
// with a unique violation when two sessions race on it.
func createSchema(ctx context.Context, db *sql.DB, schema string) error {
	_, err := db.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS "+pg.QuoteIdent(schema))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P06") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create schema %s: %w", schema, err)
	}
	return nil
}

// Schema is the schema this runner migrates.
func (r *Runner) Schema() string { return r.schema }

// Up applies every pending migration.
func (r *Runner) Up(ctx context.Context) ([]*goose.MigrationResult, error) {
	res, err := r.prov.Up(ctx)
	if err != nil {
		return res, fmt.Errorf("migrate %s up in schema %s: %w", r.set.Name, r.schema, err)
	}
	return res, nil
}

// Down rolls back the newest applied migration.
func (r *Runner) Down(ctx context.Context) (*goose.MigrationResult, error) {
	res, err := r.prov.Down(ctx)
	if err != nil {
		return res, fmt.Errorf("migrate %s down in schema %s: %w", r.set.Name, r.schema, err)
	}
	return res, nil
}

// Status lists every migration and whether it is applied.
func (r *Runner) Status(ctx context.Context) ([]*goose.MigrationStatus, error) {
	st, err := r.prov.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate %s status in schema %s: %w", r.set.Name, r.schema, err)
	}
	return st, nil
}

// Close releases the connection.
func (r *Runner) Close() error { return r.db.Close() }

// Up is the start-up path of every process that needs the database: apply what is pending.
func (s Set) Up(ctx context.Context, url string, log *slog.Logger) error {
	r, err := s.Open(ctx, url, log)
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = r.Up(ctx)
	return err
}
