package web_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/cookiejar"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/gavv/httpexpect/v2"

	"hermeshost/chat"
	"hermeshost/internal/testio"
	"hermeshost/orghome"
	"hermeshost/orghome/hermesstate"
	"hermeshost/templates"
)

// turnStream opens a chat turn's stream through client with lastID as Last-Event-ID ("":
// none) and returns its messages until the stream ends.
func turnStream(t *testing.T, client *http.Client, url, lastID string) <-chan testio.SSEMessage {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%s: %d %s", url, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	t.Cleanup(func() { cancel(); resp.Body.Close() })
	msgs := make(chan testio.SSEMessage, 256)
	go func() {
		defer close(msgs)
		testio.ReadSSE(resp.Body, func(m testio.SSEMessage) bool { msgs <- m; return true })
	}()
	return msgs
}

// A chat turn through the launcher's proxy: its page connects to the turn's stream, which
// carries the turn's fragment at every change, each row the agent writes as it writes it,
// then the answer, and last the end; a browser reconnecting with the last id is told only
// that it ended, one reconnecting with an older id gets the turn as it is now.
func TestAChatTurnStreamsItsRowsAndAnswerThroughTheProxy(t *testing.T) {
	acme, _ := twoHomes(t, 0)
	acme.write("scripted-agent.json", `{"chat_step_ms": 300}`)
	d := newChatDash(t, acme)
	p := proxyFor(t, dashSecret, d.dash)
	p.running("acme", d.srv.URL)
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Transport: p.srv.Client().Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	e := httpexpect.WithConfig(httpexpect.Config{BaseURL: p.srv.URL, Reporter: httpexpect.NewAssertReporter(t), Client: client})
	login(e, "ada", password).Status(http.StatusSeeOther)

	loc := e.POST("/orgs/acme/chat").WithHeader("Origin", p.srv.URL).WithFormField("message", "What is our return policy?").
		Expect().Status(http.StatusSeeOther).Header("Location").Raw()
	id, ok := strings.CutPrefix(loc, "/orgs/acme/chat/turns/")
	if !ok {
		t.Fatalf("the send went to %q", loc)
	}
	pg := doc(t, e.GET(loc).Expect().Status(http.StatusOK).Body().Raw(), "/orgs/acme")
	live := testid(pg, "chat-live")
	connect, _ := live.Attr("sse-connect")
	if live.AttrOr("hx-ext", "") != "sse" || live.AttrOr("sse-close", "") != templates.ChatTurnEndEvent ||
		!strings.HasPrefix(connect, loc+"/events?rev=") || live.Find(`[sse-swap="`+templates.ChatTurnEvent+`"]`).Length() != 1 {
		html, _ := goquery.OuterHtml(live)
		t.Fatalf("the turn's page does not connect to its stream: %s", html)
	}
	if testid(pg, "chat-turn").AttrOr("hx-trigger", "") != "" {
		t.Error("the turn's fragment still polls")
	}

	type seen struct {
		rev                          int
		state                        string
		calls, results, answers, all int
	}
	var got []seen
	deadline := time.After(30 * time.Second)
	msgs := turnStream(t, client, p.srv.URL+connect, "")
	ended := false
	for !ended {
		select {
		case m, open := <-msgs:
			if !open {
				t.Fatalf("the stream closed before its end event; got %+v", got)
			}
			switch m.Event {
			case templates.ChatTurnEvent:
				f := doc(t, m.Data, "/orgs/acme")
				rev, err := strconv.Atoi(m.ID)
				if err != nil || testid(f, "chat-turn").AttrOr("data-rev", "") != m.ID {
					t.Fatalf("event id %q, fragment rev %q", m.ID, testid(f, "chat-turn").AttrOr("data-rev", ""))
				}
				got = append(got, seen{rev: rev, state: testid(f, "chat-state").Text(),
					calls: testid(f, "tool-call-name").Length(), results: testid(f, "tool-result").Length(),
					answers: testid(f, "chat-answer").Length(), all: testid(f, "message").Length()})
			case templates.ChatTurnEndEvent:
				ended = true
			}
		case <-deadline:
			t.Fatalf("no end within 30 s; got %+v", got)
		}
	}
	for i := 1; i < len(got); i++ {
		if got[i].rev <= got[i-1].rev || got[i].all < got[i-1].all {
			t.Errorf("event %d went back: %+v after %+v", i, got[i], got[i-1])
		}
	}
	// The rows arrived one by one while it ran: a fragment with the tool call and not yet
	// its result, one with the result and no answer, and the last one done, with the answer.
	var callOnly, resultNoAnswer bool
	for _, s := range got {
		callOnly = callOnly || (s.state == chat.StateRunning && s.calls == 1 && s.results == 0)
		resultNoAnswer = resultNoAnswer || (s.state == chat.StateRunning && s.results == 1 && s.answers == 0)
	}
	last := got[len(got)-1]
	if !callOnly || !resultNoAnswer || last.state != chat.StateDone || last.answers != 1 {
		t.Fatalf("the rows did not arrive as they formed: %+v", got)
	}
	turn, _ := d.runner.Get(id)
	if strconv.Itoa(last.rev) != strconv.FormatUint(turn.Rev, 10) {
		t.Errorf("the last event is rev %d, the turn's %d", last.rev, turn.Rev)
	}

	// Reconnecting after the end: only the end. With an older id: the turn as it is now.
	again := <-turnStream(t, client, p.srv.URL+loc+"/events", strconv.Itoa(last.rev))
	if again.Event != templates.ChatTurnEndEvent {
		t.Errorf("a reconnect after the end got %+v", again)
	}
	older := <-turnStream(t, client, p.srv.URL+loc+"/events", strconv.Itoa(got[0].rev))
	if older.Event != templates.ChatTurnEvent || older.ID != strconv.Itoa(last.rev) {
		t.Errorf("a reconnect from rev %d got %+v", got[0].rev, older)
	}
	// The ended turn's page does not connect.
	pg = doc(t, e.GET(loc).Expect().Status(http.StatusOK).Body().Raw(), "/orgs/acme")
	if testid(pg, "chat-live").Length() != 0 {
		t.Error("an ended turn's page still connects to its stream")
	}
	// A second new session: until its agent has made its session, its rows are none, never
	// an earlier session's, even one whose start time reads later than the turn's (another
	// clock, or the same second).
	db, err := sql.Open("sqlite", "file:"+filepath.Join(acme.dir, orghome.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	err = hermesstate.InsertSession(context.Background(), db, hermesstate.Session{ID: "20261203_120000_0a0b0c", Source: "cli", StartedAt: float64(time.Now().Add(time.Minute).Unix())})
	if err == nil {
		err = hermesstate.InsertMessage(context.Background(), db, hermesstate.Message{SessionID: "20261203_120000_0a0b0c", Role: "user", Content: "an earlier session", Timestamp: 1})
	}
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	loc2 := e.POST("/orgs/acme/chat").WithHeader("Origin", p.srv.URL).WithFormField("message", "And for sale items?").
		Expect().Status(http.StatusSeeOther).Header("Location").Raw()
	var sessions []string
	for m := range turnStream(t, client, p.srv.URL+loc2+"/events", "") {
		if m.Event == templates.ChatTurnEndEvent {
			break
		}
		if m.Event == templates.ChatTurnEvent {
			sessions = append(sessions, testid(doc(t, m.Data, "/orgs/acme"), "chat-session-id").Text())
		}
	}
	second, _ := d.runner.Get(strings.TrimPrefix(loc2, "/orgs/acme/chat/turns/"))
	if second.State != chat.StateDone || second.SessionID == turn.SessionID || second.SessionID == "20261203_120000_0a0b0c" {
		t.Fatalf("the second turn %+v", second)
	}
	for _, s := range sessions {
		if s != "" && s != second.SessionID {
			t.Fatalf("the second turn's stream showed session %q (its own is %s): %q", s, second.SessionID, sessions)
		}
	}

	// Another turn id: no stream.
	e.GET("/orgs/acme/chat/turns/0123456789abcdef/events").Expect().Status(http.StatusNotFound)
}
