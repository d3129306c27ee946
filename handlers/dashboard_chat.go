package handlers

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/a-h/templ"
	"github.com/go-chi/chi/v5"

	"hermeshost/chat"
	"hermeshost/orghome"
	"hermeshost/templates"
)

// Bounds of the chat pages: recent sessions offered, running jobs shown while a turn
// waits, and the rows of a session shown under its turn.
const (
	chatSessionsShown = 20
	chatJobsRead      = 20
	chatRowsShown     = 200
	maxChatForm       = chat.MaxMessage + 4<<10
)

// Chat is the dashboard's chat: turns run by Runner, which outlives the requests.
type Chat struct {
	*Dashboard
	Runner *chat.Runner
}

// ready says, when the dashboard was started without an agent command, that chat is off.
func (h *Chat) ready(w http.ResponseWriter, r *http.Request) bool {
	if h.Runner == nil {
		h.Error(w, r, http.StatusServiceUnavailable, "Chat is off on this dashboard: it was started without an agent command (HERMES_BIN).")
		return false
	}
	return true
}

// ChatPage is GET <prefix>/chat (?session= preselects one): the form.
func (h *Chat) ChatPage(w http.ResponseWriter, r *http.Request) {
	if !h.ready(w, r) {
		return
	}
	h.renderForm(w, r, http.StatusOK, r.URL.Query().Get("session"), "", "")
}

func (h *Chat) renderForm(w http.ResponseWriter, r *http.Request, status int, session, message, refusal string) {
	v := templates.ChatPageView{Frame: h.frame(r.Context(), templates.NavChat), Session: session, Message: message, Error: refusal}
	st, err := h.Home.State()
	var page orghome.SessionPage
	if err == nil {
		page, err = st.Sessions(r.Context(), orghome.SessionQuery{Limit: chatSessionsShown})
	}
	switch {
	case errors.Is(err, orghome.ErrNoSessions):
		// No session yet: only a new one can be chosen.
	case err != nil:
		h.Log.Warn("dashboard: chat sessions", "org", h.Org, "err", err)
		v.SessionsError = "The recent sessions could not be read; a new session can still be started."
	case page.Status == orghome.StatusInterrupted:
		v.SessionsError = "state.db holds a write Hermes did not finish, which it rolls back when it next starts: start a new session, or pick a recent one after that."
	case page.Status != "":
		v.SessionsError = "state.db is busy; reload to pick a recent session."
	}
	for _, s := range page.Sessions {
		label := s.ID
		if s.Title != "" {
			label += " — " + s.Title
		}
		v.Sessions = append(v.Sessions, templates.ChatSessionOption{ID: s.ID, Label: label})
	}
	h.Render(w, r, status, templates.DashboardChat(v))
}

// ChatSend is POST <prefix>/chat (form: session, message): starts a turn and goes to its
// page. A refusal (empty message, a session with a message already waiting) comes back on
// the form, the text kept, with the reason.
func (h *Chat) ChatSend(w http.ResponseWriter, r *http.Request) {
	if !h.ready(w, r) {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxChatForm)
	session := strings.TrimSpace(r.PostFormValue("session"))
	message := r.PostFormValue("message")
	t, err := h.Runner.Start(AssertedOperator(r.Context()), session, message)
	switch {
	case errors.Is(err, chat.ErrQueueFull):
		h.renderForm(w, r, http.StatusConflict, session, message, "Not sent: "+err.Error()+".")
		return
	case err != nil:
		h.renderForm(w, r, http.StatusBadRequest, session, message, "Not sent: "+err.Error()+".")
		return
	}
	Redirect(w, r, h.turnPath(t.ID, ""))
}

func (h *Chat) turnPath(id, rest string) string {
	return string(h.Paths().Page("/chat/turns/" + url.PathEscape(id) + rest))
}

// ChatTurn is GET <prefix>/chat/turns/{turn}: the turn's page. A reload finds the turn
// still in the Runner, running or not, and its stream (ChatTurnEvents) picks up from there.
func (h *Chat) ChatTurn(w http.ResponseWriter, r *http.Request) {
	t, ok := h.Turn(w, r)
	if !ok {
		return
	}
	h.Render(w, r, http.StatusOK, templates.DashboardChatTurn(templates.ChatTurnView{Frame: h.frame(r.Context(), templates.NavChat), Turn: h.turnState(r, t)}))
}

