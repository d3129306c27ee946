// Package hermesstate writes Hermes' state.db in the two shapes the host meets: schema 22
// (v0.19.0, the release the host pins and the scripted agent models) and schema 30 (a later
// release). The DDL is Hermes' own (hermes_state.py at schema 22; hermes_state_common.py's
// SCHEMA_SQL, DEFERRED_INDEX_SQL, FTS_SQL and FTS_TRIGRAM_SQL at schema 30), so the host's
// reader is tested against the tables, full-text indexes, triggers and unique title index
// Hermes creates. Tests build fixtures with it, and the scripted agent writes its rows with it.
//
// The write functions look at the columns the database has (PRAGMA table_info, read once
// per handle), so one API writes both shapes; asking for a value the shape cannot hold (a
// display_kind on schema 22) is an error rather than a row silently written differently.
package hermesstate

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"weak"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go
)

// The schema versions this package creates, as Hermes records them in schema_version.
const (
	V22 = 22 // v0.19.0: inline-content FTS, no display columns
	V30 = 30 // external-content FTS, display_kind/display_order, system_prompts table
)

var schemas = map[int]string{V22: schema22, V30: schema30}

// Create makes (or opens) a state.db at path in schema 22, the shape of the release the host
// pins. See CreateVersion.
func Create(ctx context.Context, path string) (*sql.DB, error) {
	return CreateVersion(ctx, path, V22)
}

// CreateVersion makes (or opens) a state.db at path with Hermes' DDL of the given schema
// version (V22 or V30), in WAL mode and with foreign keys enforced, as Hermes' own writer
// connection has them. An existing database recorded at another version is refused: this
// package creates shapes, it does not migrate them. The returned handle writes; close it.
func CreateVersion(ctx context.Context, path string, version int) (*sql.DB, error) {
	ddl, ok := schemas[version]
	if !ok {
		return nil, fmt.Errorf("create state.db %s: schema version %d is not one this package knows (%d, %d)", path, version, V22, V30)
	}
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() +
		"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("create state.db %s: %w", path, err)
	}
	if err := createSchema(ctx, db, ddl, version); err != nil {
		db.Close()
		return nil, fmt.Errorf("create state.db %s: %w", path, err)
	}
	return db, nil
}

func createSchema(ctx context.Context, db *sql.DB, ddl string, version int) error {
	stored, err := StoredVersion(ctx, db)
	if err != nil {
		return err
	}
	if stored != 0 && stored != version {
		return fmt.Errorf("it is at schema version %d, not %d", stored, version)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("schema %d: %w", version, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version (version) SELECT ? WHERE NOT EXISTS (SELECT 1 FROM schema_version)`, version); err != nil {
		return fmt.Errorf("record schema version: %w", err)
	}
	return tx.Commit()
}

// StoredVersion reads the version in schema_version, the one row Hermes keeps there; 0 when
// the database has no such table or row yet.
func StoredVersion(ctx context.Context, db Handle) (int, error) {
	var n int
	if err := queryRow(ctx, db, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'`, &n); err != nil || n == 0 {
		return 0, err
	}
	var v sql.NullInt64
	err := queryRow(ctx, db, `SELECT version FROM schema_version LIMIT 1`, &v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return int(v.Int64), err
}

func queryRow(ctx context.Context, db Handle, query string, dest ...any) error {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	return rows.Close()
}

// Handle is a *sql.DB, *sql.Tx or *sql.Conn on a state.db.
type Handle interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// layout is which columns and tables a database has.
type layout struct {
	sessions, messages map[string]bool
	tables             map[string]bool
}

// layouts caches a layout per handle, keyed weakly so a closed and collected handle leaves
// nothing behind; a handle of another type is asked every time.
var layouts sync.Map

func layoutOf(ctx context.Context, db Handle) (*layout, error) {
	switch h := db.(type) {
	case *sql.DB:
		return cachedLayout(ctx, h, db)
	case *sql.Tx:
		return cachedLayout(ctx, h, db)
	case *sql.Conn:
		return cachedLayout(ctx, h, db)
	}
	return readLayout(ctx, db)
}

func cachedLayout[T any](ctx context.Context, h *T, db Handle) (*layout, error) {
	key := weak.Make(h)
	if l, ok := layouts.Load(key); ok {
		return l.(*layout), nil
	}
	l, err := readLayout(ctx, db)
	if err != nil {
		return nil, err
	}
	if _, loaded := layouts.LoadOrStore(key, l); !loaded {
		runtime.AddCleanup(h, func(k weak.Pointer[T]) { layouts.Delete(k) }, key)
	}
	return l, nil
}

func readLayout(ctx context.Context, db Handle) (*layout, error) {
	l := &layout{tables: map[string]bool{}}
	var err error
	if l.sessions, err = Columns(ctx, db, "sessions"); err != nil {
		return nil, err
	}
	if l.messages, err = Columns(ctx, db, "messages"); err != nil {
		return nil, err
	}
	if len(l.sessions) == 0 || len(l.messages) == 0 {
		return nil, errors.New("state.db has no sessions or messages table: create it with Create or CreateVersion")
	}
	if l.tables, err = Tables(ctx, db); err != nil {
		return nil, err
	}
	return l, nil
}

// Columns is the set of a table's columns (PRAGMA table_info); empty for a missing table.
// Hermes adds columns over releases, so readers and writers go by what is there.
func Columns(ctx context.Context, db Handle, table string) (map[string]bool, error) {
	return names(ctx, db, `SELECT name FROM pragma_table_info(?)`, table)
}

// Tables is the set of the database's tables.
func Tables(ctx context.Context, db Handle) (map[string]bool, error) {
	return names(ctx, db, `SELECT name FROM sqlite_master WHERE type = 'table'`)
}

func names(ctx context.Context, db Handle, query string, args ...any) (map[string]bool, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("read state.db layout: %w", err)
	}
	defer rows.Close()
	set := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, fmt.Errorf("read state.db layout: %w", err)
		}
		set[name] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read state.db layout: %w", err)
	}
	return set, nil
}

