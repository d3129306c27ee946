package control

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"hermeshost/mirror"
	"hermeshost/service"
	"hermeshost/subagent"
)

// Error codes of the subagent endpoints (409s).
const (
	CodeConflict    = "conflict"     // a start repeated an id with other details
	CodeEnded       = "ended"        // the subagent has ended
	CodeCancelling  = "cancelling"   // the subagent is being cancelled and takes no messages
	CodeMailboxFull = "mailbox_full" // subagent.MaxPending messages wait unacknowledged
)

// MaxSubagentMessages is how many of a subagent's newest messages GET /v1/subagents/{id}
// shows.
const MaxSubagentMessages = 100

// SubagentDetail is GET /v1/subagents/{id}: the handle and its newest messages, oldest
// first.
type SubagentDetail struct {
	Subagent subagent.Handle    `json:"subagent"`
	Messages []subagent.Message `json:"messages"`
}

// SubagentList is GET /v1/subagents.
type SubagentList struct {
	Subagents []subagent.Handle `json:"subagents"`
}

type stopRequest struct {
	Status  string `json:"status"`
	Summary string `json:"summary"`
}

type sendRequest struct {
	Sender string `json:"sender"`
	Body   string `json:"body"`
}

type cancelRequest struct {
	Actor  string `json:"actor"`
	Reason string `json:"reason"`
}

type ackRequest struct {
	IDs []int64 `json:"ids"`
}

// AckResult is POST /v1/subagents/{id}/mailbox/ack: how many messages were newly
// acknowledged.
type AckResult struct {
	Acked int `json:"acked"`
}

// subagentError answers a store error: 400, 404 or 409 with its message (ids and statuses,
// nothing secret), else a 500.
func (s *Server) subagentError(w http.ResponseWriter, r *http.Request, err error) {
	code := ""
	switch {
	case errors.Is(err, subagent.ErrInvalid):
		badRequest(w, "%s", strings.TrimPrefix(err.Error(), subagent.ErrInvalid.Error()+": "))
		return
	case errors.Is(err, subagent.ErrNotFound):
		writeNotFound(w, err.Error())
		return
	case errors.Is(err, subagent.ErrConflict):
		code = CodeConflict
	case errors.Is(err, subagent.ErrEnded):
		code = CodeEnded
	case errors.Is(err, subagent.ErrNotLive):
		code = CodeCancelling
	case errors.Is(err, subagent.ErrMailboxFull):
		code = CodeMailboxFull
	default:
		s.internal(w, r, err)
		return
	}
	service.WriteError(w, http.StatusConflict, code, err.Error())
}

func subagentID(r *http.Request) string { return chi.URLParam(r, "id") }

// subagentStart is POST /v1/subagents, the subagent_start hook: 201 with the new handle, or
// 200 with the existing one when the hook fired twice.
func (s *Server) subagentStart(w http.ResponseWriter, r *http.Request) {
	var req subagent.Start
	if !decodeBody(w, r, &req) {
		return
	}
	h, created, err := s.cfg.Subagents.Start(r.Context(), orgOf(r), req)
	if err != nil {
		s.subagentError(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, h)
}

// subagentStop is POST /v1/subagents/{id}/stop, the subagent_stop hook.
func (s *Server) subagentStop(w http.ResponseWriter, r *http.Request) {
	var req stopRequest
	if !decodeBody(w, r, &req) {
		return
	}
	h, err := s.cfg.Subagents.Stop(r.Context(), orgOf(r), subagentID(r), req.Status, req.Summary)
	if err != nil {
		s.subagentError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, h)
}

// subagentList is GET /v1/subagents?status=&job_id=&limit=: the org's subagents, newest
// started first.
func (s *Server) subagentList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := subagent.ListParams{Status: q.Get("status"), JobID: q.Get("job_id")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > subagent.MaxListLimit {
			badRequest(w, "limit must be an integer from 1 to %d", subagent.MaxListLimit)
			return
		}
		p.Limit = n
	}
	hs, err := s.cfg.Subagents.List(r.Context(), orgOf(r), p)
	if err != nil {
		s.subagentError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, SubagentList{Subagents: hs})
}

