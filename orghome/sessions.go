package orghome

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"hermeshost/orghome/hermesstate"
)

// ErrNoSessions says the home has no state.db yet: Hermes has not run there. It is a
// state to show ("no sessions yet"), not a failure.
var ErrNoSessions = errors.New("no sessions yet: the home has no state.db")

// ErrSessionNotFound is returned by Transcript for an id the database does not hold.
var ErrSessionNotFound = errors.New("session not found")

// StatusBusy is the Status of a page the database could not answer in time, because
// Hermes held it (a checkpoint, a WAL recovery). Reading never blocks the agent; the
// dashboard shows this and the operator tries again.
const StatusBusy = "busy, try again"

// StatusInterrupted is the Status of a page the database cannot answer until Hermes opens
// it again: a write of Hermes' was cut off (the process killed mid-transaction) and left a
// hot journal, or a WAL only a writer can recover. The host, which never writes state.db,
// cannot roll it back; Hermes does when it next starts in the home (the org's next job or
// chat), and nothing it committed is lost.
const StatusInterrupted = "interrupted write: Hermes recovers it when it next starts"

// StateFile is Hermes' session store in a home (WAL mode: beside it its -wal and -shm).
const StateFile = "state.db"

// readBusyTimeout bounds how long one read waits for Hermes. In WAL mode a reader is not
// blocked by a writer at all; only a checkpoint or recovery can make it wait.
const readBusyTimeout = 2 * time.Second

// StateDB reads a home's state.db, read-only. Safe for concurrent use; Close when done.
type StateDB struct {
	home *Home
	db   *sql.DB

	mu      sync.Mutex
	layout  *stateLayout // learned on first use; retried while the database is busy
	summary string       // the SELECT list for Session rows
	cache   *resultCache // answers kept while the database is unchanged (Home.State's only)
}

// stateLayout is which optional columns and tables this database has: Hermes adds columns
// over versions (schema 22 has no display_kind, schema 30 keeps prompts in system_prompts),
// and an older state.db lacks the newer ones.
type stateLayout struct {
	sessions map[string]bool
	messages map[string]bool
	tables   map[string]bool
	// visible is the SQL predicate, over messages aliased m, for the rows a person reads.
	visible string
}

// visibleRows says which messages a person reads, in the columns this database has: the
// live conversation, as Hermes' own default view (get_messages, the history it restores)
// reads it, active=1 rows in id order, without schema 30's display_kind 'hidden' rows,
// the scaffolding only the model sees, which its search and display views leave out.
// Left out with them: active=0 alone, a turn the user took back (rewind, undo), and
// active=0 with compacted=1, an original that compaction summarized away. (Hermes' search
// and its schema-30 display view do show those originals, merged across compaction
// generations; here the summary that replaced them stands for them.) A NULL active is a
// row written while a column default was missing, which Hermes heals to 1 on its next
// open, so it counts as active.
func visibleRows(cols map[string]bool) string {
	var conds []string
	if cols["active"] {
		conds = append(conds, "m.active IS NOT 0")
	}
	if cols["compacted"] {
		conds = append(conds, "m.compacted IS NOT 1")
	}
	if cols["display_kind"] {
		conds = append(conds, "m.display_kind IS NOT 'hidden'")
	}
	if len(conds) == 0 {
		return "1"
	}
	return strings.Join(conds, " AND ")
}

// OpenState opens the home's state.db read-only: SQLite's mode=ro and query_only, so the
// host can never write it, and WAL readers never block the running agent.
func (h *Home) OpenState() (*StateDB, error) { return h.openState(readBusyTimeout) }

func (h *Home) openState(busyTimeout time.Duration) (*StateDB, error) {
	abs, exists, err := h.regularFile(StateFile)
	if err != nil {
		return nil, fmt.Errorf("open sessions: %w", err)
	}
	if !exists {
		return nil, fmt.Errorf("org %s: %w", h.ID, ErrNoSessions)
	}
	// SQLite opens its sidecars by path and maps -shm writable: a link planted in their
	// place would make the host read, or scribble on, a file outside the home.
	for _, side := range []string{"-wal", "-shm", "-journal"} {
		if _, _, err := h.regularFile(StateFile + side); err != nil {
			return nil, fmt.Errorf("open sessions: %w", err)
		}
	}
	dsn := "file:" + (&url.URL{Path: abs}).EscapedPath() + "?mode=ro" +
		"&_pragma=" + url.QueryEscape(fmt.Sprintf("busy_timeout(%d)", busyTimeout.Milliseconds())) +
		"&_pragma=" + url.QueryEscape("query_only(1)")
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open sessions of org %s: %w", h.ID, err)
	}
	return &StateDB{home: h, db: db}, nil
}

