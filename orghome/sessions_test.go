package orghome

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"hermeshost/orghome/hermesstate"
)

// stateFixture creates the home's state.db with Hermes' layout and n sessions, session i
// started at 1_700_000_000+i seconds (plus a fraction, as Hermes' REAL column holds).
func stateFixture(t testing.TB, h *Home, n int) *sql.DB {
	t.Helper()
	ctx := context.Background()
	db, err := hermesstate.Create(ctx, filepath.Join(h.Dir, "state.db"))
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
			ID: fmt.Sprintf("s%05d", i), Source: "tool", Model: "demo-model",
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
	_, h := newHome(t, "acme")
	stateFixture(t, h, 123)
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
	if s.Title != "session 122" || s.Source != "tool" || s.Model != "demo-model" || s.StartedAt.Unix() != 1_700_000_122 {
		t.Errorf("newest session: %+v", s)
	}
}

func TestSessionsSameStartTimeArePagedByID(t *testing.T) {
	_, h := newHome(t, "acme")
	db := stateFixture(t, h, 0)
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		if err := hermesstate.InsertSession(context.Background(), db, hermesstate.Session{ID: id, Source: "cli", StartedAt: 42.5}); err != nil {
			t.Fatal(err)
		}
	}
	ids := pageAll(t, openState(t, h), SessionQuery{Limit: 2})
	if fmt.Sprint(ids) != "[e d c b a]" {
		t.Fatalf("ids = %v", ids)
	}
}

func TestSessionsSearchTitlesAndMessageContent(t *testing.T) {
	_, h := newHome(t, "acme")
	db := stateFixture(t, h, 30)
	ctx := context.Background()
	must(t, hermesstate.InsertMessage(ctx, db, hermesstate.Message{SessionID: "s00003", Role: "user", Content: "please extract the 100%_pure guidelines", Timestamp: 1}))
	must(t, hermesstate.InsertMessage(ctx, db, hermesstate.Message{SessionID: "s00007", Role: "assistant", Content: "nothing here", Timestamp: 1}))
	st := openState(t, h)

	if ids := pageAll(t, st, SessionQuery{Search: "100%_pure"}); fmt.Sprint(ids) != "[s00003]" {
		t.Errorf("content search = %v", ids)
	}
	if ids := pageAll(t, st, SessionQuery{Search: "session 2"}); len(ids) != 11 { // 2, 20..29
		t.Errorf("title search = %v", ids)
	}
	// LIKE wildcards in the query match literally.
	if ids := pageAll(t, st, SessionQuery{Search: "%"}); len(ids) != 1 {
		t.Errorf("search for a literal %% = %v", ids)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestTranscriptShowsMessagesInOrderWithToolCalls(t *testing.T) {
	_, h := newHome(t, "acme")
	db := stateFixture(t, h, 1)
	ctx := context.Background()
	msgs := []hermesstate.Message{
		{SessionID: "s00000", Role: "user", Content: "hi", Timestamp: 10},
		{SessionID: "s00000", Role: "assistant", Timestamp: 11, ToolCalls: []hermesstate.ToolCall{
			{ID: "call_1", Name: "skill_view", Arguments: `{"name":"arxiv"}`},
			{ID: "call_2", Name: "terminal", Arguments: `{"command":"sartiq ops"}`},
		}},
		{SessionID: "s00000", Role: "tool", ToolName: "skill_view", ToolCallID: "call_1", Content: "# arxiv", Timestamp: 12},
		{SessionID: "s00000", Role: "assistant", Content: "done", Timestamp: 13},
	}
	for _, m := range msgs {
		must(t, hermesstate.InsertMessage(ctx, db, m))
	}
	tr, err := openState(t, h).Transcript(ctx, "s00000")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Messages) != 4 || tr.Session.ID != "s00000" {
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
