package scriptedagent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// hooks is the worker's subagent hook socket as an HTTP client.
type hooks struct {
	hc *http.Client
}

func newHooks() (*hooks, error) {
	socket := os.Getenv(EnvHooks)
	if socket == "" {
		return nil, fmt.Errorf("%s asks for a subagent, but the worker serves no hooks (%s is unset)", KnobsFile, EnvHooks)
	}
	return &hooks{hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}}, nil
}

// call sends one hook and decodes its answer into out; a refusal is an error with the
// hook's message.
func (h *hooks) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://hooks"+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.hc.Do(req)
	if err != nil {
		return fmt.Errorf("hook %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return fmt.Errorf("hook %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("hook %s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// child runs the knob's subagent through the hooks, as a Hermes subagent would report
// itself: start, drain and acknowledge its mailbox, stop.
func (r *run) child(k SubagentKnob) error {
	h, err := newHooks()
	if err != nil {
		return err
	}
	start := map[string]any{"id": k.ID, "goal": k.Goal, "parent_session": r.session}
	if k.Role != "" {
		start["role"] = k.Role
	}
	if err := h.call(r.ctx, http.MethodPost, "/subagents", start, nil); err != nil {
		return err
	}
	if err := r.message("assistant", "Started subagent "+k.ID+": "+k.Goal, nil, "", ""); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Duration(k.WaitMS) * time.Millisecond)
	var heard []string
	stopAsked := false
	for {
		wait := min(time.Until(deadline), 2*time.Second)
		path := "/subagents/" + k.ID + "/mailbox"
		if wait > 0 {
			path += fmt.Sprintf("?wait_ms=%d", wait.Milliseconds())
		}
		var box struct {
			Stop     bool `json:"stop"`
			Messages []struct {
				ID   int64  `json:"id"`
				Body string `json:"body"`
			} `json:"messages"`
		}
		if err := h.call(r.ctx, http.MethodGet, path, nil, &box); err != nil {
			return err
		}
		var ids []int64
		for _, m := range box.Messages {
			ids = append(ids, m.ID)
			heard = append(heard, m.Body)
		}
		if len(ids) > 0 {
			if err := h.call(r.ctx, http.MethodPost, "/subagents/"+k.ID+"/mailbox/ack", map[string]any{"ids": ids}, nil); err != nil {
				return err
			}
		}
		stopAsked = box.Stop
		if stopAsked || len(heard) > 0 || !time.Now().Before(deadline) {
			break
		}
	}
	summary := "nothing came"
	switch {
	case stopAsked:
		summary = "stopped as asked"
	case len(heard) > 0:
		summary = "heard: " + strings.Join(heard, " | ")
	}
	return h.call(r.ctx, http.MethodPost, "/subagents/"+k.ID+"/stop", map[string]any{"status": "done", "summary": summary}, nil)
}