// Close releases the database.
func (s *StateDB) Close() error {
	s.cache.close()
	return s.db.Close()
}

// stateStatus is the page Status a read error stands for: StatusBusy or StatusInterrupted,
// or "" for an error that is no state of Hermes'.
func stateStatus(err error) string {
	switch {
	case isInterrupted(err):
		return StatusInterrupted
	case isBusy(err):
		return StatusBusy
	}
	return ""
}

// isInterrupted says whether a SQLite error means "a write Hermes did not finish is in the
// way, and only a read-write open recovers it": a read-only connection meeting a hot
// journal, or a WAL that needs recovery it cannot write.
func isInterrupted(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() {
	case sqlite3.SQLITE_READONLY_ROLLBACK, sqlite3.SQLITE_READONLY_RECOVERY, sqlite3.SQLITE_READONLY_CANTINIT:
		return true
	}
	return false
}

// isBusy says whether a SQLite error means "Hermes holds the database right now".
func isBusy(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return true
	case sqlite3.SQLITE_IOERR:
		// A read-only connection sees a brief I/O error while the writer resets the WAL;
		// Hermes' own read-only opener retries it for the same reason.
		return true
	}
	return false
}

func (s *StateDB) load(ctx context.Context) (*stateLayout, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.layout != nil {
		return s.layout, nil
	}
	l := &stateLayout{}
	var err error
	if l.sessions, err = s.columns(ctx, "sessions"); err != nil {
		return nil, err
	}
	if l.messages, err = s.columns(ctx, "messages"); err != nil {
		return nil, err
	}
	for _, need := range []string{"id", "started_at"} {
		if !l.sessions[need] {
			return nil, fmt.Errorf("state.db of org %s: sessions has no %s column: not Hermes' layout", s.home.ID, need)
		}
	}
	for _, need := range []string{"id", "session_id", "role"} {
		if !l.messages[need] {
			return nil, fmt.Errorf("state.db of org %s: messages has no %s column: not Hermes' layout", s.home.ID, need)
		}
	}
	if l.tables, err = hermesstate.Tables(ctx, s.db); err != nil {
		return nil, err
	}
	l.visible = visibleRows(l.messages)
	s.layout = l
	s.summary = sessionSelect(l.sessions)
	return l, nil
}

func (s *StateDB) columns(ctx context.Context, table string) (map[string]bool, error) {
	cols, err := hermesstate.Columns(ctx, s.db, table)
	if err != nil {
		return nil, err
	}
	if len(cols) == 0 {
		// A state.db Hermes created but has not yet given its schema reads as empty.
		return nil, fmt.Errorf("org %s: state.db has no %s table yet: %w", s.home.ID, table, ErrNoSessions)
	}
	return cols, nil
}

// Session is one row of the sessions list. Counters Hermes did not record (an older
// schema) are nil, so the page can show "—" rather than a misleading 0.
type Session struct {
	ID           string
	Source       string // cli, tool, telegram, ...
	Model        string
	ParentID     string // set for subagent runs and compression continuations
	Title        string
	StartedAt    time.Time
	EndedAt      time.Time // zero while open
	EndReason    string
	MessageCount int
	Tokens       *TokenCounts
	CostUSD      *float64 // actual cost when Hermes knows it, else its estimate
}

// TokenCounts are the token counters Hermes keeps per session.
type TokenCounts struct {
	Input, Output, CacheRead, CacheWrite, Reasoning int64
}

// Total is every token counted.
func (t TokenCounts) Total() int64 {
	return t.Input + t.Output + t.CacheRead + t.CacheWrite + t.Reasoning
}

// optional session columns, in the order sessionSelect lists them after the fixed ones.
var sessionOptional = []string{
	"source", "model", "parent_session_id", "title", "ended_at", "end_reason", "message_count",
	"input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
	"actual_cost_usd", "estimated_cost_usd",
}

func sessionSelect(cols map[string]bool) string {
	var b strings.Builder
	b.WriteString("s.id, s.started_at")
	for _, c := range sessionOptional {
		if cols[c] {
			b.WriteString(", s." + c)
		} else {
			b.WriteString(", NULL")
		}
	}
	return b.String()
}

type rowScanner interface{ Scan(dest ...any) error }

