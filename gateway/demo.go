package gateway

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
)

// The demo upstream's models; their names say they are not real.
const (
	DemoWorkerModel    = "demo-worker"
	DemoVisionModel    = "demo-vision"
	DemoEmbeddingModel = "demo-embedding"
)

// demoEmbeddingSize is small: the vectors only need to be deterministic and distinct.
const demoEmbeddingSize = 16

// Demo is a deterministic OpenAI-compatible upstream for offline runs and tests. A chat
// completion answers with a digest of the last user message (valid JSON when that message
// asks for JSON or the request sets response_format), streamed or not; an embedding is
// derived from a hash of its input. The same request always gets the same answer.
func Demo() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", demoModels)
	mux.HandleFunc("POST /v1/chat/completions", demoChat)
	mux.HandleFunc("POST /v1/embeddings", demoEmbeddings)
	return mux
}

func demoModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	var data []model
	for _, id := range []string{DemoWorkerModel, DemoVisionModel, DemoEmbeddingModel} {
		data = append(data, model{ID: id, Object: "model", OwnedBy: "hermes-host-demo"})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

type demoChatRequest struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	ResponseFormat *struct {
		Type string `json:"type"`
	} `json:"response_format"`
	// StreamOptions.IncludeUsage asks, as OpenAI's API has it, for a last chunk with the
	// usage and no choices (Hermes sends it with every request).
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// messageText is a message's text: a plain string, or the text parts of a multi-part
// (vision) message.
func messageText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return ""
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

func demoChat(w http.ResponseWriter, r *http.Request) {
	var req demoChatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeOpenAIError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "the request body is not a chat completion request: "+err.Error())
		return
	}
	if req.Model != DemoWorkerModel && req.Model != DemoVisionModel {
		writeOpenAIError(w, http.StatusNotFound, "invalid_request_error", "model_not_found",
			fmt.Sprintf("the demo upstream has no chat model %q (it has %s and %s)", req.Model, DemoWorkerModel, DemoVisionModel))
		return
	}
	last := ""
	for _, m := range req.Messages {
		if m.Role == "user" {
			last = messageText(m.Content)
		}
	}
	sum := sha256.Sum256([]byte(last))
	digest := hex.EncodeToString(sum[:6])
	wantJSON := req.ResponseFormat != nil && strings.HasPrefix(req.ResponseFormat.Type, "json") ||
		strings.Contains(strings.ToLower(last), "json")
	content := fmt.Sprintf("demo reply %s: %s", digest, excerpt(last, 80))
	if wantJSON {
		b, _ := json.Marshal(map[string]any{"demo": true, "model": req.Model, "digest": digest, "echo": excerpt(last, 80)})
		content = string(b)
	}
	id := "chatcmpl-demo-" + digest
	promptTokens, completionTokens := len(strings.Fields(last)), len(strings.Fields(content))
	usage := map[string]int{"prompt_tokens": promptTokens, "completion_tokens": completionTokens, "total_tokens": promptTokens + completionTokens}
	if !req.Stream {
		writeJSON(w, http.StatusOK, map[string]any{
			"id": id, "object": "chat.completion", "created": 0, "model": req.Model,
			"choices": []map[string]any{{"index": 0, "finish_reason": "stop",
				"message": map[string]string{"role": "assistant", "content": content}}},
			"usage": usage,
		})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	event := func(delta map[string]string, finish any) {
		b, _ := json.Marshal(map[string]any{
			"id": id, "object": "chat.completion.chunk", "created": 0, "model": req.Model,
			"choices": []map[string]any{{"index": 0, "delta": delta, "finish_reason": finish}},
		})
		fmt.Fprintf(w, "data: %s\n\n", b)
		_ = rc.Flush()
	}
	event(map[string]string{"role": "assistant", "content": ""}, nil)
	for _, piece := range demoPieces(content) {
		event(map[string]string{"content": piece}, nil)
	}
	event(map[string]string{}, "stop")
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		b, _ := json.Marshal(map[string]any{"id": id, "object": "chat.completion.chunk", "created": 0, "model": req.Model,
			"choices": []any{}, "usage": usage})
		fmt.Fprintf(w, "data: %s\n\n", b)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}

// demoPieces splits content into word-sized stream chunks that concatenate back to it.
func demoPieces(content string) []string {
	var pieces []string
	for len(content) > 0 {
		i := strings.IndexByte(content[1:], ' ')
		if i < 0 {
			pieces = append(pieces, content)
			break
		}
		pieces = append(pieces, content[:i+1])
		content = content[i+1:]
	}
	return pieces
}

func excerpt(s string, n int) string {
	r := []rune(s)
	if len(r) > n {
		return string(r[:n])
	}
	return s
}

func demoEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeOpenAIError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "the request body is not an embeddings request: "+err.Error())
		return
	}
	var inputs []string
	var one string
	if json.Unmarshal(req.Input, &one) == nil {
		inputs = []string{one}
	} else if json.Unmarshal(req.Input, &inputs) != nil || len(inputs) == 0 {
		writeOpenAIError(w, http.StatusBadRequest, "invalid_request_error", "invalid_input", "input must be a string or a non-empty list of strings")
		return
	}
	data := make([]map[string]any, len(inputs))
	tokens := 0
	for i, in := range inputs {
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": demoVector(in)}
		tokens += len(strings.Fields(in))
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list", "model": DemoEmbeddingModel, "data": data,
		"usage": map[string]int{"prompt_tokens": tokens, "total_tokens": tokens},
	})
}

// demoVector is a unit vector drawn from the input's hash.
func demoVector(in string) []float64 {
	sum := sha256.Sum256([]byte(in))
	v := make([]float64, demoEmbeddingSize)
	norm := 0.0
	for i := range v {
		x := float64(int16(binary.BigEndian.Uint16(sum[2*i:]))) / math.MaxInt16
		v[i] = x
		norm += x * x
	}
	norm = math.Sqrt(norm)
	for i := range v {
		v[i] = math.Round(v[i]/norm*1e6) / 1e6
	}
	return v
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeOpenAIError writes the error shape OpenAI clients parse:
// {"error":{"message","type","code"}}. Every /v1 answer of the gateway uses it.
func writeOpenAIError(w http.ResponseWriter, status int, typ, code, message string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": message, "type": typ, "code": code}})
}
