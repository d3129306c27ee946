package scriptedagent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"hermeshost/orghome/hermesstate"
)

// HooksSocketEnv is where the host's plugin finds the worker's hook socket.
const HooksSocketEnv = "HERMES_HOST_HOOKS_SOCKET"

// SubagentKnob is the child the agent delegates. It works in steps (one tool call each)
// until an operator's message reaches it in a tool result (it quotes it in its summary), a
// cancel blocks its next tool call, or WaitMS passes; WaitMS 0 is one step.
type SubagentKnob struct {
	ID     string `json:"id,omitempty"`
	Goal   string `json:"goal"`
	Role   string `json:"role,omitempty"`
	WaitMS int    `json:"wait_ms,omitempty"`
}

// stepTime is how long one of the child's tool calls takes.
const stepTime = 100 * time.Millisecond

// plugin is the host's Hermes plugin (hermesplugin/hermes_host) as it behaves inside the
// agent's process: the same requests, with the same bodies, at the same hooks. The real
// plugin is Python and cannot run inside this Go stand-in, so its protocol is played here;
// the plugin's own tests hold the Python side to it.
type plugin struct {
	hc       *http.Client
	children map[string]*pluginChild // by child session
}

type pluginChild struct {
	id      string
	seen    map[int64]bool
	pending []mailMessage
	unacked []int64
	stop    string
}

type mailMessage struct {
	ID     int64  `json:"id"`
	Sender string `json:"sender"`
	Body   string `json:"body"`
}

// loadPlugin is Hermes loading the plugin: only when installed and enabled, and the plugin
// registers its hooks only when the worker serves the socket.
func (r *run) loadPlugin() *plugin {
	socket := os.Getenv(HooksSocketEnv)
	if socket == "" || !r.settings.pluginLoaded(r.home) {
		return nil
	}
	return &plugin{children: map[string]*pluginChild{}, hc: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}}
}