// scanSession reads one row of sessionSelect; it also returns started_at as stored, which
// the cursor needs exactly (a time.Time does not round-trip every float64).
func scanSession(r rowScanner, hasTokens, hasCost bool) (Session, float64, error) {
	var (
		s                               Session
		started                         float64
		source, model, parent, title    sql.NullString
		ended                           sql.NullFloat64
		endReason                       sql.NullString
		msgs                            sql.NullInt64
		in, out, cacheR, cacheW, reason sql.NullInt64
		actual, estimated               sql.NullFloat64
	)
	if err := r.Scan(&s.ID, &started, &source, &model, &parent, &title, &ended, &endReason, &msgs,
		&in, &out, &cacheR, &cacheW, &reason, &actual, &estimated); err != nil {
		return Session{}, 0, err
	}
	s.StartedAt = unixSeconds(started)
	s.Source, s.Model, s.ParentID, s.Title, s.EndReason = source.String, model.String, parent.String, title.String, endReason.String
	if ended.Valid {
		s.EndedAt = unixSeconds(ended.Float64)
	}
	s.MessageCount = int(msgs.Int64)
	if hasTokens {
		s.Tokens = &TokenCounts{in.Int64, out.Int64, cacheR.Int64, cacheW.Int64, reason.Int64}
	}
	if hasCost {
		switch {
		case actual.Valid && actual.Float64 > 0:
			s.CostUSD = &actual.Float64
		case estimated.Valid:
			s.CostUSD = &estimated.Float64
		}
	}
	return s, started, nil
}

func unixSeconds(f float64) time.Time {
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)).UTC()
}

// SessionQuery asks for one page of sessions, newest first.
type SessionQuery struct {
	Search string // matched against titles and message content; empty lists all
	After  string // the NextCursor of the previous page; empty starts at the newest
	Limit  int    // page size; 0 means 50
}

// SessionPage is one page of the sessions list.
type SessionPage struct {
	Sessions   []Session
	NextCursor string // empty on the last page
	Status     string // StatusBusy or StatusInterrupted when the database could not answer; Sessions is then empty
}

// cursor is the keyset position: the last row's started_at and id. Paging by it is
// stable while Hermes inserts new sessions, and costs the same on page 200 as on page 1.
type cursor struct {
	StartedAt float64
	ID        string
}

func (c cursor) encode() string {
	raw := strconv.FormatFloat(c.StartedAt, 'g', -1, 64) + "\x00" + c.ID
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

func decodeCursor(s string) (cursor, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return cursor{}, fmt.Errorf("bad sessions cursor: %w", err)
	}
	at, id, ok := strings.Cut(string(raw), "\x00")
	if !ok {
		return cursor{}, errors.New("bad sessions cursor")
	}
	f, err := strconv.ParseFloat(at, 64)
	if err != nil {
		return cursor{}, fmt.Errorf("bad sessions cursor: %w", err)
	}
	return cursor{f, id}, nil
}

// likePattern escapes LIKE wildcards so a search matches its text literally.
func likePattern(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return "%" + r.Replace(s) + "%"
}

// maxSearchBytes caps the search text, as Hermes caps its FTS5 query input (2,048 chars):
// a dashboard search needs no more, and an unbounded one is an unbounded query plan.
const maxSearchBytes = 2048

