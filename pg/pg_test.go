package pg

import (
	"strings"
	"testing"
)

func TestConfigSettlesTheSchema(t *testing.T) {
	cfg, schema, err := Config("postgres://u:p@127.0.0.1:5432/db", "hermes_host")
	if err != nil || schema != "hermes_host" || cfg.ConnConfig.RuntimeParams["search_path"] != "hermes_host" {
		t.Fatalf("default schema: %v %q", err, schema)
	}
	_, schema, err = Config("postgres://u:p@127.0.0.1:5432/db?search_path=t_abc", "hermes_host")
	if err != nil || schema != "t_abc" {
		t.Fatalf("schema from URL: %v %q", err, schema)
	}
	for _, bad := range []string{"Public", "a;drop", `x"y`, "a,b"} {
		if _, _, err := Config("postgres://u:p@127.0.0.1/db?search_path="+bad, "hermes_host"); err == nil {
			t.Errorf("schema %q accepted", bad)
		}
	}
}

func TestConfigErrorsHideThePassword(t *testing.T) {
	_, _, err := Config("postgres://u:s3cret-pw@127.0.0.1:notaport/db", "hermes_host")
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("got %v", err)
	}
	if _, _, err := Config("", "hermes_host"); err == nil || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Fatalf("empty URL: %v", err)
	}
}

// A pool holds DefaultMaxConns connections unless the URL sets pool_max_conns (pgx's own
// default, max(4, CPUs), starved a dispatcher's lease refreshes on two cores).
func TestConfigSizesThePool(t *testing.T) {
	cfg, _, err := Config("postgres://u:p@127.0.0.1:5432/db", "hermes_host")
	if err != nil || cfg.MaxConns != DefaultMaxConns {
		t.Fatalf("default pool: %d connections (%v), want %d", cfg.MaxConns, err, DefaultMaxConns)
	}
	cfg, _, err = Config("postgres://u:p@127.0.0.1:5432/db?pool_max_conns=3", "hermes_host")
	if err != nil || cfg.MaxConns != 3 {
		t.Fatalf("pool_max_conns=3: %d connections (%v)", cfg.MaxConns, err)
	}
	cfg, _, err = Config("host=127.0.0.1 user=u dbname=db pool_max_conns=40", "hermes_host")
	if err != nil || cfg.MaxConns != 40 {
		t.Fatalf("a DSN's pool_max_conns=40: %d connections (%v)", cfg.MaxConns, err)
	}
}
