package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func demoGateway(t *testing.T) *harness {
	demo := httptest.NewServer(Demo())
	t.Cleanup(demo.Close)
	return startGateway(t, demo.URL+"/v1", nil, nil)
}

type chatAnswer struct {
	Choices []struct {
		Message struct{ Content string } `json:"message"`
	} `json:"choices"`
}

func demoChatContent(t *testing.T, g *harness, req string) string {
	t.Helper()
	resp, body := call(t, "POST", g.url+"/v1/chat/completions", "Bearer "+orgKey(t, "org-a"), req)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var a chatAnswer
	if err := json.Unmarshal(body, &a); err != nil || len(a.Choices) != 1 {
		t.Fatalf("answer %s: %v", body, err)
	}
	return a.Choices[0].Message.Content
}

func TestDemoChatIsDeterministicAndStreamsTheSameAnswer(t *testing.T) {
	g := demoGateway(t)
	req := `{"model":"demo-worker","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"first"},{"role":"assistant","content":"ok"},{"role":"user","content":"describe the product"}]}`
	one, two := demoChatContent(t, g, req), demoChatContent(t, g, req)
	if one != two || !strings.HasPrefix(one, "demo reply ") || !strings.Contains(one, "describe the product") {
		t.Fatalf("answers %q and %q", one, two)
	}
	other := demoChatContent(t, g, strings.Replace(req, "describe the product", "something else", 1))
	if other[:23] == one[:23] {
		t.Fatalf("different last messages gave the same digest: %q %q", one, other)
	}

	streamReq := strings.Replace(req, `"model":"demo-worker"`, `"model":"demo-worker","stream":true`, 1)
	r, _ := http.NewRequest("POST", g.url+"/v1/chat/completions", strings.NewReader(streamReq))
	r.Header.Set("Authorization", "Bearer "+orgKey(t, "org-a"))
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("content type %q", resp.Header.Get("Content-Type"))
	}
	var got strings.Builder
	events, done := 0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var chunk struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		events++
		got.WriteString(chunk.Choices[0].Delta.Content)
	}
	if !done || events < 4 || got.String() != one {
		t.Fatalf("streamed %d events (done %v) %q, want %q", events, done, got.String(), one)
	}
}

func TestDemoAnswersJSONWhenAsked(t *testing.T) {
	g := demoGateway(t)
	for _, req := range []string{
		`{"model":"demo-worker","messages":[{"role":"user","content":"Answer in JSON please"}]}`,
		`{"model":"demo-vision","response_format":{"type":"json_object"},"messages":[{"role":"user","content":[{"type":"text","text":"what is in the image"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`,
	} {
		content := demoChatContent(t, g, req)
		var v map[string]any
		if err := json.Unmarshal([]byte(content), &v); err != nil || v["demo"] != true || v["digest"] == "" {
			t.Fatalf("content %q is not the demo's JSON: %v", content, err)
		}
	}
	resp, body := call(t, "POST", g.url+"/v1/chat/completions", "Bearer "+orgKey(t, "org-a"), `{"model":"gpt-real","messages":[]}`)
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, body)
	}
	if _, code := openAIError(t, body); code != "model_not_found" {
		t.Fatalf("code %q", code)
	}
}

func TestDemoEmbeddingsAreDeterministicUnitVectors(t *testing.T) {
	g := demoGateway(t)
	embed := func(input string) [][]float64 {
		resp, body := call(t, "POST", g.url+"/v1/embeddings", "Bearer "+orgKey(t, "org-a"), `{"model":"demo-embedding","input":`+input+`}`)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		var a struct {
			Data []struct{ Embedding []float64 } `json:"data"`
		}
		if err := json.Unmarshal(body, &a); err != nil {
			t.Fatal(err)
		}
		var out [][]float64
		for _, d := range a.Data {
			out = append(out, d.Embedding)
		}
		return out
	}
	one, batch := embed(`"red shoes"`), embed(`["red shoes","blue hat"]`)
	if len(one) != 1 || len(batch) != 2 || len(one[0]) != demoEmbeddingSize {
		t.Fatalf("shapes %d %d", len(one), len(batch))
	}
	norm := 0.0
	for i, x := range one[0] {
		if x != batch[0][i] {
			t.Fatal("the same input embedded differently")
		}
		norm += x * x
	}
	if math.Abs(norm-1) > 1e-4 || batch[0][0] == batch[1][0] {
		t.Fatalf("norm %v, distinct inputs %v %v", norm, batch[0][0], batch[1][0])
	}
}

func TestGateNamesWhatIsMissing(t *testing.T) {
	g := demoGateway(t)
	ctx := context.Background()
	key := orgKey(t, "org-a")
	if err := Gate(ctx, http.DefaultClient, g.url, testHostKey, DemoWorkerModel, DemoVisionModel); err != nil {
		t.Fatalf("the demo gateway serves both demo models: %v", err)
	}
	err := Gate(ctx, http.DefaultClient, g.url+"/", key, DemoWorkerModel, "gpt-vision-x")
	var missing *MissingModelsError
	if !errors.As(err, &missing) || missing.Worker != "" || missing.Vision != "gpt-vision-x" ||
		!strings.Contains(err.Error(), `vision model "gpt-vision-x"`) || strings.Contains(err.Error(), "worker model") {
		t.Fatalf("missing vision model: %v", err)
	}
	err = Gate(ctx, http.DefaultClient, g.url, key, "w", "v")
	if !errors.As(err, &missing) || !strings.Contains(err.Error(), `worker model "w" or the vision model "v"`) || !strings.Contains(err.Error(), DemoWorkerModel) {
		t.Fatalf("both missing: %v", err)
	}
	if err := Gate(ctx, http.DefaultClient, g.url, "wrong", DemoWorkerModel, DemoVisionModel); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("refused key: %v", err)
	}
	if err := Gate(ctx, http.DefaultClient, "http://127.0.0.1:1", key, DemoWorkerModel, DemoVisionModel); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("no gateway: %v", err)
	}
}

// Asked for usage (stream_options.include_usage, as Hermes asks), the stream ends with a
// chunk holding the usage and no choices.
func TestDemoStreamEndsWithUsageWhenAsked(t *testing.T) {
	g := demoGateway(t)
	req := `{"model":"demo-worker","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"count these four words"}]}`
	r, _ := http.NewRequest("POST", g.url+"/v1/chat/completions", strings.NewReader(req))
	r.Header.Set("Authorization", "Bearer "+orgKey(t, "org-a"))
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var last string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && data != "[DONE]" {
			last = data
		}
	}
	var chunk struct {
		Choices []any `json:"choices"`
		Usage   *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(last), &chunk); err != nil || chunk.Usage == nil || len(chunk.Choices) != 0 ||
		chunk.Usage.PromptTokens != 4 || chunk.Usage.CompletionTokens == 0 {
		t.Fatalf("last chunk %s: %v", last, err)
	}
}