// searchFilter is the WHERE condition, over sessions aliased s, for a search: the session's
// title contains the text, or one message a person reads (visibleRows, so a hit is one the
// transcript shows) matches it. Message text is searched the way Hermes' search_messages
// does: through state.db's own FTS5 index, each whitespace-separated word a quoted phrase
// (so quotes, *, NEAR, -, parentheses and column filters are text, never operators) and all
// words in one message; a query with CJK text goes to the trigram index, which finds
// substrings the word index cannot (unicode61 keeps a run of ideographs as one token).
// LIKE is the fallback only where no index can answer: a database without messages_fts, an
// index Hermes marked stale or is rebuilding, and CJK words shorter than the trigram's
// three characters.
func (s *StateDB) searchFilter(ctx context.Context, l *stateLayout, text string) (string, []any, error) {
	if len(text) > maxSearchBytes {
		// Cut at a word boundary, so the last word searched is one the person typed.
		cut := text[:maxSearchBytes+1]
		if i := strings.LastIndexFunc(cut, unicode.IsSpace); i > 0 {
			cut = cut[:i]
		}
		text = cut
	}
	// SQLite ends a LIKE pattern at a NUL, which would turn the rest into a match-all; no
	// text Hermes stores holds one to find.
	text = strings.ToValidUTF8(strings.ReplaceAll(text, "\x00", ""), "")
	if text == "" {
		return "", nil, nil // nothing searchable was asked for: nothing matches
	}
	var (
		or   []string
		args []any
	)
	if l.sessions["title"] {
		or = append(or, `s.title LIKE ? ESCAPE '\'`)
		args = append(args, likePattern(text))
	}
	words := strings.Fields(text)
	index, err := s.searchIndex(ctx, l, words)
	if err != nil {
		return "", nil, err
	}
	switch {
	case len(words) == 0:
	case index != "":
		or = append(or, "s.id IN (SELECT m.session_id FROM "+index+" JOIN messages m ON m.id = "+index+".rowid"+
			" WHERE "+index+" MATCH ? AND "+l.visible+")")
		args = append(args, ftsPhrases(words))
	default:
		var cols []string
		for _, c := range []string{"content", "tool_name", "tool_calls"} {
			if l.messages[c] {
				cols = append(cols, c)
			}
		}
		if len(cols) == 0 {
			break
		}
		// Every word somewhere in one message, as the index would have it.
		var all []string
		for _, w := range words {
			var alts []string
			for _, c := range cols {
				alts = append(alts, "m."+c+` LIKE ? ESCAPE '\'`)
				args = append(args, likePattern(w))
			}
			all = append(all, "("+strings.Join(alts, " OR ")+")")
		}
		or = append(or, "EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id AND "+l.visible+
			" AND "+strings.Join(all, " AND ")+")")
	}
	if len(or) == 0 {
		return "", nil, nil
	}
	return "(" + strings.Join(or, " OR ") + ")", args, nil
}

// searchIndex names the FTS5 table that can answer a search for words, or "" when none can.
func (s *StateDB) searchIndex(ctx context.Context, l *stateLayout, words []string) (string, error) {
	if !l.tables["messages_fts"] {
		return "", nil
	}
	if l.tables["state_meta"] {
		// Hermes detaches a corrupt index (fts_stale) and backfills a rebuilt one in the
		// background (fts_rebuild_high_water); until it is done the index misses rows, and
		// Hermes itself searches with LIKE.
		var n int
		err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM state_meta WHERE key IN ('fts_stale', 'fts_rebuild_high_water')`).Scan(&n)
		if err != nil {
			return "", err
		}
		if n > 0 {
			return "", nil
		}
	}
	cjk := false
	for _, w := range words {
		cjk = cjk || strings.ContainsFunc(w, isCJK)
	}
	if !cjk {
		return "messages_fts", nil
	}
	if !l.tables["messages_fts_trigram"] {
		return "", nil
	}
	for _, w := range words {
		if utf8.RuneCountInString(w) < 3 {
			return "", nil // a trigram index cannot match fewer than three characters
		}
	}
	return "messages_fts_trigram", nil
}

func isCJK(r rune) bool {
	return unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul) ||
		(r >= 0x3000 && r <= 0x303f) // CJK symbols and punctuation, which Hermes counts too
}

// ftsPhrases renders words as an FTS5 query of quoted phrases, ANDed: inside a string FTS5
// has no operators, and a doubled quote is a literal one. A word the tokenizer reads as no
// token at all (punctuation only) is an empty phrase, which FTS5 leaves out of the AND.
func ftsPhrases(words []string) string {
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = `"` + strings.ReplaceAll(w, `"`, `""`) + `"`
	}
	return strings.Join(quoted, " ")
}

// Sessions lists one page of sessions, newest first.
func (s *StateDB) Sessions(ctx context.Context, q SessionQuery) (SessionPage, error) {
	key := fmt.Sprintf("sessions\x00%s\x00%s\x00%d", q.Search, q.After, q.Limit)
	return cached(ctx, s, key, func(p SessionPage) bool { return p.Status == "" }, func() (SessionPage, error) {
		return s.sessions(ctx, q)
	})
}