// Turn is the turn the request's {turn} names; when there is none (or chat is off) the
// error page has been written and ok is false.
func (h *Chat) Turn(w http.ResponseWriter, r *http.Request) (chat.Turn, bool) {
	if !h.ready(w, r) {
		return chat.Turn{}, false
	}
	t, ok := h.Runner.Get(chi.URLParam(r, "turn"))
	if !ok {
		h.NotFound(w, r, "No such chat turn here: turns are kept while this dashboard runs; the chat page starts one.")
	}
	return t, ok
}

// TurnFragment is turn t's fragment as its stream carries it.
func (h *Chat) TurnFragment(r *http.Request, t chat.Turn) (string, error) {
	var b strings.Builder
	err := templates.ChatTurnFragment(h.turnState(r, t)).Render(r.Context(), &b)
	return b.String(), err
}

// ChatStop is POST <prefix>/chat/turns/{turn}/stop: ends the turn on the server (the agent
// killed, the leases released) and shows it ended.
func (h *Chat) ChatStop(w http.ResponseWriter, r *http.Request) {
	if !h.ready(w, r) {
		return
	}
	id := chi.URLParam(r, "turn")
	if _, ok := h.Runner.Stop(id, AssertedOperator(r.Context())); !ok {
		h.NotFound(w, r, "No such chat turn here: turns are kept while this dashboard runs; the chat page starts one.")
		return
	}
	Redirect(w, r, h.turnPath(id, ""))
}

func (h *Chat) turnState(r *http.Request, t chat.Turn) templates.ChatTurnState {
	s := templates.ChatTurnState{
		ID: t.ID, State: t.State, Active: t.Active(), Message: t.Message, Position: t.Position,
		Waiting: t.Waiting, HeldBy: t.HeldBy, Answer: t.Answer, Reason: t.Reason,
		Started: shownTime(t.StartedAt), Events: h.turnPath(t.ID, "/events"), Rev: t.Rev,
		Stop:    templ.SafeURL(h.turnPath(t.ID, "/stop")),
		NewTurn: h.Paths().Page("/chat"),
	}
	if !t.EndedAt.IsZero() {
		s.Ended = shownTime(t.EndedAt)
	}
	if t.State == chat.StateQueued && t.Waiting == "home:"+h.Org {
		s.Jobs, s.JobsError = h.runningJobs(r)
	}
	session, err := h.Runner.LiveSession(r.Context(), t)
	if err != nil && !errors.Is(err, orghome.ErrNoSessions) {
		s.MessagesError = "The session's rows could not be read this time: " + err.Error()
	}
	s.SessionID = session
	if session == "" {
		return s
	}
	s.Session = h.Paths().Page("/sessions/" + url.PathEscape(session))
	st, err := h.Home.State()
	if err != nil {
		s.MessagesError = "The session's rows could not be read this time: " + err.Error()
		return s
	}
	tr, err := st.TranscriptPage(r.Context(), session, orghome.TranscriptQuery{Limit: chatRowsShown})
	switch {
	case err != nil:
		s.MessagesError = "The session's rows could not be read this time: " + err.Error()
	case tr.Status == orghome.StatusInterrupted:
		s.MessagesError = "state.db holds a write Hermes did not finish; the rows show once Hermes has started again and rolled it back."
	case tr.Status != "":
		s.MessagesError = "state.db is busy; the rows show on the next refresh."
	}
	for _, m := range tr.Messages {
		s.Messages = append(s.Messages, transcriptMessage(m))
	}
	return s
}

// runningJobs are the org's claimed and running jobs, with what their newest events say
// was persisted: what a turn waiting for the home waits on.
func (h *Chat) runningJobs(r *http.Request) ([]templates.ChatJobRow, string) {
	ctx, cancel := h.source(r.Context())
	defer cancel()
	page, err := h.Control.Jobs(ctx, chatJobsRead, "")
	if err != nil {
		return nil, err.Error()
	}
	var rows []templates.ChatJobRow
	for _, j := range page.Jobs {
		if j.Status != "RUNNING" && j.Status != "CLAIMED" {
			continue
		}
		row := templates.ChatJobRow{
			ID: j.ID, Type: j.Type, Status: j.Status, Attempt: j.Attempt, Updated: shownTime(j.UpdatedAt),
			Link: h.Paths().Page("/jobs/" + url.PathEscape(j.ID)),
		}
		if d, err := h.Control.JobNewest(ctx, j.ID, liveJobEvents); err == nil {
			for _, e := range d.Events {
				var data jobEventData
				if json.Unmarshal(e.Data, &data) == nil && data.Persisted != nil {
					row.Progress = strconv.Itoa(len(*data.Persisted)) + " persisted: " + strings.Join(*data.Persisted, ", ")
				}
			}
		}
		rows = append(rows, row)
	}
	return rows, ""
}
