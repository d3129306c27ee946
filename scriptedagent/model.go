package scriptedagent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

var client = &http.Client{Timeout: 2 * time.Minute}

// probe asks what the real CLI asks an endpoint at start-up (HERMES.md): GET /v1/models
// without auth, GET /api/v1/models, POST /api/show and GET /v1/models/<id>. Like the real
// one's (agent/model_metadata.py), the probe is best effort and never fails the run: any
// answer will do (404s too), a leg that fails goes on to the next, and a connect that times
// out ends the probing (the real CLI then skips that host's probes for 30 s and falls back
// to a default context length). An endpoint that is really down fails the run at its first
// completion, after the retries.
func (r *run) probe() {
	root := strings.TrimSuffix(r.ep.baseURL, "/v1")
	for _, p := range []struct{ method, url string }{
		{http.MethodGet, r.ep.baseURL + "/models"},
		{http.MethodGet, root + "/api/v1/models"},
		{http.MethodPost, root + "/api/show"},
		{http.MethodGet, r.ep.baseURL + "/models/" + url.PathEscape(r.ep.model)},
	} {
		var body io.Reader
		if p.method == http.MethodPost {
			b, _ := json.Marshal(map[string]string{"name": r.ep.model})
			body = bytes.NewReader(b)
		}
		req, err := http.NewRequestWithContext(r.ctx, p.method, p.url, body)
		if err != nil {
			return
		}
		resp, err := client.Do(req)
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" && op.Timeout() {
			return
		}
		if err != nil {
			continue
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
	}
}

// usage is what one completion cost, from the stream's final usage chunk.
type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// modelRetries is how often a model call that could not be made or whose stream broke is
// tried again, as the real CLI does (HERMES.md: offline it exits 1 after three retries).
// The real CLI waits seconds between tries; the stand-in waits 100 ms, doubling. It prints
// nothing of its own while it retries: HERMES.md records no line for it, and the host reads
// none.
const modelRetries = 3

// errConnection marks a model call that failed below HTTP (no connection, or a stream cut
// before [DONE]): the failures the real CLI retries.
type errConnection struct{ error }

func (e errConnection) Unwrap() error { return e.error }

// complete sends one chat completion as the real CLI does (stream: true, with
// stream_options) and returns the assembled text, retrying a call that failed below HTTP.
func (r *run) complete(messages []map[string]string) (string, usage, error) {
	wait := 100 * time.Millisecond
	for try := 0; ; try++ {
		text, u, err := r.completeOnce(messages)
		var conn errConnection
		if err == nil || !errors.As(err, &conn) || try == modelRetries || r.ctx.Err() != nil {
			return text, u, err
		}
		select {
		case <-time.After(wait):
		case <-r.ctx.Done():
			return "", usage{}, err
		}
		wait *= 2
	}
}

func (r *run) completeOnce(messages []map[string]string) (string, usage, error) {
	body, _ := json.Marshal(map[string]any{
		"model":          r.ep.model,
		"messages":       messages,
		"stream":         true,
		"stream_options": map[string]bool{"include_usage": true},
	})
	req, err := http.NewRequestWithContext(r.ctx, http.MethodPost, r.ep.baseURL+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return "", usage{}, fmt.Errorf("model request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if r.ep.key != "" {
		req.Header.Set("Authorization", "Bearer "+r.ep.key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", usage{}, errConnection{fmt.Errorf("model request: %w", err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return "", usage{}, fmt.Errorf("model answered %d: %s", resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	var text strings.Builder
	var u usage
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 8<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	done := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		line = strings.TrimSpace(line)
		if line == "[DONE]" {
			done = true
			break
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(line), &chunk); err != nil {
			return "", usage{}, fmt.Errorf("model stream: a chunk is not JSON: %.200s", line)
		}
		for _, c := range chunk.Choices {
			text.WriteString(c.Delta.Content)
		}
		if chunk.Usage != nil {
			u = *chunk.Usage
		}
	}
	if err := sc.Err(); err != nil {
		return "", usage{}, errConnection{fmt.Errorf("model stream: %w", err)}
	}
	if !done {
		return "", usage{}, errConnection{fmt.Errorf("model stream ended without [DONE]")}
	}
	return text.String(), u, nil
}

// ask sends one request to the model behind the gateway and records its answer, as Hermes
// persists a run step by step. The script's prompt for a step is its own device, not a
// message of the conversation (the real CLI stores one user message a turn), so it is not
// stored; askAsUser stores it, for the one user message the real CLI does add (the
// turn-limit notice).
func (r *run) ask(prompt string) (string, error) { return r.askStoring(prompt, false) }

func (r *run) askAsUser(prompt string) (string, error) { return r.askStoring(prompt, true) }

func (r *run) askStoring(prompt string, storeUser bool) (string, error) {
	if storeUser {
		if err := r.message("user", prompt, nil, "", ""); err != nil {
			return "", err
		}
	}
	messages := []map[string]string{{"role": "system", "content": r.systemPrompt}, {"role": "user", "content": prompt}}
	content, u, err := r.complete(messages)
	if err != nil {
		return "", err
	}
	if err := r.message("assistant", content, nil, "", ""); err != nil {
		return "", err
	}
	if err := r.count(u); err != nil {
		return "", err
	}
	return content, nil
}