// row collects the columns of one INSERT, keeping those the table has.
type row struct {
	table string
	has   map[string]bool
	cols  []string
	vals  []any
	err   error
}

// set writes value to col. A column the table lacks is skipped when the value is its zero
// (the shape simply does not record it) and an error otherwise.
func (r *row) set(col string, value any, zero bool) {
	if r.err != nil {
		return
	}
	if !r.has[col] {
		if !zero {
			r.err = fmt.Errorf("%s has no %s column in this schema version", r.table, col)
		}
		return
	}
	r.cols = append(r.cols, col)
	r.vals = append(r.vals, value)
}

func (r *row) insert(ctx context.Context, db Handle) error {
	if r.err != nil {
		return r.err
	}
	q := "INSERT INTO " + r.table + " (" + strings.Join(r.cols, ", ") + ") VALUES (" +
		strings.TrimSuffix(strings.Repeat("?, ", len(r.cols)), ", ") + ")"
	_, err := db.ExecContext(ctx, q, r.vals...)
	return err
}

// Session is one sessions row. Times are Unix seconds, as Hermes stores them.
type Session struct {
	ID, Source, Model, ParentID, EndReason string
	Title                                  string  // "" is NULL: tool sessions have none; set titles are unique
	StartedAt, EndedAt                     float64 // EndedAt 0 is NULL: the session is still open
	// SystemPrompt is stored on the session (Hermes writes no system message row): inline
	// at schema 22, in system_prompts by its SHA-256 at schema 30.
	SystemPrompt                      string
	MessageCount, ToolCallCount       int
	APICallCount                      int
	InputTokens, OutputTokens         int64
	CacheReadTokens, CacheWriteTokens int64
	ReasoningTokens                   int64
	EstimatedCostUSD, ActualCostUSD   float64 // 0 is NULL: not priced
}

// InsertSession writes one session row. Two sessions with the same non-empty Title are
// refused by the database's unique title index, as Hermes' own writes are.
func InsertSession(ctx context.Context, db Handle, s Session) error {
	l, err := layoutOf(ctx, db)
	if err != nil {
		return fmt.Errorf("insert session %s: %w", s.ID, err)
	}
	r := &row{table: "sessions", has: l.sessions}
	r.set("id", s.ID, false)
	r.set("source", s.Source, false)
	r.set("started_at", s.StartedAt, false)
	r.set("model", nullString(s.Model), s.Model == "")
	r.set("parent_session_id", nullString(s.ParentID), s.ParentID == "")
	r.set("title", nullString(s.Title), s.Title == "")
	r.set("ended_at", nullFloat(s.EndedAt), s.EndedAt == 0)
	r.set("end_reason", nullString(s.EndReason), s.EndReason == "")
	r.set("message_count", s.MessageCount, s.MessageCount == 0)
	r.set("tool_call_count", s.ToolCallCount, s.ToolCallCount == 0)
	r.set("api_call_count", s.APICallCount, s.APICallCount == 0)
	r.set("input_tokens", s.InputTokens, s.InputTokens == 0)
	r.set("output_tokens", s.OutputTokens, s.OutputTokens == 0)
	r.set("cache_read_tokens", s.CacheReadTokens, s.CacheReadTokens == 0)
	r.set("cache_write_tokens", s.CacheWriteTokens, s.CacheWriteTokens == 0)
	r.set("reasoning_tokens", s.ReasoningTokens, s.ReasoningTokens == 0)
	r.set("estimated_cost_usd", nullFloat(s.EstimatedCostUSD), s.EstimatedCostUSD == 0)
	r.set("actual_cost_usd", nullFloat(s.ActualCostUSD), s.ActualCostUSD == 0)
	if s.SystemPrompt != "" && l.sessions["system_prompt_hash"] && l.tables["system_prompts"] {
		// Schema 25 moved prompts into a content-addressed table; the inline column stays
		// only as a read fallback for rows written before.
		sum := sha256.Sum256([]byte(s.SystemPrompt))
		hash := hex.EncodeToString(sum[:])
		if _, err := db.ExecContext(ctx, `INSERT OR IGNORE INTO system_prompts (hash, prompt) VALUES (?, ?)`, hash, s.SystemPrompt); err != nil {
			return fmt.Errorf("insert session %s: store system prompt: %w", s.ID, err)
		}
		r.set("system_prompt_hash", hash, false)
	} else {
		r.set("system_prompt", nullString(s.SystemPrompt), s.SystemPrompt == "")
	}
	if err := r.insert(ctx, db); err != nil {
		return fmt.Errorf("insert session %s: %w", s.ID, err)
	}
	return nil
}