func (s *StateDB) sessions(ctx context.Context, q SessionQuery) (SessionPage, error) {
	l, err := s.load(ctx)
	if err != nil {
		return s.pageErr(err)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = 50
	}
	var (
		where []string
		args  []any
	)
	if q.After != "" {
		c, err := decodeCursor(q.After)
		if err != nil {
			return SessionPage{}, err
		}
		// The range on started_at walks Hermes' idx_sessions_started; the unary plus keeps
		// the tie-break a filter, so SQLite does not turn the OR into a scan of every
		// older row (what made a page cost the whole table).
		where = append(where, "s.started_at <= ? AND (+s.started_at < ? OR +s.id < ?)")
		args = append(args, c.StartedAt, c.StartedAt, c.ID)
	}
	if q.Search != "" {
		match, matchArgs, err := s.searchFilter(ctx, l, q.Search)
		if err != nil {
			return s.pageErr(err)
		}
		if match == "" {
			return SessionPage{}, nil
		}
		where = append(where, match)
		args = append(args, matchArgs...)
	}
	query := "SELECT " + s.summary + " FROM sessions s"
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY s.started_at DESC, s.id DESC LIMIT ?"
	args = append(args, limit+1)

	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return s.pageErr(err)
	}
	defer rows.Close()
	hasTokens, hasCost := l.sessions["input_tokens"], l.sessions["estimated_cost_usd"] || l.sessions["actual_cost_usd"]
	page := SessionPage{Sessions: make([]Session, 0, limit+1)}
	var lastStarted float64
	for rows.Next() {
		sess, started, err := scanSession(rows, hasTokens, hasCost)
		if err != nil {
			return s.pageErr(err)
		}
		if len(page.Sessions) < limit {
			lastStarted = started
		}
		page.Sessions = append(page.Sessions, sess)
	}
	if err := rows.Err(); err != nil {
		return s.pageErr(err)
	}
	if len(page.Sessions) > limit {
		page.Sessions = page.Sessions[:limit]
		last := page.Sessions[limit-1]
		page.NextCursor = cursor{lastStarted, last.ID}.encode()
	}
	return page, nil
}

func (s *StateDB) pageErr(err error) (SessionPage, error) {
	if st := stateStatus(err); st != "" {
		return SessionPage{Status: st}, nil
	}
	return SessionPage{}, fmt.Errorf("read sessions of org %s: %w", s.home.ID, err)
}

// Transcript is one session and the messages a person reads, in the order Hermes recorded
// them.
type Transcript struct {
	Session      Session
	SystemPrompt string // kept on the session: Hermes stores no system message row
	Messages     []Message
	// Omitted counts the rows Hermes keeps but does not show (see visibleRows): taken
	// back, summarized away by compaction, or hidden scaffolding.
	Omitted int
	// Next is the TranscriptQuery.After of the following page; 0 on the last.
	Next   int64
	Status string // StatusBusy or StatusInterrupted when the database could not answer
}

// TranscriptQuery asks for one page of a transcript, oldest first.
type TranscriptQuery struct {
	After int64 // the Next of the previous page; 0 starts at the first message
	Limit int   // messages a page; 0 means all
}

// Message is one message of a transcript. Tool calls are decoded so a page can show which
// tool was called with what; a tool message carries the answer and the tool's name.
type Message struct {
	ID         int64
	Role       string // system, user, assistant, tool
	Content    string
	ToolCalls  []ToolCall
	ToolName   string
	ToolCallID string
	Timestamp  time.Time
}

// ToolCall is one call an assistant message makes.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string // JSON text as the model sent it
}

// decodeToolCalls reads messages.tool_calls (OpenAI's shape). Text that is not that shape
// is kept as one call with no name, so nothing is hidden from the operator.
func decodeToolCalls(raw string) []ToolCall {
	if raw == "" {
		return nil
	}
	var wire []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	}
	if err := json.Unmarshal([]byte(raw), &wire); err != nil {
		return []ToolCall{{Arguments: raw}}
	}
	calls := make([]ToolCall, len(wire))
	for i, w := range wire {
		args := string(w.Function.Arguments)
		var str string
		if json.Unmarshal(w.Function.Arguments, &str) == nil {
			args = str // the usual case: arguments are a JSON string holding JSON
		}
		calls[i] = ToolCall{ID: w.ID, Name: w.Function.Name, Arguments: args}
	}
	return calls
}

// Transcript reads one session with every message a person reads (see visibleRows).
func (s *StateDB) Transcript(ctx context.Context, id string) (Transcript, error) {
	return s.TranscriptPage(ctx, id, TranscriptQuery{})
}

// TranscriptPage reads one session with one page of the messages a person reads, in the
// order Hermes wrote them, paged by message id (keyset: page 10 costs what page 1 does).
func (s *StateDB) TranscriptPage(ctx context.Context, id string, q TranscriptQuery) (Transcript, error) {
	key := fmt.Sprintf("transcript\x00%s\x00%d\x00%d", id, q.After, q.Limit)
	return cached(ctx, s, key, func(t Transcript) bool { return t.Status == "" }, func() (Transcript, error) {
		return s.transcript(ctx, id, q)
	})
}

