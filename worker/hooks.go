package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"hermeshost/control"
	"hermeshost/service"
	"hermeshost/subagent"
)

// HookProxy serves the agent's subagent hooks on a unix socket beside the token proxy and
// carries them to the control API with the org's control key, which the agent never holds.
// Every child is recorded as the running job's: the job is the worker's, not something a
// hook may say, and a hook can only stop, drain or acknowledge the children of this job.
//
//	POST /subagents                    {id, session_id, parent_session, parent_subagent, goal, role}
//	POST /subagents/{id}/stop          {status: done|failed, summary}
//	GET  /subagents/{id}/mailbox?wait_ms=N
//	POST /subagents/{id}/mailbox/ack   {ids}
type HookProxy struct {
	*socketServer

	ctl   *control.Client
	job   string
	log   *slog.Logger
	event func(kind string, data any)

	mu   sync.Mutex
	mine map[string]bool // children known to be this job's
}

// maxHookBody bounds a hook's request body.
const maxHookBody = 64 << 10

// StartHookProxy listens on socket (0600; an old socket file is replaced). event, if set,
// hears of every child started and stopped, for the job's progress stream.
func StartHookProxy(socket string, ctl *control.Client, job string, log *slog.Logger, event func(kind string, data any)) (*HookProxy, error) {
	if event == nil {
		event = func(string, any) {}
	}
	p := &HookProxy{ctl: ctl, job: job, log: log, event: event, mine: map[string]bool{}}
	r := chi.NewRouter()
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		service.WriteError(w, http.StatusNotFound, control.CodeNotFound, "no such hook")
	})
	r.Post("/subagents", p.start)
	r.Post("/subagents/{id}/stop", p.stop)
	r.Get("/subagents/{id}/mailbox", p.mailbox)
	r.Post("/subagents/{id}/mailbox/ack", p.ack)
	srv, err := serveSocket(socket, "hook proxy", r)
	if err != nil {
		return nil, err
	}
	// Its Path is the agent's HERMES_HOST_HOOKS_SOCKET.
	p.socketServer = srv
	return p, nil
}

// hookStart is the start hook's body: a subagent.Start without the job, which is the
// worker's to say.
type hookStart struct {
	ID             string `json:"id"`
	Session        string `json:"session_id,omitempty"`
	ParentSession  string `json:"parent_session,omitempty"`
	ParentSubagent string `json:"parent_subagent,omitempty"`
	Goal           string `json:"goal"`
	Role           string `json:"role,omitempty"`
}

func decodeHook(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxHookBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		service.WriteError(w, http.StatusBadRequest, control.CodeInvalid, "the hook's body is not the JSON object it takes: "+err.Error())
		return false
	}
	if dec.Decode(&struct{}{}) != io.EOF {
		service.WriteError(w, http.StatusBadRequest, control.CodeInvalid, "the hook's body must be one JSON object with nothing after it")
		return false
	}
	return true
}

// answer passes the control API's answer on: its status and error for a refusal, the value
// for a success.
func (p *HookProxy) answer(w http.ResponseWriter, status int, v any, err error) {
	var apiErr *control.APIError
	switch {
	case errors.As(err, &apiErr):
		service.WriteError(w, apiErr.Status, apiErr.Code, apiErr.Message)
	case err != nil:
		p.log.Warn("subagent hook: control API unreachable", "job", p.job, "err", err)
		service.WriteError(w, http.StatusBadGateway, "control_unreachable", "the host's control API could not be reached")
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
}

func (p *HookProxy) start(w http.ResponseWriter, r *http.Request) {
	var req hookStart
	if !decodeHook(w, r, &req) {
		return
	}
	h, err := p.ctl.StartSubagent(r.Context(), subagent.Start{
		ID: req.ID, JobID: p.job, Session: req.Session, ParentSession: req.ParentSession,
		ParentSubagent: req.ParentSubagent, Goal: req.Goal, Role: req.Role,
	})
	if err == nil {
		p.mu.Lock()
		p.mine[h.ID] = true
		p.mu.Unlock()
		p.event("subagent_start", map[string]any{"id": h.ID, "goal": h.Goal, "role": h.Role, "parent_subagent": h.ParentSubagent})
	}
	p.answer(w, http.StatusCreated, h, err)
}

// ours reports whether id is a child of this job, asking the control API the first time;
// otherwise it has answered 404, as for a child that does not exist.
func (p *HookProxy) ours(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := chi.URLParam(r, "id")
	p.mu.Lock()
	known := p.mine[id]
	p.mu.Unlock()
	if known {
		return id, true
	}
	d, err := p.ctl.Subagent(r.Context(), id)
	if err == nil && d.Subagent.JobID != p.job {
		service.WriteError(w, http.StatusNotFound, control.CodeNotFound, "no such subagent of this job: "+id)
		return "", false
	}
	if err != nil {
		p.answer(w, 0, nil, err)
		return "", false
	}
	p.mu.Lock()
	p.mine[id] = true
	p.mu.Unlock()
	return id, true
}

func (p *HookProxy) stop(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Status  string `json:"status"`
		Summary string `json:"summary"`
	}
	if !decodeHook(w, r, &req) {
		return
	}
	id, ok := p.ours(w, r)
	if !ok {
		return
	}
	h, err := p.ctl.StopSubagent(r.Context(), id, req.Status, req.Summary)
	if err == nil {
		p.event("subagent_stop", map[string]any{"id": h.ID, "status": h.Status})
	}
	p.answer(w, http.StatusOK, h, err)
}

func (p *HookProxy) mailbox(w http.ResponseWriter, r *http.Request) {
	var wait time.Duration
	if v := r.URL.Query().Get("wait_ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 || ms > subagent.MaxWait.Milliseconds() {
			service.WriteError(w, http.StatusBadRequest, control.CodeInvalid,
				fmt.Sprintf("wait_ms must be an integer from 0 to %d", subagent.MaxWait.Milliseconds()))
			return
		}
		wait = time.Duration(ms) * time.Millisecond
	}
	id, ok := p.ours(w, r)
	if !ok {
		return
	}
	box, err := p.ctl.Mailbox(r.Context(), id, wait)
	p.answer(w, http.StatusOK, box, err)
}

func (p *HookProxy) ack(w http.ResponseWriter, r *http.Request) {
	var req struct {
		IDs []int64 `json:"ids"`
	}
	if !decodeHook(w, r, &req) {
		return
	}
	id, ok := p.ours(w, r)
	if !ok {
		return
	}
	n, err := p.ctl.Ack(r.Context(), id, req.IDs)
	p.answer(w, http.StatusOK, control.AckResult{Acked: n}, err)
}
