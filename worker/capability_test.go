package worker

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestUnknownTypeFailsLoudlyWithItsName(t *testing.T) {
	_, err := CapabilityFor("model_selection")
	if !errors.Is(err, ErrUnknownType) || !strings.Contains(err.Error(), `"model_selection"`) {
		t.Fatalf("got %v", err)
	}
}

func TestPromptsNameTheOrgAndTheWriteSurface(t *testing.T) {
	for typ, surface := range map[string]string{"guidelines_extraction": "proposeGuidelines", "product_ingest": "proposeProducts"} {
		c, err := CapabilityFor(typ)
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.Prompt("acme", "job-9")
		if err != nil || !strings.Contains(p, "--path org=acme") || !strings.Contains(p, surface) || !strings.Contains(p, "job-9") {
			t.Fatalf("%s prompt: %v\n%s", typ, err, p)
		}
	}
}

func TestFinalAnswerIsTheLastJSONLine(t *testing.T) {
	out := []byte("thinking\n{\"x\":1}\nDone.\n{\"categories\":[\"a\"]}\n\n")
	if got := string(FinalAnswer(out)); got != `{"categories":["a"]}` {
		t.Fatalf("got %q", got)
	}
	if FinalAnswer([]byte("Stopped: reached the turn limit")) != nil {
		t.Fatal("no JSON is no answer")
	}
}

func TestGuidelinesGate(t *testing.T) {
	want := []string{"a", "b", "c"}
	ok := json.RawMessage(`{"categories":["c","a","b"]}`)
	if res, err := guidelinesGate(ok, want, Persisted{Categories: []string{"a", "b", "c"}}); err != nil || string(res) != `{"categories":["a","b","c"]}` {
		t.Fatalf("complete job: %s %v", res, err)
	}
	cases := []struct {
		final     json.RawMessage
		persisted []string
		want      string
	}{
		{ok, []string{"a", "b"}, "categories not persisted: c"},
		{json.RawMessage(`{"categories":["a","b","c","d"]}`), []string{"a", "b", "c"}, "not persisted: d"},
		{json.RawMessage(`{"categories":["a","b"]}`), []string{"a", "b", "c"}, "leaves out persisted category c"},
		{nil, []string{"a", "b", "c"}, "no final answer"},
		{json.RawMessage(`{"categories":"all"}`), []string{"a", "b", "c"}, "is not"},
	}
	for _, c := range cases {
		if _, err := guidelinesGate(c.final, want, Persisted{Categories: c.persisted}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s with %v: want %q, got %v", c.final, c.persisted, c.want, err)
		}
	}
}

func TestProductsGate(t *testing.T) {
	if _, err := productsGate(json.RawMessage(`{"proposed":["x","y"]}`), nil, Persisted{Writes: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := productsGate(json.RawMessage(`{"proposed":["x","y"]}`), nil, Persisted{Writes: 1}); err == nil {
		t.Fatal("claimed more proposals than were accepted")
	}
}
