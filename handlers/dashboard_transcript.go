package handlers

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"hermeshost/orghome"
	"hermeshost/templates"
)

// transcriptPage is how many messages one page of a transcript shows: a session of
// thousands is read a page at a time, which keeps each page light for the browser too.
const transcriptPage = 200

// Folding of long message content: past foldAfter characters a message shows its first
// previewChars and folds the rest.
const (
	foldAfter    = 1500
	previewChars = 280
)

// HermesTranscript is GET <prefix>/sessions/{id}: one Hermes session's messages in the
// order Hermes wrote them, without the rows Hermes hides, tool calls and results folded.
// The system prompt is shown, folded, only with ?system=1. The id is looked up in this
// org's own state.db, the only one the dashboard opens: another org's session is not found.
func (h *Dashboard) HermesTranscript(w http.ResponseWriter, r *http.Request) {
	id, err := url.PathUnescape(chi.URLParam(r, "id"))
	if err != nil || id == "" {
		h.NotFound(w, r, "There is no Hermes session at this address.")
		return
	}
	var after int64
	if a := r.URL.Query().Get("after"); a != "" {
		if after, err = strconv.ParseInt(a, 10, 64); err != nil || after < 0 {
			h.Error(w, r, http.StatusBadRequest, "This page of the transcript is not one the dashboard made. Start again from its first messages.")
			return
		}
	}
	st, err := h.Home.State()
	if errors.Is(err, orghome.ErrNoSessions) {
		h.NotFound(w, r, "This organization has no Hermes sessions yet: its home has no state.db.")
		return
	}
	if err != nil {
		h.Failed(w, r, err)
		return
	}
	t, err := st.TranscriptPage(r.Context(), id, orghome.TranscriptQuery{After: after, Limit: transcriptPage})
	switch {
	case errors.Is(err, orghome.ErrSessionNotFound), errors.Is(err, orghome.ErrNoSessions):
		h.NotFound(w, r, "This organization has no Hermes session "+id+".")
		return
	case err != nil:
		h.Failed(w, r, err)
		return
	}
	v := templates.TranscriptView{Frame: h.frame(r.Context(), templates.NavSessions),
		Busy: t.Status == orghome.StatusBusy, Interrupted: t.Status == orghome.StatusInterrupted}
	if v.Busy || v.Interrupted {
		h.Render(w, r, http.StatusOK, templates.DashboardTranscript(v))
		return
	}
	path := "/sessions/" + url.PathEscape(id)
	v.Session = h.hermesSessionRow(t.Session, nil)
	v.Session.Kind = ""
	v.Omitted = t.Omitted
	v.SystemChars = utf8.RuneCountInString(t.SystemPrompt)
	v.ShowSystem = r.URL.Query().Get("system") == "1"
	if v.ShowSystem {
		v.SystemPrompt = t.SystemPrompt
	}
	v.ShowSystemLink = h.Paths().PageWith(path, url.Values{"system": {"1"}})
	v.HideSystemLink = h.Paths().Page(path)
	if t.Next != 0 {
		v.Next = h.Paths().PageWith(path, url.Values{"after": {strconv.FormatInt(t.Next, 10)}})
	}
	if after != 0 {
		v.First = h.Paths().Page(path)
	}
	for _, m := range t.Messages {
		v.Messages = append(v.Messages, transcriptMessage(m))
	}
	h.Render(w, r, http.StatusOK, templates.DashboardTranscript(v))
}

func transcriptMessage(m orghome.Message) templates.TranscriptMessage {
	out := templates.TranscriptMessage{
		ID: m.ID, Role: m.Role, Time: shownTime(m.Timestamp), Content: m.Content,
		Chars: utf8.RuneCountInString(m.Content), ToolName: m.ToolName,
	}
	if m.Role != "tool" && out.Chars > foldAfter {
		out.Long = true
		out.Preview = string([]rune(m.Content)[:previewChars])
	}
	for _, c := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, templates.ToolCallView{
			Name: c.Name, Arguments: indentJSON(c.Arguments), Chars: utf8.RuneCountInString(c.Arguments),
		})
	}
	return out
}

// indentJSON is s indented when it is JSON (tool arguments usually are), else s as it is.
func indentJSON(s string) string {
	var buf bytes.Buffer
	if json.Indent(&buf, []byte(s), "", "  ") != nil {
		return s
	}
	return buf.String()
}
