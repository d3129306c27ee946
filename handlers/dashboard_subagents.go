package handlers

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"hermeshost/control"
	"hermeshost/subagent"
	"hermeshost/templates"
)

// subagentsShown is how many of the newest subagents the page lists.
const subagentsShown = subagent.MaxListLimit

// cancelReason is what a cancel from the dashboard records as its reason.
const cancelReason = "cancelled from the dashboard"

// Subagents is GET <prefix>/subagents: the org's subagents, running and finished, newest
// first, each running one with Cancel and Send message.
func (h *Dashboard) Subagents(w http.ResponseWriter, r *http.Request) {
	v := templates.SubagentsView{Frame: h.frame(r.Context(), templates.NavSubagents)}
	// Read before the list, so the stream replays whatever changed while it was read.
	if after, ok := liveAfter(r.Context()); ok {
		v.Live = h.Paths().Events(after)
	}
	ctx, cancel := h.source(r.Context())
	defer cancel()
	list, err := h.Control.Subagents(ctx, subagent.ListParams{Limit: subagentsShown})
	if err != nil {
		h.Log.Warn("dashboard: subagents from the control API", "org", h.Org, "err", err)
		v.Error = err.Error()
	}
	for _, s := range list {
		v.Rows = append(v.Rows, subagentRow(s))
	}
	h.Render(w, r, http.StatusOK, templates.DashboardSubagents(v))
}

func subagentRow(s subagent.Handle) templates.SubagentRow {
	row := templates.SubagentRow{
		ID: s.ID, Goal: s.Goal, Role: s.Role, Job: s.JobID, Status: s.Status, Summary: s.Summary, Pending: s.Pending,
		Started: shownTime(s.StartedAt), Ended: "—", Live: s.Live(), Running: s.Status == subagent.Running,
		Version: strconv.FormatInt(s.UpdatedAt.UnixMicro(), 10),
	}
	switch {
	case s.ParentSubagent != "":
		row.Parent = "subagent " + s.ParentSubagent
	case s.ParentSession != "":
		row.Parent = "session " + s.ParentSession
	case s.JobID != "":
		row.Parent = "job " + s.JobID
	}
	if s.EndedAt != nil {
		row.Ended = shownTime(*s.EndedAt)
	}
	if s.CancelledBy != "" {
		row.Cancelled = "by " + s.CancelledBy
		if s.CancelReason != "" {
			row.Cancelled += ": " + s.CancelReason
		}
	}
	return row
}

// actor is how the dashboard names the operator the launcher vouched for, as a cancel's
// actor and a message's sender.
func actor(ctx context.Context) string { return "operator:" + AssertedOperator(ctx) }

// SubagentCancel is POST <prefix>/subagents/{id}/cancel: asks the subagent to stop through
// the control API, the operator recorded as who asked. For htmx the answer is the row's
// cells, updated, or, when the cancel is refused (the subagent has ended), as they are now
// with the reason, both 200 so that htmx swaps them; otherwise back to the page.
func (h *Dashboard) SubagentCancel(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	ctx, cancel := h.source(r.Context())
	defer cancel()
	s, err := h.Control.CancelSubagent(ctx, id, actor(r.Context()), cancelReason)
	notice := "Cancel asked; it stops at its next mailbox read."
	if s.Status == subagent.Cancelled {
		notice = "Cancelled."
	}
	h.subagentAnswer(w, r, id, s, err, notice)
}

// SubagentSend is POST <prefix>/subagents/{id}/messages (form field body): queues the
// message in the running subagent's mailbox, from the operator; answered as SubagentCancel.
func (h *Dashboard) SubagentSend(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	body := strings.TrimSpace(r.PostFormValue("body"))
	ctx, cancel := h.source(r.Context())
	defer cancel()
	var err error
	if body == "" {
		err = errEmptyMessage
	} else {
		_, err = h.Control.SendSubagent(ctx, id, actor(r.Context()), body)
	}
	h.subagentAnswer(w, r, id, subagent.Handle{}, err, "Message queued; the subagent reads it at its next mailbox read.")
}

var errEmptyMessage = errors.New("empty message")

// subagentAnswer answers an action on subagent id: s is the handle the action returned
// (zero: read it anew), err the action's error, notice what to say when it succeeded.
func (h *Dashboard) subagentAnswer(w http.ResponseWriter, r *http.Request, id string, s subagent.Handle, err error, notice string) {
	if control.IsNotFound(err) {
		h.NotFound(w, r, "This organization has no such subagent; the subagents page lists its subagents.")
		return
	}
	refusal := subagentRefusal(err)
	if err != nil && refusal == "" {
		h.Log.Warn("dashboard: subagent action through the control API", "org", h.Org, "subagent", id, "path", r.URL.Path, "err", err)
		refusal = "The dispatcher's control API did not answer; nothing was done. Try again in a moment."
	}
	if !IsHTMX(r) {
		Redirect(w, r, h.Prefix+"/subagents")
		return
	}
	if s.ID == "" {
		ctx, cancel := h.source(r.Context())
		defer cancel()
		d, gerr := h.Control.Subagent(ctx, id)
		switch {
		case control.IsNotFound(gerr):
			h.NotFound(w, r, "This organization has no such subagent; the subagents page lists its subagents.")
			return
		case gerr != nil:
			h.Log.Warn("dashboard: subagent from the control API", "org", h.Org, "subagent", id, "err", gerr)
			h.Error(w, r, http.StatusBadGateway, "The dispatcher's control API did not answer; reload the page in a moment.")
			return
		}
		s = d.Subagent
	}
	row := subagentRow(s)
	row.Notice, row.Refused = notice, refusal != ""
	if row.Refused {
		row.Notice = refusal
	}
	h.Render(w, r, http.StatusOK, templates.SubagentCells(h.Paths(), row))
}

// subagentRefusal is what the operator reads of an action the control API refused for a
// reason of the subagent's, "" for any other error.
func subagentRefusal(err error) string {
	var e *control.APIError
	switch {
	case errors.Is(err, errEmptyMessage):
		return "Write a message first; nothing was sent."
	case control.IsEnded(err):
		return "Refused: the subagent has ended, so it takes no cancel or message."
	case errors.As(err, &e) && e.Code == control.CodeCancelling:
		return "Refused: the subagent is being cancelled and takes no more messages."
	case errors.As(err, &e) && e.Code == control.CodeMailboxFull:
		return "Refused: the subagent's mailbox is full (it has not read its messages); wait for it to read them."
	case errors.As(err, &e) && e.Code == control.CodeInvalid:
		return "Refused: " + e.Message
	}
	return ""
}