func (s *StateDB) transcript(ctx context.Context, id string, q TranscriptQuery) (Transcript, error) {
	l, err := s.load(ctx)
	if err != nil {
		return s.transcriptErr(id, err)
	}
	// One read transaction, so the session row and its messages are one snapshot.
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return s.transcriptErr(id, err)
	}
	defer tx.Rollback()
	row := tx.QueryRowContext(ctx, "SELECT "+s.summary+" FROM sessions s WHERE s.id = ?", id)
	sess, _, err := scanSession(row, l.sessions["input_tokens"], l.sessions["estimated_cost_usd"] || l.sessions["actual_cost_usd"])
	if errors.Is(err, sql.ErrNoRows) {
		return Transcript{}, fmt.Errorf("transcript %s of org %s: %w", id, s.home.ID, ErrSessionNotFound)
	}
	if err != nil {
		return s.transcriptErr(id, err)
	}
	t := Transcript{Session: sess, Messages: make([]Message, 0, min(sess.MessageCount, max(q.Limit, 0)))}
	if prompt := systemPromptSelect(l); prompt != "" {
		var p sql.NullString
		if err := tx.QueryRowContext(ctx, "SELECT "+prompt+" FROM sessions s WHERE s.id = ?", id).Scan(&p); err != nil {
			return s.transcriptErr(id, err)
		}
		t.SystemPrompt = p.String
	}
	if l.visible != "1" {
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM messages m WHERE m.session_id = ? AND NOT ("+l.visible+")", id).Scan(&t.Omitted); err != nil {
			return s.transcriptErr(id, err)
		}
	}
	cols := []string{"m.id", "m.role"}
	for _, c := range []string{"content", "tool_calls", "tool_name", "tool_call_id", "timestamp"} {
		if l.messages[c] {
			cols = append(cols, "m."+c)
		} else {
			cols = append(cols, "NULL")
		}
	}
	// Insertion order, as Hermes reads its own history: timestamps come from a clock that
	// can step back, and ordering by them can put a tool's answer before its call. Schema
	// 30's display_order only matters for its display view, which merges the generations
	// compaction leaves; the live rows read here have none to merge.
	query := "SELECT " + strings.Join(cols, ", ") + " FROM messages m WHERE m.session_id = ? AND m.id > ? AND " + l.visible + " ORDER BY m.id"
	args := []any{id, q.After}
	if q.Limit > 0 {
		query += " LIMIT ?"
		args = append(args, q.Limit+1)
	}
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return s.transcriptErr(id, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			m                                Message
			content, calls, toolName, callID sql.NullString
			ts                               sql.NullFloat64
		)
		if err := rows.Scan(&m.ID, &m.Role, &content, &calls, &toolName, &callID, &ts); err != nil {
			return s.transcriptErr(id, err)
		}
		m.Content, m.ToolName, m.ToolCallID = content.String, toolName.String, callID.String
		m.ToolCalls = decodeToolCalls(calls.String)
		if ts.Valid {
			m.Timestamp = unixSeconds(ts.Float64)
		}
		t.Messages = append(t.Messages, m)
	}
	if err := rows.Err(); err != nil {
		return s.transcriptErr(id, err)
	}
	if q.Limit > 0 && len(t.Messages) > q.Limit {
		t.Messages = t.Messages[:q.Limit]
		t.Next = t.Messages[q.Limit-1].ID
	}
	return t, nil
}

// systemPromptSelect is the expression, over sessions aliased s, for a session's system
// prompt: inline, or (schema 25 and later) in system_prompts by hash, the inline column
// kept as the fallback for rows written before. "" when the database keeps no prompt.
func systemPromptSelect(l *stateLayout) string {
	inline := l.sessions["system_prompt"]
	if l.sessions["system_prompt_hash"] && l.tables["system_prompts"] {
		byHash := "(SELECT p.prompt FROM system_prompts p WHERE p.hash = s.system_prompt_hash)"
		if inline {
			return "COALESCE(s.system_prompt, " + byHash + ")"
		}
		return byHash
	}
	if inline {
		return "s.system_prompt"
	}
	return ""
}

func (s *StateDB) transcriptErr(id string, err error) (Transcript, error) {
	if st := stateStatus(err); st != "" {
		return Transcript{Status: st}, nil
	}
	return Transcript{}, fmt.Errorf("transcript %s of org %s: %w", id, s.home.ID, err)
}
