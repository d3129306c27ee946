// Package hermesstate writes Hermes' state.db layout: the sessions and messages tables the
// host reads, in the shape of Hermes' own schema (hermes_state_common.py, SCHEMA_SQL,
// schema version 30). Tests build fixtures with it, and the scripted agent that stands in
// for Hermes writes the same rows, so the host's reader is checked against one layout.
//
// Only the columns the host reads, and the ones Hermes declares NOT NULL, are kept; Hermes
// adds columns over time and the reader copes with any of the optional ones being missing.
package hermesstate

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go
)

// Schema creates the sessions and messages tables and the indexes Hermes declares on them.
const Schema = `
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    user_id TEXT,
    model TEXT,
    model_config TEXT,
    system_prompt TEXT,
    parent_session_id TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0,
    cache_read_tokens INTEGER DEFAULT 0,
    cache_write_tokens INTEGER DEFAULT 0,
    reasoning_tokens INTEGER DEFAULT 0,
    billing_provider TEXT,
    estimated_cost_usd REAL,
    actual_cost_usd REAL,
    cost_status TEXT,
    title TEXT,
    last_activity_at REAL,
    api_call_count INTEGER DEFAULT 0,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id)
);

CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL,
    content TEXT,
    tool_call_id TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    timestamp REAL NOT NULL,
    token_count INTEGER,
    finish_reason TEXT,
    reasoning TEXT,
    active INTEGER NOT NULL DEFAULT 1
);

CREATE INDEX IF NOT EXISTS idx_sessions_source ON sessions(source);
CREATE INDEX IF NOT EXISTS idx_sessions_parent ON sessions(parent_session_id);
CREATE INDEX IF NOT EXISTS idx_sessions_started ON sessions(started_at DESC);
CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp);
CREATE INDEX IF NOT EXISTS idx_messages_session_id ON messages(session_id, id);
CREATE INDEX IF NOT EXISTS idx_messages_assistant_calls_by_session
    ON messages(session_id)
    WHERE role = 'assistant' AND tool_calls IS NOT NULL;
`

// SchemaVersion is the Hermes schema version this layout follows.
const SchemaVersion = 30

// Create makes (or opens) a state.db at path in WAL mode, as Hermes does, with the schema.
// The returned handle writes; close it when done.
func Create(ctx context.Context, path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		return nil, fmt.Errorf("create state.db %s: %w", path, err)
	}
	if _, err := db.ExecContext(ctx, Schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("create state.db schema in %s: %w", path, err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO schema_version (version) SELECT ? WHERE NOT EXISTS (SELECT 1 FROM schema_version)`, SchemaVersion); err != nil {
		db.Close()
		return nil, fmt.Errorf("record schema version in %s: %w", path, err)
	}
	return db, nil
}

// Execer is a *sql.DB or a *sql.Tx.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Session is one sessions row. Times are Unix seconds, as Hermes stores them.
type Session struct {
	ID, Source, Model, ParentID, Title, EndReason string
	StartedAt, EndedAt                            float64 // EndedAt 0: still open
	MessageCount, ToolCallCount                   int
	InputTokens, OutputTokens                     int64
	CacheReadTokens, CacheWriteTokens             int64
	ReasoningTokens                               int64
	EstimatedCostUSD                              float64
}

// InsertSession writes one session row.
func InsertSession(ctx context.Context, db Execer, s Session) error {
	_, err := db.ExecContext(ctx, `INSERT INTO sessions (id, source, model, parent_session_id, started_at, ended_at,
		end_reason, message_count, tool_call_count, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
		reasoning_tokens, estimated_cost_usd, title)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		s.ID, s.Source, nullString(s.Model), nullString(s.ParentID), s.StartedAt, nullFloat(s.EndedAt),
		nullString(s.EndReason), s.MessageCount, s.ToolCallCount, s.InputTokens, s.OutputTokens, s.CacheReadTokens,
		s.CacheWriteTokens, s.ReasoningTokens, nullFloat(s.EstimatedCostUSD), nullString(s.Title))
	if err != nil {
		return fmt.Errorf("insert session %s: %w", s.ID, err)
	}
	return nil
}

// ToolCall is one entry of an assistant message's tool_calls, OpenAI's function-call shape,
// which is what Hermes stores as JSON.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string // JSON text, as the model sent it
}

// Message is one messages row.
type Message struct {
	SessionID  string
	Role       string // system, user, assistant, tool
	Content    string
	ToolCalls  []ToolCall // assistant messages that call tools
	ToolName   string     // tool messages: which tool answered
	ToolCallID string     // tool messages: which call they answer
	Timestamp  float64
}

type wireCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function wireFunction `json:"function"`
}

type wireFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// EncodeToolCalls renders tool calls the way Hermes stores them in messages.tool_calls.
func EncodeToolCalls(calls []ToolCall) (string, error) {
	wire := make([]wireCall, len(calls))
	for i, c := range calls {
		wire[i] = wireCall{ID: c.ID, Type: "function", Function: wireFunction{Name: c.Name, Arguments: c.Arguments}}
	}
	b, err := json.Marshal(wire)
	if err != nil {
		return "", fmt.Errorf("encode tool calls: %w", err)
	}
	return string(b), nil
}

// InsertMessage writes one message row.
func InsertMessage(ctx context.Context, db Execer, m Message) error {
	var calls any
	if len(m.ToolCalls) > 0 {
		enc, err := EncodeToolCalls(m.ToolCalls)
		if err != nil {
			return err
		}
		calls = enc
	}
	_, err := db.ExecContext(ctx, `INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, tool_name, timestamp)
		VALUES (?, ?, ?, ?, ?, ?, ?)`,
		m.SessionID, m.Role, m.Content, nullString(m.ToolCallID), calls, nullString(m.ToolName), m.Timestamp)
	if err != nil {
		return fmt.Errorf("insert message in session %s: %w", m.SessionID, err)
	}
	return nil
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func nullFloat(f float64) any {
	if f == 0 {
		return nil
	}
	return f
}
