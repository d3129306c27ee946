package scriptedagent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

var client = &http.Client{Timeout: 2 * time.Minute}

// ask sends one user message to the model behind the gateway and records both sides.
func (r *run) ask(prompt string) (string, error) {
	if err := r.message("user", prompt, nil, "", ""); err != nil {
		return "", err
	}
	body, _ := json.Marshal(map[string]any{
		"model":    r.model,
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	})
	req, err := http.NewRequestWithContext(r.ctx, http.MethodPost, r.baseURL+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("model request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if r.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+r.apiKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("model request: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("model answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("model answered %d: %s", resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	var answer struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &answer); err != nil || len(answer.Choices) == 0 {
		return "", fmt.Errorf("model answer is not a chat completion: %.200s", raw)
	}
	content := answer.Choices[0].Message.Content
	if err := r.message("assistant", content, nil, "", ""); err != nil {
		return "", err
	}
	if _, err := r.db.ExecContext(r.ctx, `UPDATE sessions SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,
		api_call_count = api_call_count + 1, last_activity_at = ? WHERE id = ?`,
		answer.Usage.PromptTokens, answer.Usage.CompletionTokens, now(), r.session); err != nil {
		return "", fmt.Errorf("count tokens: %w", err)
	}
	return content, nil
}
