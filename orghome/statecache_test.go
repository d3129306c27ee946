package orghome

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"hermeshost/orghome/hermesstate"
)

// The kept state.db answers from memory while nothing changes, and never serves an answer
// older than the last write Hermes committed.
func TestTheKeptStateAnswersFreshAfterEveryWrite(t *testing.T) {
	_, h := newHome(t, "acme")
	if _, err := h.State(); !errors.Is(err, ErrNoSessions) {
		t.Fatalf("a home without state.db: %v", err)
	}
	writer := stateFixture(t, h, 3)
	st, err := h.State()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	count := func() int {
		t.Helper()
		p, err := st.Sessions(ctx, SessionQuery{Limit: 50})
		if err != nil || p.Status != "" {
			t.Fatal(err, p.Status)
		}
		return len(p.Sessions)
	}
	if n := count(); n != 3 {
		t.Fatalf("%d sessions", n)
	}
	if again, _ := h.State(); again != st {
		t.Fatal("State opened the database again although it was unchanged")
	}
	// Served from memory: the same page, no database read needed.
	if n := count(); n != 3 {
		t.Fatalf("%d sessions from the cache", n)
	}
	// Hermes writes: the next answer sees it.
	must(t, hermesstate.InsertSession(ctx, writer, hermesstate.Session{ID: "s99999", Source: "tool", StartedAt: 1_800_000_000}))
	if n := count(); n != 4 {
		t.Fatalf("%d sessions after a write, want 4: a stale answer", n)
	}
	must(t, hermesstate.InsertMessage(ctx, writer, hermesstate.Message{SessionID: "s99999", Role: "user", Content: "hello", Timestamp: 1_800_000_001}))
	tr, err := st.Transcript(ctx, "s99999")
	if err != nil || len(tr.Messages) != 1 {
		t.Fatalf("transcript after a write: %+v %v", tr, err)
	}
	must(t, hermesstate.InsertMessage(ctx, writer, hermesstate.Message{SessionID: "s99999", Role: "assistant", Content: "hi", Timestamp: 1_800_000_002}))
	if tr, _ = st.Transcript(ctx, "s99999"); len(tr.Messages) != 2 {
		t.Fatalf("transcript after a second write: %d messages", len(tr.Messages))
	}

	// state.db replaced by another file: State opens the new one.
	other := filepath.Join(t.TempDir(), "state.db")
	db, err := hermesstate.Create(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	writer.Close()
	for _, side := range []string{"-wal", "-shm"} {
		_ = os.Remove(filepath.Join(h.Dir, "state.db"+side))
	}
	if err := os.Rename(other, filepath.Join(h.Dir, "state.db")); err != nil {
		t.Fatal(err)
	}
	fresh, err := h.State()
	if err != nil || fresh == st {
		t.Fatalf("after state.db was replaced: same handle %v, %v", fresh == st, err)
	}
	p, err := fresh.Sessions(ctx, SessionQuery{Limit: 50})
	if err != nil || len(p.Sessions) != 0 {
		t.Fatalf("the new state.db's sessions: %d, %v", len(p.Sessions), err)
	}
}

func TestATranscriptIsReadAPageAtATime(t *testing.T) {
	eachSchema(t, func(t *testing.T, version int, h *Home) {
		db := stateFixtureVersion(t, h, version, 1)
		ctx := context.Background()
		for i := range 450 {
			must(t, hermesstate.InsertMessage(ctx, db, hermesstate.Message{SessionID: "s00000", Role: "user",
				Content: "m", Timestamp: 1_700_000_100 + float64(i), Inactive: i == 17}))
		}
		st, err := h.State()
		if err != nil {
			t.Fatal(err)
		}
		var ids []int64
		q := TranscriptQuery{Limit: 200}
		for pages := 0; ; pages++ {
			tr, err := st.TranscriptPage(ctx, "s00000", q)
			if err != nil || tr.Status != "" {
				t.Fatal(err, tr.Status)
			}
			if len(tr.Messages) > 200 || tr.Omitted != 1 {
				t.Fatalf("a page of %d messages, %d omitted", len(tr.Messages), tr.Omitted)
			}
			for _, m := range tr.Messages {
				if len(ids) > 0 && m.ID <= ids[len(ids)-1] {
					t.Fatalf("message %d after %d", m.ID, ids[len(ids)-1])
				}
				ids = append(ids, m.ID)
			}
			if tr.Next == 0 {
				if pages != 2 {
					t.Fatalf("%d pages, want 3", pages+1)
				}
				break
			}
			q.After = tr.Next
		}
		if len(ids) != 449 {
			t.Fatalf("%d messages over the pages, want the 449 shown", len(ids))
		}
	})
}
