package orghome

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"hermeshost/orghome/hermesstate"
)

// BenchmarkSessionsPaging walks 10,000 sessions page by page, 50 a page: one op is the
// whole walk, 200 pages.
func BenchmarkSessionsPaging(b *testing.B) {
	_, h := newHome(b, "acme")
	stateFixture(b, h, 10_000)
	st := openState(b, h)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		q := SessionQuery{Limit: 50}
		n := 0
		for {
			page, err := st.Sessions(ctx, q)
			if err != nil || page.Status != "" {
				b.Fatal(err, page.Status)
			}
			n += len(page.Sessions)
			if page.NextCursor == "" {
				break
			}
			q.After = page.NextCursor
		}
		if n != 10_000 {
			b.Fatalf("paged %d sessions", n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/200, "ns/page")
}

// BenchmarkSessionsPagingOffsetBaseline is the baseline for BenchmarkSessionsPaging: the
// same 200 pages read with LIMIT/OFFSET and only the id scanned, on the same connection.
func BenchmarkSessionsPagingOffsetBaseline(b *testing.B) {
	_, h := newHome(b, "acme")
	stateFixture(b, h, 10_000)
	st := openState(b, h)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		for off := 0; off < 10_000; off += 50 {
			rows, err := st.db.QueryContext(ctx, "SELECT id FROM sessions ORDER BY started_at DESC, id DESC LIMIT 50 OFFSET ?", off)
			if err != nil {
				b.Fatal(err)
			}
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					b.Fatal(err)
				}
				n++
			}
			rows.Close()
		}
		if n != 10_000 {
			b.Fatalf("paged %d sessions", n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/200, "ns/page")
}

// BenchmarkTranscript opens one 2,000-message transcript, a third of its messages calling tools.
func BenchmarkTranscript(b *testing.B) {
	_, h := newHome(b, "acme")
	db := stateFixture(b, h, 1)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	body := strings.Repeat("The agent reads the product page and proposes a category. ", 8)
	for i := range 2000 {
		m := hermesstate.Message{SessionID: "s00000", Role: "user", Content: body, Timestamp: float64(1_700_000_000 + i)}
		switch i % 3 {
		case 1:
			m.Role = "assistant"
			m.ToolCalls = []hermesstate.ToolCall{{ID: fmt.Sprint("call_", i), Name: "terminal", Arguments: `{"command":"sartiq ops list"}`}}
		case 2:
			m.Role, m.ToolName, m.ToolCallID = "tool", "terminal", fmt.Sprint("call_", i-1)
		}
		if err := hermesstate.InsertMessage(ctx, tx, m); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	st := openState(b, h)
	b.Run("transcript", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tr, err := st.Transcript(ctx, "s00000")
			if err != nil || len(tr.Messages) != 2000 {
				b.Fatal(err, len(tr.Messages))
			}
		}
	})
	// The baseline: the same rows scanned raw, no tool-call decoding, no session row.
	b.Run("raw-rows-baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rows, err := st.db.QueryContext(ctx, "SELECT id, role, content, tool_calls FROM messages WHERE session_id = ? ORDER BY id", "s00000")
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for rows.Next() {
				var (
					id            int64
					role          string
					content, call sql.NullString
				)
				if err := rows.Scan(&id, &role, &content, &call); err != nil {
					b.Fatal(err)
				}
				n++
			}
			rows.Close()
			if n != 2000 {
				b.Fatal(n)
			}
		}
	})
}

// BenchmarkSessionsSearch finds the first page of sessions whose messages hold a word, in
// 5,000 sessions of 6 messages: one op is one page. "fts" is the reader on Hermes' word
// index; "like-baseline" is the same reader after Hermes marked its index stale, when it
// scans message text as Hermes' own fallback does.
func BenchmarkSessionsSearch(b *testing.B) {
	_, h := newHome(b, "acme")
	db := stateFixture(b, h, 5_000)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	body := strings.Repeat("The agent reads the product page and proposes a category. ", 4)
	for i := range 5_000 {
		for j := range 6 {
			m := hermesstate.Message{SessionID: fmt.Sprintf("s%05d", i), Role: "user", Content: body, Timestamp: float64(j)}
			if j == 3 && i%100 == 0 {
				m.Content += " quarantine"
			}
			if err := hermesstate.InsertMessage(ctx, tx, m); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	st := openState(b, h)
	search := func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			page, err := st.Sessions(ctx, SessionQuery{Search: "quarantine", Limit: 20})
			if err != nil || page.Status != "" || len(page.Sessions) != 20 {
				b.Fatal(err, page.Status, len(page.Sessions))
			}
		}
	}
	b.Run("fts", search)
	if _, err := db.ExecContext(ctx, `INSERT INTO state_meta (key, value) VALUES ('fts_stale', '1')`); err != nil {
		b.Fatal(err)
	}
	b.Run("like-baseline", search)
}
