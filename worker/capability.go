package worker

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/template"
)

//go:embed prompts/*.md
var promptFiles embed.FS

// Capability is one job type: the prompt the agent gets, the write surface it persists
// through, and the gate that decides whether the job is complete. Granting a new job type
// is adding one entry to capabilities (and, in the backend, its allowlist row).
type Capability struct {
	Type   string
	prompt *template.Template
	// Gate checks the agent's final answer against what the worker saw persisted, and
	// returns the job's result or why it is not complete.
	Gate func(final json.RawMessage, want []string, seen Persisted) (json.RawMessage, error)
	// Resumable capabilities are resumed in the same agent session when the agent stops at
	// its turn limit.
	Resumable bool
}

// Persisted is what the worker saw the backend accept through its proxy.
type Persisted struct {
	Categories []string // proposeGuidelines, once each
	Writes     int      // every accepted write-surface call
}

// ErrUnknownType: the job's type has no capability; the job fails with its name.
var ErrUnknownType = errors.New("unknown job type")

var capabilities = map[string]*Capability{
	"guidelines_extraction": {Type: "guidelines_extraction", Gate: guidelinesGate, Resumable: true},
	"product_ingest":        {Type: "product_ingest", Gate: productsGate},
}

func init() {
	for name, c := range capabilities {
		c.prompt = template.Must(template.ParseFS(promptFiles, "prompts/"+name+".md"))
	}
}

// CapabilityFor is the capability of a job type.
func CapabilityFor(jobType string) (*Capability, error) {
	c, ok := capabilities[jobType]
	if !ok {
		return nil, fmt.Errorf("%w %q: no capability handles it", ErrUnknownType, jobType)
	}
	return c, nil
}

// Prompt renders the job type's prompt for one job.
func (c *Capability) Prompt(org, job string) (string, error) {
	var b bytes.Buffer
	if err := c.prompt.Execute(&b, map[string]string{"OrgID": org, "JobID": job}); err != nil {
		return "", fmt.Errorf("render the %s prompt: %w", c.Type, err)
	}
	return b.String(), nil
}

// FinalAnswer is the last JSON object in the agent's output, or nil when there is none.
func FinalAnswer(output []byte) json.RawMessage {
	lines := strings.Split(strings.TrimSpace(string(output)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		line := strings.TrimSpace(lines[i])
		if strings.HasPrefix(line, "{") && json.Valid([]byte(line)) {
			return json.RawMessage(line)
		}
	}
	return nil
}

// guidelinesGate completes only when the answer names exactly the manifest's categories
// and each was seen persisted.
func guidelinesGate(final json.RawMessage, want []string, seen Persisted) (json.RawMessage, error) {
	persisted := seen.Categories
	var missing []string
	for _, c := range want {
		if !slices.Contains(persisted, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("categories not persisted: %s", strings.Join(missing, ", "))
	}
	if final == nil {
		return nil, errors.New("the agent gave no final answer")
	}
	var answer struct {
		Categories []string `json:"categories"`
	}
	if err := json.Unmarshal(final, &answer); err != nil {
		return nil, fmt.Errorf("the final answer is not {\"categories\": [...]}: %v", err)
	}
	var unpersisted []string
	for _, c := range answer.Categories {
		if !slices.Contains(persisted, c) {
			unpersisted = append(unpersisted, c)
		}
	}
	if len(unpersisted) > 0 {
		return nil, fmt.Errorf("the final answer names categories that were not persisted: %s", strings.Join(unpersisted, ", "))
	}
	for _, c := range want {
		if !slices.Contains(answer.Categories, c) {
			return nil, fmt.Errorf("the final answer leaves out persisted category %s", c)
		}
	}
	result, _ := json.Marshal(map[string]any{"categories": want})
	return result, nil
}

// productsGate completes when the agent answered and no more proposals are claimed than
// the backend accepted.
func productsGate(final json.RawMessage, _ []string, seen Persisted) (json.RawMessage, error) {
	if final == nil {
		return nil, errors.New("the agent gave no final answer")
	}
	var answer struct {
		Proposed []string `json:"proposed"`
	}
	if err := json.Unmarshal(final, &answer); err != nil {
		return nil, fmt.Errorf("the final answer is not {\"proposed\": [...]}: %v", err)
	}
	if len(answer.Proposed) > seen.Writes {
		return nil, fmt.Errorf("the final answer claims %d proposals, %d were accepted", len(answer.Proposed), seen.Writes)
	}
	result, _ := json.Marshal(map[string]any{"proposed": answer.Proposed})
	return result, nil
}
