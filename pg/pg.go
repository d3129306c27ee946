// Package pg opens the host's Postgres pools. Each product (the host, the reference
// backend) keeps its tables in its own schema; a URL may name another one with
// ?search_path=NAME, which is how tests give every server a fresh schema.
package pg

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultMaxConns is a pool's size unless its URL says pool_max_conns.
const DefaultMaxConns = 16

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Config parses url and settles the schema: the URL's search_path if it names one, else
// defaultSchema. The schema is returned so migrations and queries agree on it.
func Config(url, defaultSchema string) (*pgxpool.Config, string, error) {
	if url == "" {
		return nil, "", fmt.Errorf("no database URL given (set DATABASE_URL)")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's parse errors can quote the URL, password included.
		return nil, "", fmt.Errorf("database URL does not parse as a Postgres URL or DSN")
	}
	// pgx's default pool is max(4, CPUs): on a small machine a dispatcher's runs (each
	// keeping its home: lease and mirroring its lines), cycles, org: lease rounds and
	// control API wait behind one another for 4 connections, and leases lapse while their
	// refreshes queue. pool_max_conns in the URL sets another.
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
	}
	schema := defaultSchema
	if sp, ok := cfg.ConnConfig.RuntimeParams["search_path"]; ok && sp != "" {
		schema = sp
	}
	if !schemaName.MatchString(schema) {
		return nil, "", fmt.Errorf("schema %q is not a plain lower-case identifier", schema)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "hermes-host"
	}
	return cfg, schema, nil
}

// Open connects a pool to url with its schema settled as Config does, and pings it.
func Open(ctx context.Context, url, defaultSchema string) (*pgxpool.Pool, string, error) {
	return OpenWith(ctx, url, defaultSchema, Options{})
}

// Options shape a pool beyond what its URL says.
type Options struct {
	// MaxConns, when positive, is the pool's size whatever the URL's pool_max_conns says:
	// for a small pool kept for one kind of statement beside a process's main one.
	MaxConns int32
	// Name is added to the connections' application_name ("hermes-host-NAME" unless the
	// URL names the application), so that pg_stat_activity tells the pools apart.
	Name string
}

// OpenWith is Open with o applied.
func OpenWith(ctx context.Context, url, defaultSchema string, o Options) (*pgxpool.Pool, string, error) {
	cfg, schema, err := Config(url, defaultSchema)
	if err != nil {
		return nil, "", err
	}
	if o.MaxConns > 0 {
		cfg.MaxConns = o.MaxConns
		cfg.MinConns = min(cfg.MinConns, o.MaxConns)
	}
	if o.Name != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] += "-" + o.Name
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("open database: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, "", fmt.Errorf("connect to database %s:%d/%s: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, err)
	}
	return pool, schema, nil
}

// QuoteIdent quotes a schema or table name for SQL text.
func QuoteIdent(name string) string { return pgx.Identifier{name}.Sanitize() }