// subagentShow is GET /v1/subagents/{id}.
func (s *Server) subagentShow(w http.ResponseWriter, r *http.Request) {
	h, err := s.cfg.Subagents.Get(r.Context(), orgOf(r), subagentID(r))
	if err != nil {
		s.subagentError(w, r, err)
		return
	}
	ms, err := s.cfg.Subagents.Messages(r.Context(), orgOf(r), h.ID, MaxSubagentMessages)
	if err != nil {
		s.subagentError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, SubagentDetail{Subagent: h, Messages: ms})
}

// subagentSend is POST /v1/subagents/{id}/messages: 201 with the queued message.
func (s *Server) subagentSend(w http.ResponseWriter, r *http.Request) {
	var req sendRequest
	if !decodeBody(w, r, &req) {
		return
	}
	m, err := s.cfg.Subagents.Send(r.Context(), orgOf(r), subagentID(r), req.Sender, req.Body)
	if err != nil {
		s.subagentError(w, r, err)
		return
	}
	if h, err := s.cfg.Subagents.Get(r.Context(), orgOf(r), subagentID(r)); err == nil {
		s.noteOnJob(r.Context(), h, "subagent_message", map[string]any{"id": h.ID, "sender": req.Sender, "message": m.ID})
	}
	writeJSON(w, http.StatusCreated, m)
}

// subagentCancel is POST /v1/subagents/{id}/cancel.
func (s *Server) subagentCancel(w http.ResponseWriter, r *http.Request) {
	var req cancelRequest
	if !decodeBody(w, r, &req) {
		return
	}
	h, err := s.cfg.Subagents.Cancel(r.Context(), orgOf(r), subagentID(r), req.Actor, req.Reason)
	if err != nil {
		s.subagentError(w, r, err)
		return
	}
	s.noteOnJob(r.Context(), h, "subagent_cancel", map[string]any{"id": h.ID, "actor": req.Actor, "reason": req.Reason})
	writeJSON(w, http.StatusOK, h)
}

// noteOnJob records an operator's action on a job's subagent as an event of the job, so
// the job's history holds it and the dashboards watching the org show the row change. A
// subagent of no job, or of a job the mirror does not hold, has no history to add to; a
// failed note is logged, the action stands.
func (s *Server) noteOnJob(ctx context.Context, h subagent.Handle, kind string, data map[string]any) {
	if h.JobID == "" {
		return
	}
	if _, err := s.mirror.Note(ctx, h.Org, h.JobID, kind, data); err != nil && !errors.Is(err, mirror.ErrNotFound) {
		s.cfg.Log.Warn("control: note a subagent's change on its job", "org", h.Org, "job", h.JobID, "subagent", h.ID, "err", err)
	}
}

// subagentMailbox is GET /v1/subagents/{id}/mailbox?wait_ms=N: the child's unacknowledged
// messages and whether it must stop, waiting up to wait_ms (at most the server's maximum)
// while there is neither.
func (s *Server) subagentMailbox(w http.ResponseWriter, r *http.Request) {
	var wait time.Duration
	if v := r.URL.Query().Get("wait_ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		most := min(s.cfg.MaxWait, subagent.MaxWait)
		if err != nil || ms < 0 || millis(ms) > most {
			badRequest(w, "wait_ms must be an integer from 0 to %d", most.Milliseconds())
			return
		}
		wait = millis(ms)
	}
	if wait > 0 {
		service.LongAnswer(w) // the wait may outlast the server's read timeout
	}
	box, err := s.cfg.Subagents.Drain(r.Context(), orgOf(r), subagentID(r), wait)
	if err != nil {
		s.subagentError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, box)
}

// subagentAck is POST /v1/subagents/{id}/mailbox/ack {ids}.
func (s *Server) subagentAck(w http.ResponseWriter, r *http.Request) {
	var req ackRequest
	if !decodeBody(w, r, &req) {
		return
	}
	n, err := s.cfg.Subagents.Ack(r.Context(), orgOf(r), subagentID(r), req.IDs)
	if err != nil {
		s.subagentError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, AckResult{Acked: n})
}
