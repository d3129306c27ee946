package hermesstate

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"
)

var versions = []int{V22, V30}

func create(t *testing.T, version int) *sql.DB {
	t.Helper()
	db, err := CreateVersion(context.Background(), filepath.Join(t.TempDir(), "state.db"), version)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func scan(t *testing.T, db *sql.DB, query string, dest ...any) {
	t.Helper()
	if err := db.QueryRow(query).Scan(dest...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

func objects(t *testing.T, db *sql.DB) map[string]string {
	t.Helper()
	rows, err := db.Query(`SELECT type, name FROM sqlite_master`)
	must(t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var typ, name string
		must(t, rows.Scan(&typ, &name))
		out[name] = typ
	}
	must(t, rows.Err())
	return out
}

func TestCreateVersionHasHermesObjects(t *testing.T) {
	both := []string{
		"table:sessions", "table:messages", "table:schema_version", "table:state_meta", "table:session_model_usage",
		"table:compression_locks", "table:async_delegations", "table:messages_fts", "table:messages_fts_trigram",
		"trigger:messages_fts_insert", "trigger:messages_fts_delete", "trigger:messages_fts_update",
		"trigger:messages_fts_trigram_insert", "trigger:messages_fts_trigram_delete", "trigger:messages_fts_trigram_update",
		"index:idx_sessions_started", "index:idx_sessions_title_unique", "index:idx_messages_session",
		"index:idx_messages_session_active",
	}
	only := map[int][]string{
		V30: {"table:system_prompts", "table:session_turn_leases", "view:messages_fts_src", "view:messages_fts_trigram_src",
			"index:idx_messages_session_id", "index:idx_messages_display_page", "trigger:messages_display_order_insert"},
	}
	for _, v := range versions {
		t.Run(name(v), func(t *testing.T) {
			db := create(t, v)
			got := objects(t, db)
			want := append(append([]string{}, both...), only[v]...)
			for _, w := range want {
				typ, n, _ := strings.Cut(w, ":")
				if got[n] != typ {
					t.Errorf("%s %s missing (have %q)", typ, n, got[n])
				}
			}
			for other, names := range only {
				if other == v {
					continue
				}
				for _, w := range names {
					if _, n, _ := strings.Cut(w, ":"); got[n] != "" {
						t.Errorf("schema %d has %s, which only schema %d has", v, n, other)
					}
				}
			}
			var mode string
			scan(t, db, `PRAGMA journal_mode`, &mode)
			if mode != "wal" {
				t.Errorf("journal_mode = %s, want wal", mode)
			}
			stored, err := StoredVersion(context.Background(), db)
			if err != nil || stored != v {
				t.Errorf("schema_version = %d, %v; want %d", stored, err, v)
			}
			var titleIndex string
			scan(t, db, `SELECT sql FROM sqlite_master WHERE name = 'idx_sessions_title_unique'`, &titleIndex)
			if !strings.Contains(titleIndex, "UNIQUE") || !strings.Contains(titleIndex, "WHERE title IS NOT NULL") {
				t.Errorf("title index = %s", titleIndex)
			}
			_, v30Column := columns(t, db, "messages")["display_kind"]
			if v30Column != (v == V30) {
				t.Errorf("messages.display_kind present = %v at schema %d", v30Column, v)
			}
		})
	}
}

func name(v int) string { return "v" + map[int]string{V22: "22", V30: "30"}[v] }

func columns(t *testing.T, db *sql.DB, table string) map[string]struct{} {
	t.Helper()
	rows, err := db.Query(`SELECT name FROM pragma_table_info(?)`, table)
	must(t, err)
	defer rows.Close()
	out := map[string]struct{}{}
	for rows.Next() {
		var n string
		must(t, rows.Scan(&n))
		out[n] = struct{}{}
	}
	return out
}

func TestCreateKeepsTheSchemaItFound(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Create(ctx, path)
	must(t, err)
	must(t, InsertSession(ctx, db, Session{ID: "a", Source: "tool", StartedAt: 1}))
	must(t, db.Close())

	again, err := Create(ctx, path)
	must(t, err)
	var n int
	scan(t, again, `SELECT count(*) FROM sessions`, &n)
	if v, _ := StoredVersion(ctx, again); v != V22 || n != 1 {
		t.Errorf("reopened: version %d, %d sessions", v, n)
	}
	must(t, again.Close())
	if db, err := CreateVersion(ctx, path, V30); err == nil {
		db.Close()
		t.Fatal("a schema 22 database was opened as schema 30")
	}
	if _, err := CreateVersion(ctx, filepath.Join(t.TempDir(), "x.db"), 23); err == nil {
		t.Fatal("unknown schema version accepted")
	}
}

func TestTitlesAreNullOrUnique(t *testing.T) {
	ctx := context.Background()
	for _, v := range versions {
		t.Run(name(v), func(t *testing.T) {
			db := create(t, v)
			must(t, InsertSession(ctx, db, Session{ID: "a", Source: "tool", StartedAt: 1}))
			must(t, InsertSession(ctx, db, Session{ID: "b", Source: "tool", StartedAt: 2}))
			must(t, InsertSession(ctx, db, Session{ID: "c", Source: "cli", StartedAt: 3, Title: "weekly report"}))
			err := InsertSession(ctx, db, Session{ID: "d", Source: "cli", StartedAt: 4, Title: "weekly report"})
			if err == nil || !strings.Contains(err.Error(), "UNIQUE") {
				t.Fatalf("second session titled alike: %v; want a UNIQUE constraint error", err)
			}
			var nulls int
			scan(t, db, `SELECT count(*) FROM sessions WHERE title IS NULL AND ended_at IS NULL`, &nulls)
			if nulls != 2 {
				t.Errorf("%d open sessions without a title, want 2", nulls)
			}
		})
	}
}

func TestSystemPromptWhereHermesKeepsIt(t *testing.T) {
	ctx := context.Background()
	prompt := "You are Hermes, an agent."
	sum := sha256.Sum256([]byte(prompt))
	for _, v := range versions {
		t.Run(name(v), func(t *testing.T) {
			db := create(t, v)
			must(t, InsertSession(ctx, db, Session{ID: "a", Source: "tool", StartedAt: 1, SystemPrompt: prompt}))
			var inline sql.NullString
			scan(t, db, `SELECT system_prompt FROM sessions WHERE id = 'a'`, &inline)
			if v == V22 {
				if inline.String != prompt {
					t.Errorf("inline prompt = %q", inline.String)
				}
				return
			}
			var hash, stored string
			scan(t, db, `SELECT s.system_prompt_hash, p.prompt FROM sessions s JOIN system_prompts p ON p.hash = s.system_prompt_hash`, &hash, &stored)
			if inline.Valid || hash != hex.EncodeToString(sum[:]) || stored != prompt {
				t.Errorf("schema 30 prompt: inline %v, hash %s, stored %q", inline, hash, stored)
			}
		})
	}
}

func TestMessagesAreIndexedAndFlagged(t *testing.T) {
	ctx := context.Background()
	for _, v := range versions {
		t.Run(name(v), func(t *testing.T) {
			db := create(t, v)
			must(t, InsertSession(ctx, db, Session{ID: "a", Source: "tool", StartedAt: 1}))
			must(t, InsertMessage(ctx, db, Message{SessionID: "a", Role: "user", Content: "rotate the staging keys", Timestamp: 1}))
			must(t, InsertMessage(ctx, db, Message{SessionID: "a", Role: "assistant", Timestamp: 2, FinishReason: "tool_calls",
				ToolCalls: []ToolCall{{ID: "call_1", Name: "terminal", Arguments: `{"command":"vault rotate"}`}}}))
			must(t, InsertMessage(ctx, db, Message{SessionID: "a", Role: "user", Content: "old", Timestamp: 3, Inactive: true, Compacted: true}))
			// A tool result longer than schema 30's FTS prefix: its tail is indexed only at 22.
			must(t, InsertMessage(ctx, db, Message{SessionID: "a", Role: "tool", ToolName: "terminal", ToolCallID: "call_1",
				Content: strings.Repeat("x ", 5000) + "zebrafish", Timestamp: 4}))

			for q, want := range map[string]int{`"staging"`: 1, `"vault"`: 1, `"terminal"`: 2, `"zebrafish"`: map[int]int{V22: 1, V30: 0}[v]} {
				var n int
				if err := db.QueryRow(`SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?`, q).Scan(&n); err != nil || n != want {
					t.Errorf("messages_fts MATCH %s: %d, %v; want %d", q, n, err, want)
				}
			}
			var tri int
			scan(t, db, `SELECT count(*) FROM messages_fts_trigram WHERE messages_fts_trigram MATCH '"ebrafis"'`, &tri)
			if want := map[int]int{V22: 1, V30: 0}[v]; tri != want { // schema 30's trigram leaves tool rows out
				t.Errorf("trigram hits in the tool row: %d, want %d", tri, want)
			}
			var active, compacted int
			scan(t, db, `SELECT active, compacted FROM messages WHERE content = 'old'`, &active, &compacted)
			var calls, reason string
			scan(t, db, `SELECT tool_calls, finish_reason FROM messages WHERE role = 'assistant'`, &calls, &reason)
			if active != 0 || compacted != 1 || reason != "tool_calls" || !strings.Contains(calls, `"call_id":"call_1"`) {
				t.Errorf("flags %d/%d, finish %q, calls %s", active, compacted, reason, calls)
			}
			err := InsertMessage(ctx, db, Message{SessionID: "a", Role: "user", Content: "scaffold", Timestamp: 5, DisplayKind: "hidden"})
			if v == V22 {
				if err == nil {
					t.Fatal("display_kind written on schema 22")
				}
			} else {
				must(t, err)
				var kind string
				scan(t, db, `SELECT display_kind FROM messages WHERE content = 'scaffold'`, &kind)
				if kind != "hidden" {
					t.Errorf("display_kind = %q", kind)
				}
			}
			if err := InsertMessage(ctx, db, Message{SessionID: "nope", Role: "user", Timestamp: 6}); err == nil {
				t.Error("a message for a session that does not exist was written: foreign keys are off")
			}
		})
	}
}

func TestAddUsageIsCumulative(t *testing.T) {
	ctx := context.Background()
	for _, v := range versions {
		t.Run(name(v), func(t *testing.T) {
			db := create(t, v)
			must(t, InsertSession(ctx, db, Session{ID: "a", Source: "tool", Model: "demo", StartedAt: 1}))
			step := Usage{Messages: 2, ToolCalls: 1, APICalls: 1, InputTokens: 100, OutputTokens: 20, At: 50}
			must(t, AddUsage(ctx, db, "a", step))
			step.At = 40 // a clock that went back does not move activity backwards
			must(t, AddUsage(ctx, db, "a", step))

			var msgs, tools, calls, in, out int
			scan(t, db, `SELECT message_count, tool_call_count, api_call_count, input_tokens, output_tokens FROM sessions WHERE id = 'a'`,
				&msgs, &tools, &calls, &in, &out)
			if msgs != 4 || tools != 2 || calls != 2 || in != 200 || out != 40 {
				t.Errorf("counters %d %d %d %d %d", msgs, tools, calls, in, out)
			}
			var model string
			var perModel int
			scan(t, db, `SELECT model, input_tokens FROM session_model_usage WHERE session_id = 'a' AND task = ''`, &model, &perModel)
			if model != "demo" || perModel != 200 {
				t.Errorf("session_model_usage: %s %d", model, perModel)
			}
			if v == V30 {
				var at float64
				scan(t, db, `SELECT last_activity_at FROM sessions WHERE id = 'a'`, &at)
				if at != 50 {
					t.Errorf("last_activity_at = %v, want 50", at)
				}
			}
			if err := AddUsage(ctx, db, "nope", step); err == nil {
				t.Error("usage added to a session that does not exist")
			}
		})
	}
}

func TestWritesThroughATransactionAndAConnection(t *testing.T) {
	ctx := context.Background()
	db := create(t, V30)
	tx, err := db.BeginTx(ctx, nil)
	must(t, err)
	must(t, InsertSession(ctx, tx, Session{ID: "a", Source: "tool", StartedAt: 1}))
	must(t, InsertMessage(ctx, tx, Message{SessionID: "a", Role: "user", Content: "hi", Timestamp: 1}))
	must(t, tx.Commit())
	conn, err := db.Conn(ctx)
	must(t, err)
	defer conn.Close()
	must(t, InsertMessage(ctx, conn, Message{SessionID: "a", Role: "user", Content: "again", Timestamp: 2, DisplayKind: "steer"}))
	var n int
	scan(t, db, `SELECT count(*) FROM messages WHERE session_id = 'a'`, &n)
	if n != 2 {
		t.Errorf("%d messages", n)
	}
}
