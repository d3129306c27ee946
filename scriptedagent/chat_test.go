package scriptedagent

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A run with no manifest.json is a chat turn: it stores the user message, a tool call, its
// result and the model's answer, prints the answer and the session id, and --resume
// appends to the same session.
func TestAChatTurnStoresItsRowsAndResumes(t *testing.T) {
	var log endpointLog
	srv := log.start(t)
	home := t.TempDir()
	t.Chdir(home)
	t.Setenv(EnvHome, home)
	config := "model:\n  provider: hermes-host\n  default: demo-worker\nproviders:\n  hermes-host:\n    base_url: " + srv.URL + "/v1\n    key_env: TEST_GATEWAY_KEY\n"
	if err := os.WriteFile(filepath.Join(home, "config.yaml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TEST_GATEWAY_KEY", "the-org-key")

	var out, errb bytes.Buffer
	if code := Main(context.Background(), []string{"chat", "-q", "hello there", "-Q", "--source", "tool", "--max-turns", "3"}, &out, &errb); code != ExitOK {
		t.Fatalf("exit %d\n%s", code, errb.String())
	}
	m := regexp.MustCompile(`(?m)^session_id: (\S+)$`).FindStringSubmatch(errb.String())
	if m == nil {
		t.Fatalf("no session_id line:\n%s", errb.String())
	}
	if strings.TrimSpace(out.String()) == "" {
		t.Fatal("no answer on stdout")
	}
	db, err := sql.Open("sqlite", filepath.Join(home, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	roles := func() string {
		rows, err := db.Query(`SELECT role || coalesce(':' || tool_name, '') FROM messages WHERE session_id = ? ORDER BY id`, m[1])
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var got []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			got = append(got, s)
		}
		return strings.Join(got, " ")
	}
	if got, want := roles(), "user assistant tool:session_search assistant"; got != want {
		t.Fatalf("rows %q, want %q", got, want)
	}

	out.Reset()
	errb.Reset()
	if code := Main(context.Background(), []string{"chat", "-q", "and again", "-Q", "--source", "tool", "--max-turns", "3", "--resume", m[1]}, &out, &errb); code != ExitOK {
		t.Fatalf("resume: exit %d\n%s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "session_id: "+m[1]) || !strings.Contains(errb.String(), "Resumed session "+m[1]) {
		t.Fatalf("resume printed:\n%s", errb.String())
	}
	if got := roles(); strings.Count(got, "user") != 2 || strings.Count(got, "tool:") != 2 {
		t.Fatalf("rows after resume %q", got)
	}
}