// Usage is what one step of a run adds to its session's counters.
type Usage struct {
	Messages  int // message_count: rows appended
	ToolCalls int // tool_call_count: tool calls made (entries of assistant tool_calls)
	APICalls  int // api_call_count: model requests
	InputTokens, OutputTokens,
	CacheReadTokens, CacheWriteTokens, ReasoningTokens int64
	EstimatedCostUSD float64
	// At is when it happened (Unix seconds). It moves schema 30's last_activity_at forward
	// and stamps session_model_usage; schema 22 has no activity column and skips it.
	At float64
}

// AddUsage adds u to the session's counters, as Hermes' append_message and
// update_token_counts do: cumulative, so a --resume keeps counting on the same row. Only
// the columns the database has are written, and the session's model gets its
// session_model_usage row (the empty task: the main agent loop) when tokens or calls were used.
func AddUsage(ctx context.Context, db Handle, sessionID string, u Usage) error {
	l, err := layoutOf(ctx, db)
	if err != nil {
		return fmt.Errorf("add usage to session %s: %w", sessionID, err)
	}
	var (
		sets []string
		args []any
	)
	add := func(col string, n any, zero bool) {
		if !zero && l.sessions[col] {
			sets = append(sets, fmt.Sprintf("%s = COALESCE(%s, 0) + ?", col, col))
			args = append(args, n)
		}
	}
	add("message_count", u.Messages, u.Messages == 0)
	add("tool_call_count", u.ToolCalls, u.ToolCalls == 0)
	add("api_call_count", u.APICalls, u.APICalls == 0)
	add("input_tokens", u.InputTokens, u.InputTokens == 0)
	add("output_tokens", u.OutputTokens, u.OutputTokens == 0)
	add("cache_read_tokens", u.CacheReadTokens, u.CacheReadTokens == 0)
	add("cache_write_tokens", u.CacheWriteTokens, u.CacheWriteTokens == 0)
	add("reasoning_tokens", u.ReasoningTokens, u.ReasoningTokens == 0)
	add("estimated_cost_usd", u.EstimatedCostUSD, u.EstimatedCostUSD == 0)
	if u.At != 0 && l.sessions["last_activity_at"] {
		sets = append(sets, "last_activity_at = max(COALESCE(last_activity_at, 0), ?)")
		args = append(args, u.At)
	}
	if len(sets) == 0 {
		return nil
	}
	res, err := db.ExecContext(ctx, "UPDATE sessions SET "+strings.Join(sets, ", ")+" WHERE id = ?", append(args, sessionID)...)
	if err != nil {
		return fmt.Errorf("add usage to session %s: %w", sessionID, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("add usage to session %s: no such session", sessionID)
	}
	used := u.APICalls != 0 || u.InputTokens != 0 || u.OutputTokens != 0 || u.CacheReadTokens != 0 ||
		u.CacheWriteTokens != 0 || u.ReasoningTokens != 0 || u.EstimatedCostUSD != 0
	if !used || !l.tables["session_model_usage"] {
		return nil
	}
	_, err = db.ExecContext(ctx, `INSERT INTO session_model_usage (session_id, model, billing_provider, billing_base_url,
			billing_mode, task, api_call_count, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
			reasoning_tokens, estimated_cost_usd, first_seen, last_seen)
		SELECT id, COALESCE(model, 'unknown'), COALESCE(billing_provider, ''), COALESCE(billing_base_url, ''),
			COALESCE(billing_mode, ''), '', ?, ?, ?, ?, ?, ?, ?, ?, ? FROM sessions WHERE id = ?
		ON CONFLICT (session_id, model, billing_provider, billing_base_url, billing_mode, task) DO UPDATE SET
			api_call_count = api_call_count + excluded.api_call_count,
			input_tokens = input_tokens + excluded.input_tokens,
			output_tokens = output_tokens + excluded.output_tokens,
			cache_read_tokens = cache_read_tokens + excluded.cache_read_tokens,
			cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens,
			reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens,
			estimated_cost_usd = estimated_cost_usd + excluded.estimated_cost_usd,
			last_seen = COALESCE(excluded.last_seen, last_seen)`,
		u.APICalls, u.InputTokens, u.OutputTokens, u.CacheReadTokens, u.CacheWriteTokens, u.ReasoningTokens,
		u.EstimatedCostUSD, nullFloat(u.At), nullFloat(u.At), sessionID)
	if err != nil {
		return fmt.Errorf("add usage to session %s: per-model usage: %w", sessionID, err)
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

// Message is one messages row. The zero value of each flag is the ordinary live row Hermes
// appends.
type Message struct {
	SessionID  string
	Role       string // user, assistant, tool (Hermes stores no system row)
	Content    string
	ToolCalls  []ToolCall // assistant messages that call tools
	ToolName   string     // tool messages: which tool answered
	ToolCallID string     // tool messages: which call they answer
	Timestamp  float64

	TokenCount   int    // 0 is NULL
	FinishReason string // "" is NULL
	Reasoning    string // "" is NULL

	// Inactive writes active=0: a turn the user took back (rewind, undo), or, together
	// with Compacted, an original that in-place compaction summarized away.
	Inactive bool
	// Compacted writes compacted=1. Hermes archives compacted rows as active=0,
	// compacted=1; set both for that shape.
	Compacted bool
	// DisplayKind is schema 30's display_kind ("hidden" marks model-facing scaffolding a
	// person never sees). Schema 22 has no such column: InsertMessage refuses a non-empty
	// one there rather than write a row that would read as ordinary.
	DisplayKind string
}

type wireCall struct {
	ID       string       `json:"id"`
	CallID   string       `json:"call_id"`
	Type     string       `json:"type"`
	Function wireFunction `json:"function"`
}

type wireFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// EncodeToolCalls renders tool calls the way Hermes stores them in messages.tool_calls,
// including the call_id key it adds next to OpenAI's id.
func EncodeToolCalls(calls []ToolCall) (string, error) {
	wire := make([]wireCall, len(calls))
	for i, c := range calls {
		wire[i] = wireCall{ID: c.ID, CallID: c.ID, Type: "function", Function: wireFunction{Name: c.Name, Arguments: c.Arguments}}
	}
	b, err := json.Marshal(wire)
	if err != nil {
		return "", fmt.Errorf("encode tool calls: %w", err)
	}
	return string(b), nil
}

// InsertMessage writes one message row; the database's triggers index it for full-text
// search as Hermes' do.
func InsertMessage(ctx context.Context, db Handle, m Message) error {
	l, err := layoutOf(ctx, db)
	if err != nil {
		return fmt.Errorf("insert message in session %s: %w", m.SessionID, err)
	}
	var calls any
	if len(m.ToolCalls) > 0 {
		enc, err := EncodeToolCalls(m.ToolCalls)
		if err != nil {
			return err
		}
		calls = enc
	}
	r := &row{table: "messages", has: l.messages}
	r.set("session_id", m.SessionID, false)
	r.set("role", m.Role, false)
	r.set("content", m.Content, m.Content == "")
	r.set("tool_call_id", nullString(m.ToolCallID), m.ToolCallID == "")
	r.set("tool_calls", calls, calls == nil)
	r.set("tool_name", nullString(m.ToolName), m.ToolName == "")
	r.set("timestamp", m.Timestamp, false)
	r.set("token_count", nullInt(m.TokenCount), m.TokenCount == 0)
	r.set("finish_reason", nullString(m.FinishReason), m.FinishReason == "")
	r.set("reasoning", nullString(m.Reasoning), m.Reasoning == "")
	// Hermes writes active explicitly: rows written when the reconciler had added the
	// column without its default read as NULL and vanished from its active=1 views.
	r.set("active", boolInt(!m.Inactive), !m.Inactive)
	r.set("compacted", boolInt(m.Compacted), !m.Compacted)
	r.set("display_kind", nullString(m.DisplayKind), m.DisplayKind == "")
	if err := r.insert(ctx, db); err != nil {
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

func nullInt(n int) any {
	if n == 0 {
		return nil
	}
	return n
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
