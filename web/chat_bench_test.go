package web_test

import (
	"context"
	"database/sql"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"hermeshost/assertion"
	"hermeshost/gateway"
	"hermeshost/hermescli"
	"hermeshost/internal/latency"
	"hermeshost/internal/testio"
	"hermeshost/orghome"
	"hermeshost/templates"
)

// chatBenchPrompt is every benchmark turn's message.
const chatBenchPrompt = "What is our return policy?"

// BenchmarkChatTurn measures what the dashboard's chat adds to an agent's run (issue 18's
// goal: under 50 ms at p99 each): a turn sent as a browser sends it, from the POST to the
// agent's process starting, and from the agent's last row in state.db to the page's stream
// carrying it; beside the same scripted agent run alone with the same command line. The
// agent waits 20 ms before each of its three steps (chat_step_ms), so a turn's stream is
// open before its last row is written, as a browser's is. Run with -benchtime=200x for
// percentiles worth the name: `make bench` does.
func BenchmarkChatTurn(b *testing.B) {
	acme, _ := twoHomes(b, 0)
	acme.write("scripted-agent.json", `{"chat_step_ms": 20}`)
	d := newChatDash(b, acme)
	tok, err := d.signer.Sign("ada", "acme")
	if err != nil {
		b.Fatal(err)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	turn := func(b *testing.B) (sendToAgent, rowToPage, total time.Duration) {
		b.Helper()
		req, _ := http.NewRequest(http.MethodPost, d.srv.URL+"/orgs/acme/chat", strings.NewReader("message="+chatBenchPrompt))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set(assertion.Header, tok)
		sent := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		id, ok := strings.CutPrefix(loc, "/orgs/acme/chat/turns/")
		if resp.StatusCode != http.StatusSeeOther || !ok {
			b.Fatalf("send: %d %q", resp.StatusCode, loc)
		}
		sreq, _ := http.NewRequest(http.MethodGet, d.srv.URL+loc+"/events", nil)
		sreq.Header.Set(assertion.Header, tok)
		sresp, err := client.Do(sreq)
		if err != nil || sresp.StatusCode != http.StatusOK {
			b.Fatalf("stream: %v %v", err, sresp)
		}
		type arrival struct {
			at   time.Time
			rows int
		}
		var got []arrival
		var ended time.Time
		testio.ReadSSE(sresp.Body, func(m testio.SSEMessage) bool {
			switch m.Event {
			case templates.ChatTurnEvent:
				got = append(got, arrival{time.Now(), strings.Count(m.Data, `data-testid="message"`)})
			case templates.ChatTurnEndEvent:
				ended = time.Now()
				return false
			}
			return true
		})
		sresp.Body.Close()
		t, _ := d.runner.Get(id)
		if t.State != "done" || ended.IsZero() || len(got) == 0 || t.AgentAt.IsZero() {
			b.Fatalf("turn %+v ended %v after %d events", t, ended, len(got))
		}
		last := lastRowAt(b, acme.dir, t.SessionID)
		final := got[len(got)-1].rows
		i := slices.IndexFunc(got, func(a arrival) bool { return a.rows == final })
		if i == 0 && got[0].at.Before(last) {
			b.Fatalf("the stream's first event already had the last row, written after it: the measure is void")
		}
		return t.AgentAt.Sub(sent), got[i].at.Sub(last), ended.Sub(sent)
	}
	turn(b) // the home's config.yaml, plugin and first session made once

	b.Run("through the dashboard", func(b *testing.B) {
		var toAgent, toPage, totals []time.Duration
		for b.Loop() {
			a, p, t := turn(b)
			toAgent, toPage, totals = append(toAgent, a), append(toPage, p), append(totals, t)
		}
		latency.ReportNamed(b, "send-to-agent", toAgent)
		latency.ReportNamed(b, "row-to-page", toPage)
		latency.ReportNamed(b, "turn", totals)
	})
	b.Run("agent alone", func(b *testing.B) {
		key, err := gateway.OrgKey(gatewaySecret, "acme")
		if err != nil {
			b.Fatal(err)
		}
		dir := b.TempDir()
		var runs []time.Duration
		for b.Loop() {
			start := time.Now()
			_, code, err := hermescli.Launch{Bin: scriptedAgent(b), Args: hermescli.Args(chatBenchPrompt, 5, ""), Home: acme.dir, GatewayKey: key, Dir: dir, Stderr: os.Stderr}.Run(context.Background(), nil)
			if err != nil || code != 0 {
				b.Fatalf("the agent alone: %d %v", code, err)
			}
			runs = append(runs, time.Since(start))
		}
		latency.ReportNamed(b, "turn", runs)
	})
}

// lastRowAt is when the agent wrote session's newest row (its timestamp, time.time() as
// Hermes writes it).
func lastRowAt(b *testing.B, home, session string) time.Time {
	b.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(home, orghome.StateFile)+"?mode=ro")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	var ts float64
	if err := db.QueryRow(`SELECT max(timestamp) FROM messages WHERE session_id = ?`, session).Scan(&ts); err != nil {
		b.Fatal(err)
	}
	return time.UnixMicro(int64(ts * 1e6))
}