// call sends one request; status 0 is a socket that could not be reached, which the plugin
// logs and lives with.
func (p *plugin) call(ctx context.Context, method, path string, body, out any) int {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://hermes-host-hooks"+path, rd)
	if err != nil {
		return 0
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if resp.StatusCode/100 == 2 && out != nil {
		_ = json.Unmarshal(data, out)
	}
	return resp.StatusCode
}

func route(c *pluginChild, rest string) string { return "/subagents/" + url.PathEscape(c.id) + rest }

// subagentStart is the plugin's subagent_start.
func (p *plugin) subagentStart(ctx context.Context, parentSession, childSession, childID, role, goal string) {
	body := map[string]any{"id": childID, "goal": goal, "session_id": childSession, "parent_session": parentSession}
	if role != "" {
		body["role"] = role
	}
	if st := p.call(ctx, http.MethodPost, "/subagents", body, nil); st/100 == 2 {
		p.children[childSession] = &pluginChild{id: childID, seen: map[int64]bool{}}
	}
}

func (p *plugin) drain(ctx context.Context, c *pluginChild) {
	var box struct {
		Status       string        `json:"status"`
		Stop         bool          `json:"stop"`
		CancelReason string        `json:"cancel_reason"`
		Messages     []mailMessage `json:"messages"`
	}
	if p.call(ctx, http.MethodGet, route(c, "/mailbox?wait_ms=0"), nil, &box)/100 != 2 {
		return
	}
	for _, m := range box.Messages {
		if !c.seen[m.ID] {
			c.seen[m.ID] = true
			c.pending = append(c.pending, m)
		}
	}
	if box.Stop && c.stop == "" {
		c.stop = "The operator running this job has cancelled this subagent. Stop now: do not call any more tools. " +
			"Reply at once with a short report of what you have done so far and what is left undone."
	}
}

func (p *plugin) flushAcks(ctx context.Context, c *pluginChild) {
	if len(c.unacked) == 0 {
		return
	}
	if p.call(ctx, http.MethodPost, route(c, "/mailbox/ack"), map[string]any{"ids": c.unacked}, nil) != 0 {
		c.unacked = nil
	}
}

// preToolCall is the plugin's pre_tool_call: the block message, or "" to run the tool.
func (p *plugin) preToolCall(ctx context.Context, childSession string) string {
	c := p.children[childSession]
	if c == nil {
		return ""
	}
	if c.stop == "" {
		p.flushAcks(ctx, c)
		p.drain(ctx, c)
	}
	return c.stop
}

// transformToolResult is the plugin's transform_tool_result: the result with the
// operator's messages appended, and the messages delivered.
func (p *plugin) transformToolResult(ctx context.Context, childSession, result string) (string, []mailMessage) {
	c := p.children[childSession]
	if c == nil {
		return result, nil
	}
	p.flushAcks(ctx, c)
	if c.stop == "" {
		p.drain(ctx, c)
	}
	deliver := c.pending
	c.pending = nil
	if len(deliver) == 0 {
		return result, nil
	}
	var b strings.Builder
	b.WriteString(result)
	b.WriteString("\n\n--- Messages from the operator running this job (sent to this subagent while it worked; they are not part of the tool's output) ---")
	for _, m := range deliver {
		c.unacked = append(c.unacked, m.ID)
		fmt.Fprintf(&b, "\n[message %d from %s]\n%s", m.ID, m.Sender, m.Body)
	}
	b.WriteString("\n--- end of the operator's messages ---")
	p.flushAcks(ctx, c)
	return b.String(), deliver
}

// subagentStop is the plugin's subagent_stop; Hermes' "completed" is the host's done.
func (p *plugin) subagentStop(ctx context.Context, childSession, hermesStatus, summary string) {
	c := p.children[childSession]
	if c == nil {
		return
	}
	delete(p.children, childSession)
	p.flushAcks(ctx, c)
	status := "failed"
	if hermesStatus == "completed" {
		status = "done"
	}
	p.call(ctx, http.MethodPost, route(c, "/stop"), map[string]any{"status": status, "summary": summary}, nil)
}

// child delegates the knob's subagent as Hermes' delegate_task does: a child session whose
// parent is this one, running in this process, its steps passing the plugin's hooks.
func (r *run) child(k SubagentKnob) error {
	p := r.loadPlugin()
	childSession := newID() // a session id like any other: the parent link says it is a child
	callID := "call_" + newID()
	args, _ := json.Marshal(map[string]string{"goal": k.Goal, "role": k.Role})
	if err := r.message("assistant", "", []hermesstate.ToolCall{{ID: callID, Name: "delegate_task", Arguments: string(args)}}, "", ""); err != nil {
		return err
	}
	if err := hermesstate.InsertSession(r.ctx, r.db, hermesstate.Session{
		ID: childSession, Source: "tool", Model: r.ep.model, ParentID: r.session, StartedAt: now(),
	}); err != nil {
		return err
	}
	if err := r.messageIn(childSession, "user", k.Goal, nil, "", ""); err != nil {
		return err
	}
	if p != nil {
		p.subagentStart(r.ctx, r.session, childSession, k.ID, k.Role, k.Goal)
	}
	deadline := time.Now().Add(time.Duration(k.WaitMS) * time.Millisecond)
	summary := "nothing came"
	for step := 0; ; step++ {
		stepID := fmt.Sprintf("call_%s_%d", newID(), step)
		if err := r.messageIn(childSession, "assistant", "", []hermesstate.ToolCall{{ID: stepID, Name: "terminal",
			Arguments: `{"command": "sleep 0.1"}`}}, "", ""); err != nil {
			return err
		}
		if p != nil {
			if block := p.preToolCall(r.ctx, childSession); block != "" {
				if err := r.messageIn(childSession, "tool", block, nil, "terminal", stepID); err != nil {
					return err
				}
				summary = "stopped as asked"
				break
			}
		}
		step := stepTime
		if r.knobs.StepMS > 0 {
			step = time.Duration(r.knobs.StepMS) * time.Millisecond
		}
		select {
		case <-time.After(step):
		case <-r.ctx.Done():
			return r.ctx.Err()
		}
		result := ""
		var heard []mailMessage
		if p != nil {
			result, heard = p.transformToolResult(r.ctx, childSession, result)
		}
		if err := r.messageIn(childSession, "tool", result, nil, "terminal", stepID); err != nil {
			return err
		}
		if len(heard) > 0 {
			bodies := make([]string, len(heard))
			for i, m := range heard {
				bodies[i] = m.Body
			}
			summary = "heard: " + strings.Join(bodies, " | ")
			break
		}
		if !time.Now().Before(deadline) {
			break
		}
	}
	if err := r.messageIn(childSession, "assistant", summary, nil, "", ""); err != nil {
		return err
	}
	if p != nil {
		p.subagentStop(r.ctx, childSession, "completed", summary)
	}
	return r.message("tool", summary, nil, "delegate_task", callID)
}
