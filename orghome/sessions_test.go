package orghome

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hermeshost/orghome/hermesstate"
)

// schemaVersions are the two shapes of state.db the host reads: v0.19.0's, which the host
// pins, and a later release's.
var schemaVersions = []int{hermesstate.V22, hermesstate.V30}

func versionName(v int) string { return fmt.Sprintf("schema%d", v) }

// stateFixture creates the home's state.db in schema 22 with n sessions; see
// stateFixtureVersion.
func stateFixture(t testing.TB, h *Home, n int) *sql.DB {
	t.Helper()
	return stateFixtureVersion(t, h, hermesstate.V22, n)
}

// stateFixtureVersion creates the home's state.db in the given Hermes schema with n CLI
// sessions, session i started at 1_700_000_000+i seconds (plus a fraction, as Hermes' REAL
// column holds) and titled "session i" (titles are unique where set).
func stateFixtureVersion(t testing.TB, h *Home, version, n int) *sql.DB {
	t.Helper()
	ctx := context.Background()
	db, err := hermesstate.CreateVersion(ctx, filepath.Join(h.Dir, "state.db"), version)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		s := hermesstate.Session{
			ID: fmt.Sprintf("s%05d", i), Source: "cli", Model: "demo-model",
			StartedAt: 1_700_000_000 + float64(i) + 0.123456, Title: fmt.Sprintf("session %d", i),
			MessageCount: 2, InputTokens: int64(100 + i), OutputTokens: 50, EstimatedCostUSD: 0.01,
		}
		if err := hermesstate.InsertSession(ctx, tx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return db
}

// eachSchema runs f once per state.db shape, each in a home of its own.
func eachSchema(t *testing.T, f func(t *testing.T, version int, h *Home)) {
	for _, v := range schemaVersions {
		t.Run(versionName(v), func(t *testing.T) {
			_, h := newHome(t, "acme")
			f(t, v, h)
		})
	}
}

func openState(t testing.TB, h *Home) *StateDB {
	t.Helper()
	st, err := h.OpenState()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// pageAll walks every page and returns the ids in order.
func pageAll(t testing.TB, st *StateDB, q SessionQuery) []string {
	t.Helper()
	var ids []string
	for {
		page, err := st.Sessions(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		if page.Status != "" {
			t.Fatalf("page status %q", page.Status)
		}
		for _, s := range page.Sessions {
			ids = append(ids, s.ID)
		}
		if page.NextCursor == "" {
			return ids
		}
		q.After = page.NextCursor
	}
}

func TestSessionsPageNewestFirstWithoutGapsOrRepeats(t *testing.T) {
	eachSchema(t, func(t *testing.T, v int, h *Home) {
		stateFixtureVersion(t, h, v, 123)
		st := openState(t, h)
		ids := pageAll(t, st, SessionQuery{Limit: 10})
		if len(ids) != 123 {
			t.Fatalf("paged %d sessions, want 123", len(ids))
		}
		for i, id := range ids {
			if want := fmt.Sprintf("s%05d", 122-i); id != want {
				t.Fatalf("position %d: %s, want %s", i, id, want)
			}
		}
		page, err := st.Sessions(context.Background(), SessionQuery{Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		s := page.Sessions[0]
		if s.Tokens == nil || s.Tokens.Input != 222 || s.Tokens.Output != 50 || s.CostUSD == nil || *s.CostUSD != 0.01 {
			t.Errorf("counters of the newest session: %+v %+v", s.Tokens, s.CostUSD)
		}
		if s.Title != "session 122" || s.Source != "cli" || s.Model != "demo-model" || s.StartedAt.Unix() != 1_700_000_122 {
			t.Errorf("newest session: %+v", s)
		}
	})
}

func TestSessionsSameStartTimeArePagedByID(t *testing.T) {
	eachSchema(t, func(t *testing.T, v int, h *Home) {
		db := stateFixtureVersion(t, h, v, 0)
		for _, id := range []string{"a", "b", "c", "d", "e"} {
			if err := hermesstate.InsertSession(context.Background(), db, hermesstate.Session{ID: id, Source: "cli", StartedAt: 42.5}); err != nil {
				t.Fatal(err)
			}
		}
		ids := pageAll(t, openState(t, h), SessionQuery{Limit: 2})
		if fmt.Sprint(ids) != "[e d c b a]" {
			t.Fatalf("ids = %v", ids)
		}
	})
}

// Tool sessions have no title (NULL); titles that are set are unique, so a second session
// cannot take one, and untitled sessions list as "".
func TestSessionsWithoutTitlesAndUniqueTitles(t *testing.T) {
	eachSchema(t, func(t *testing.T, v int, h *Home) {
		db := stateFixtureVersion(t, h, v, 1)
		ctx := context.Background()
		must(t, hermesstate.InsertSession(ctx, db, hermesstate.Session{ID: "t1", Source: "tool", StartedAt: 1_800_000_001}))
		must(t, hermesstate.InsertSession(ctx, db, hermesstate.Session{ID: "t2", Source: "tool", StartedAt: 1_800_000_002}))
		err := hermesstate.InsertSession(ctx, db, hermesstate.Session{ID: "dup", Source: "cli", StartedAt: 3, Title: "session 0"})
		if err == nil || !strings.Contains(err.Error(), "UNIQUE") {
			t.Fatalf("a second session titled %q: %v; want the unique title index to refuse it", "session 0", err)
		}
		page, err := openState(t, h).Sessions(ctx, SessionQuery{})
		if err != nil || len(page.Sessions) != 3 {
			t.Fatalf("page = %+v, %v", page, err)
		}
		if got := page.Sessions; got[0].Title != "" || got[1].Title != "" || got[2].Title != "session 0" {
			t.Errorf("titles: %q %q %q", got[0].Title, got[1].Title, got[2].Title)
		}
	})
}

// A finished `chat -q` run leaves ended_at NULL: the reader never assumes a session ended.
func TestOpenSessionsHaveNoEnd(t *testing.T) {
	eachSchema(t, func(t *testing.T, v int, h *Home) {
		db := stateFixtureVersion(t, h, v, 0)
		ctx := context.Background()
		must(t, hermesstate.InsertSession(ctx, db, hermesstate.Session{ID: "open", Source: "tool", StartedAt: 20, MessageCount: 2}))
		must(t, hermesstate.InsertSession(ctx, db, hermesstate.Session{ID: "done", Source: "cli", StartedAt: 10, EndedAt: 15, EndReason: "compression"}))
		st := openState(t, h)
		page, err := st.Sessions(ctx, SessionQuery{})
		if err != nil || len(page.Sessions) != 2 {
			t.Fatalf("page = %+v, %v", page, err)
		}
		if open := page.Sessions[0]; open.ID != "open" || !open.EndedAt.IsZero() || open.EndReason != "" {
			t.Errorf("open session: %+v", open)
		}
		if done := page.Sessions[1]; done.EndedAt.Unix() != 15 || done.EndReason != "compression" {
			t.Errorf("ended session: %+v", done)
		}
		tr, err := st.Transcript(ctx, "open")
		if err != nil || !tr.Session.EndedAt.IsZero() {
			t.Errorf("open session's transcript: %+v, %v", tr.Session, err)
		}
	})
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func searchIDs(t *testing.T, st *StateDB, text string) string {
	t.Helper()
	return fmt.Sprint(pageAll(t, st, SessionQuery{Search: text}))
}

func TestSessionsSearchUsesHermesFullTextIndex(t *testing.T) {
	eachSchema(t, func(t *testing.T, v int, h *Home) {
		db := stateFixtureVersion(t, h, v, 30)
		ctx := context.Background()
		msg := func(session, role, content string) {
			t.Helper()
			must(t, hermesstate.InsertMessage(ctx, db, hermesstate.Message{SessionID: session, Role: role, Content: content, Timestamp: 1}))
		}
		msg("s00003", "user", "please extract the 100%_pure guidelines")
		msg("s00005", "assistant", "impure thoughts about rotation")
		msg("s00007", "assistant", "alpha beta")
		msg("s00008", "user", "gamma")
		msg("s00009", "user", "我们在大别山项目里开会")
		must(t, hermesstate.InsertMessage(ctx, db, hermesstate.Message{SessionID: "s00010", Role: "assistant", Timestamp: 2,
			ToolCalls: []hermesstate.ToolCall{{ID: "call_1", Name: "skill_view", Arguments: `{"name":"arxiv"}`}}}))
		st := openState(t, h)

		for _, c := range []struct{ search, want string }{
			{"100%_pure", "[s00003]"}, // the tokenizer's words, 100 and pure, next to each other
			{"guidelines extract", "[s00003]"},
			{"pure", "[s00003]"},               // a word, not a substring: "impure" does not match
			{"rotation", "[s00005]"},           // case and the index's tokens, not LIKE
			{"skill_view", "[s00010]"},         // tool names and arguments are indexed too
			{"arxiv", "[s00010]"},              //
			{"大别山", "[s00009]"},                // CJK: the trigram index finds a substring
			{"别山", "[s00009]"},                 // shorter than a trigram: LIKE, as Hermes does
			{"session 2", fmt.Sprint(want2())}, // titles: a substring of "session 2", "session 20".."29"
			// Operators in the text are words, never FTS5 syntax.
			{"alpha OR gamma", "[]"},
			{"alpha NOT beta", "[]"},
			{"NEAR(alpha beta)", "[]"},
			{"alph*", "[]"},
			{"alpha*", "[s00007]"},
			{"-gamma", "[s00008]"},
			{"content:alpha", "[]"},
			{`"alpha beta"`, "[s00007]"},
			{`alpha"`, "[s00007]"},
			{"%", "[]"}, // LIKE wildcards match literally: no title has a %
			{"^(", "[]"},
			{`"`, "[]"},
			{"\x00", "[]"},
			{strings.Repeat("alpha ", 2000), "[s00007]"},
		} {
			if got := searchIDs(t, st, c.search); got != c.want {
				t.Errorf("search %.40q = %s, want %s", c.search, got, c.want)
			}
		}

		// While Hermes rebuilds or has detached its index, the index misses rows: LIKE then.
		_, err := db.Exec(`INSERT INTO state_meta (key, value) VALUES ('fts_stale', '1')`)
		must(t, err)
		if got := searchIDs(t, st, "pure"); got != "[s00005 s00003]" {
			t.Errorf("search with a stale index = %s, want the LIKE answer [s00005 s00003]", got)
		}
	})
}

func want2() []string {
	ids := []string{}
	for i := 29; i >= 20; i-- {
		ids = append(ids, fmt.Sprintf("s%05d", i))
	}
	return append(ids, "s00002")
}

// A word found only in rows a person does not read (taken back, compacted away, hidden
// scaffolding) does not make its session a hit.
func TestSessionsSearchSkipsRowsHermesDoesNotShow(t *testing.T) {
	eachSchema(t, func(t *testing.T, v int, h *Home) {
		db := stateFixtureVersion(t, h, v, 5)
		ctx := context.Background()
		rows := []hermesstate.Message{
			{SessionID: "s00001", Role: "user", Content: "zanzibar rewound", Inactive: true},
			{SessionID: "s00002", Role: "user", Content: "zanzibar summarized away", Inactive: true, Compacted: true},
			{SessionID: "s00003", Role: "user", Content: "zanzibar live"},
		}
		if v == hermesstate.V30 {
			rows = append(rows,
				hermesstate.Message{SessionID: "s00004", Role: "user", Content: "zanzibar scaffolding", DisplayKind: "hidden"},
				hermesstate.Message{SessionID: "s00000", Role: "user", Content: "zanzibar steered", DisplayKind: "steer"})
		}
		for i, m := range rows {
			m.Timestamp = float64(i + 1)
			must(t, hermesstate.InsertMessage(ctx, db, m))
		}
		want := map[int]string{hermesstate.V22: "[s00003]", hermesstate.V30: "[s00003 s00000]"}[v]
		st := openState(t, h)
		if got := searchIDs(t, st, "zanzibar"); got != want {
			t.Errorf("search = %s, want %s", got, want)
		}
		_, err := db.Exec(`INSERT INTO state_meta (key, value) VALUES ('fts_rebuild_high_water', '10')`)
		must(t, err)
		if got := searchIDs(t, st, "zanzibar"); got != want {
			t.Errorf("LIKE search = %s, want %s", got, want)
		}
	})
}

func TestTranscriptShowsMessagesInOrderWithToolCalls(t *testing.T) {
	eachSchema(t, func(t *testing.T, v int, h *Home) {
		db := stateFixtureVersion(t, h, v, 1)
		ctx := context.Background()
		msgs := []hermesstate.Message{
			{SessionID: "s00000", Role: "user", Content: "hi", Timestamp: 10},
			{SessionID: "s00000", Role: "assistant", Timestamp: 11, ToolCalls: []hermesstate.ToolCall{
				{ID: "call_1", Name: "skill_view", Arguments: `{"name":"arxiv"}`},
				{ID: "call_2", Name: "terminal", Arguments: `{"command":"sartiq ops"}`},
			}},
			// The clock stepped back: Hermes' order is insertion order, not the timestamp.
			{SessionID: "s00000", Role: "tool", ToolName: "skill_view", ToolCallID: "call_1", Content: "# arxiv", Timestamp: 9},
			{SessionID: "s00000", Role: "assistant", Content: "done", Timestamp: 13},
		}
		for _, m := range msgs {
			must(t, hermesstate.InsertMessage(ctx, db, m))
		}
		tr, err := openState(t, h).Transcript(ctx, "s00000")
		if err != nil {
			t.Fatal(err)
		}
		if len(tr.Messages) != 4 || tr.Session.ID != "s00000" || tr.Omitted != 0 {
			t.Fatalf("transcript: %+v", tr)
		}
		got := tr.Messages[1].ToolCalls
		if len(got) != 2 || got[0].Name != "skill_view" || got[0].Arguments != `{"name":"arxiv"}` || got[1].ID != "call_2" {
			t.Errorf("tool calls = %+v", got)
		}
		if tr.Messages[2].ToolName != "skill_view" || tr.Messages[2].ToolCallID != "call_1" || tr.Messages[3].Content != "done" {
			t.Errorf("messages = %+v", tr.Messages)
		}
		if !tr.Messages[0].Timestamp.Equal(time.Unix(10, 0)) {
			t.Errorf("timestamp = %v", tr.Messages[0].Timestamp)
		}
		if _, err := openState(t, h).Transcript(ctx, "nope"); !errors.Is(err, ErrSessionNotFound) {
			t.Errorf("unknown session: %v", err)
		}
	})
}

// Rows Hermes keeps but leaves out of the history it shows: a turn the user took back
// (active=0), the originals compaction summarized away (active=0, compacted=1), and schema
// 30's hidden scaffolding. The transcript shows the rest and says how many it left out.
func TestTranscriptLeavesOutInactiveCompactedAndHiddenRows(t *testing.T) {
	eachSchema(t, func(t *testing.T, v int, h *Home) {
		db := stateFixtureVersion(t, h, v, 1)
		ctx := context.Background()
		rows := []hermesstate.Message{
			{Role: "user", Content: "original question", Inactive: true, Compacted: true},
			{Role: "assistant", Content: "original answer", Inactive: true, Compacted: true},
			{Role: "user", Content: "summary of the conversation so far"},
			{Role: "user", Content: "a turn taken back", Inactive: true},
			{Role: "user", Content: "next question"},
			{Role: "assistant", Content: "next answer", FinishReason: "stop", TokenCount: 12},
		}
		want := "[summary of the conversation so far next question next answer]"
		omitted := 3
		if v == hermesstate.V30 {
			rows = append(rows,
				hermesstate.Message{Role: "user", Content: "runtime note for the model", DisplayKind: "hidden"},
				hermesstate.Message{Role: "user", Content: "steered", DisplayKind: "steer"})
			want = "[summary of the conversation so far next question next answer steered]"
			omitted = 4
		}
		for i, m := range rows {
			m.SessionID, m.Timestamp = "s00000", float64(100+i)
			must(t, hermesstate.InsertMessage(ctx, db, m))
		}
		tr, err := openState(t, h).Transcript(ctx, "s00000")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range tr.Messages {
			got = append(got, m.Content)
		}
		if fmt.Sprint(got) != want || tr.Omitted != omitted {
			t.Errorf("transcript = %v (%d left out), want %s (%d left out)", got, tr.Omitted, want, omitted)
		}
	})
}

func TestTranscriptHasTheSessionSystemPrompt(t *testing.T) {
	eachSchema(t, func(t *testing.T, v int, h *Home) {
		db := stateFixtureVersion(t, h, v, 0)
		ctx := context.Background()
		prompt := "You are Hermes.\n" + strings.Repeat("Rules. ", 100)
		must(t, hermesstate.InsertSession(ctx, db, hermesstate.Session{ID: "a", Source: "tool", StartedAt: 1, SystemPrompt: prompt}))
		must(t, hermesstate.InsertSession(ctx, db, hermesstate.Session{ID: "b", Source: "tool", StartedAt: 2}))
		st := openState(t, h)
		tr, err := st.Transcript(ctx, "a")
		if err != nil || tr.SystemPrompt != prompt {
			t.Errorf("system prompt = %.40q, %v", tr.SystemPrompt, err)
		}
		if tr, err := st.Transcript(ctx, "b"); err != nil || tr.SystemPrompt != "" {
			t.Errorf("session without a prompt: %.40q, %v", tr.SystemPrompt, err)
		}
	})
}

func TestSessionsOfAnOlderSchemaHaveNoCounters(t *testing.T) {
	_, h := newHome(t, "acme")
	db, err := sql.Open("sqlite", "file:"+filepath.Join(h.Dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, started_at REAL NOT NULL);
		CREATE TABLE messages (id INTEGER PRIMARY KEY, session_id TEXT, role TEXT, content TEXT, timestamp REAL);
		INSERT INTO sessions VALUES ('old', 'cli', 5);
		INSERT INTO messages VALUES (1, 'old', 'user', 'hello', 5);`)
	must(t, err)
	st := openState(t, h)
	page, err := st.Sessions(context.Background(), SessionQuery{Search: "hello"})
	if err != nil || len(page.Sessions) != 1 {
		t.Fatalf("page = %+v, %v", page, err)
	}
	if s := page.Sessions[0]; s.Tokens != nil || s.CostUSD != nil || s.Title != "" {
		t.Errorf("older schema session shows counters it does not have: %+v", s)
	}
	tr, err := st.Transcript(context.Background(), "old")
	if err != nil || len(tr.Messages) != 1 || tr.Messages[0].ToolCalls != nil {
		t.Fatalf("transcript = %+v, %v", tr, err)
	}
}

func TestMissingStateDBIsNoSessions(t *testing.T) {
	_, h := newHome(t, "acme")
	if _, err := h.OpenState(); !errors.Is(err, ErrNoSessions) {
		t.Fatalf("OpenState without state.db: %v; want ErrNoSessions", err)
	}
}

func TestStateDBSidecarLinkedOutIsRefused(t *testing.T) {
	_, h := newHome(t, "acme")
	stateFixture(t, h, 1).Close() // the last close checkpoints and removes -wal and -shm
	other := writeFile(t, t.TempDir(), "beta-state.db-wal", "another org's WAL")
	for _, side := range []string{"state.db-wal", "state.db-shm"} {
		link := filepath.Join(h.Dir, side)
		symlink(t, other, link)
		if st, err := h.OpenState(); !errors.Is(err, ErrOutsideHome) {
			if st != nil {
				st.Close()
			}
			t.Fatalf("OpenState with %s linked out: %v; want ErrOutsideHome", side, err)
		}
		must(t, os.Remove(link))
	}
	symlink(t, other, filepath.Join(h.Dir, "elsewhere.db"))
	must(t, os.Rename(filepath.Join(h.Dir, "elsewhere.db"), filepath.Join(h.Dir, "state.db")))
	if _, err := h.OpenState(); !errors.Is(err, ErrOutsideHome) {
		t.Fatalf("OpenState with state.db linked out: %v; want ErrOutsideHome", err)
	}
}

// A writer that takes the database exclusively (locking_mode=EXCLUSIVE, as during a
// migration) makes the reader wait out its busy timeout: the page says so, it is no error.
func TestBusyDatabaseIsAStateNotAnError(t *testing.T) {
	_, h := newHome(t, "acme")
	stateFixture(t, h, 3).Close()
	ctx := context.Background()

	db, err := sql.Open("sqlite", "file:"+filepath.Join(h.Dir, "state.db")+"?_pragma=locking_mode(EXCLUSIVE)")
	must(t, err)
	defer db.Close()
	conn, err := db.Conn(ctx)
	must(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, "BEGIN EXCLUSIVE")
	must(t, err)
	_, err = conn.ExecContext(ctx, "INSERT INTO sessions (id, source, started_at) VALUES ('x', 'cli', 1)")
	must(t, err)
	st, err := h.openState(50 * time.Millisecond)
	must(t, err)
	defer st.Close()

	page, err := st.Sessions(ctx, SessionQuery{})
	if err != nil || page.Status != StatusBusy || len(page.Sessions) != 0 {
		t.Fatalf("sessions while locked: %+v, %v; want Status %q", page, err, StatusBusy)
	}
	tr, err := st.Transcript(ctx, "s00001")
	if err != nil || tr.Status != StatusBusy {
		t.Fatalf("transcript while locked: %+v, %v; want Status %q", tr, err, StatusBusy)
	}
	if _, err := st.SkillUsage(ctx); !errors.Is(err, ErrStateBusy) {
		t.Fatalf("skill usage while locked: %v; want ErrStateBusy", err)
	}
	_, err = conn.ExecContext(ctx, "COMMIT")
	must(t, err)
	must(t, conn.Close())
	must(t, db.Close()) // leaving exclusive mode takes closing the connection
	if page, err := st.Sessions(ctx, SessionQuery{}); err != nil || page.Status != "" || len(page.Sessions) != 4 {
		t.Fatalf("after the lock: %+v, %v", page, err)
	}
}

func TestStateDBIsNeverWritten(t *testing.T) {
	_, h := newHome(t, "acme")
	stateFixture(t, h, 1)
	st := openState(t, h)
	if _, err := st.db.Exec(`DELETE FROM sessions`); err == nil {
		t.Fatal("the read-only handle deleted rows")
	}
}

// A running agent holds a write transaction (BEGIN IMMEDIATE) and keeps inserting while
// the dashboard pages: the reader neither blocks nor fails, and sees the last commit.
func TestReaderDoesNotBlockOnAWritingAgent(t *testing.T) {
	_, h := newHome(t, "acme")
	db := stateFixture(t, h, 200)
	ctx := context.Background()
	st := openState(t, h)

	conn, err := db.Conn(ctx)
	must(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	must(t, err)
	holding := make(chan struct{})
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		i := 0
		for {
			s := hermesstate.Session{ID: fmt.Sprintf("new%05d", i), Source: "tool", StartedAt: 1_800_000_000 + float64(i)}
			if err := hermesstate.InsertSession(ctx, conn, s); err != nil {
				writerDone <- err
				return
			}
			if i++; i == 1 {
				close(holding)
			}
			select {
			case <-stop:
				_, err := conn.ExecContext(ctx, "COMMIT")
				writerDone <- err
				return
			default:
			}
		}
	}()
	<-holding

	// A reader that had to wait for the writer would, after its busy timeout, get
	// SQLITE_BUSY and a page with StatusBusy: the checks below would fail.
	readCtx := ctx
	start := time.Now()
	var ids []string
	q := SessionQuery{Limit: 25}
	for {
		page, err := st.Sessions(readCtx, q)
		if err != nil || page.Status != "" {
			t.Fatalf("reading while the agent writes: %+v, %v", page.Status, err)
		}
		for _, s := range page.Sessions {
			ids = append(ids, s.ID)
		}
		if page.NextCursor == "" {
			break
		}
		q.After = page.NextCursor
	}
	if _, err := st.Transcript(readCtx, "s00010"); err != nil {
		t.Fatalf("transcript while the agent writes: %v", err)
	}
	elapsed := time.Since(start)
	close(stop)
	must(t, <-writerDone)
	if len(ids) != 200 {
		t.Fatalf("reader saw %d sessions during the write; want the 200 committed", len(ids))
	}
	t.Logf("paged 200 sessions and a transcript in %v while a write transaction was open", elapsed)

	page, err := st.Sessions(ctx, SessionQuery{Limit: 1})
	if err != nil || len(page.Sessions) != 1 || page.Sessions[0].ID[:3] != "new" {
		t.Fatalf("after the commit the newest session is %+v, %v", page.Sessions, err)
	}
}
