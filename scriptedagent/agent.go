// Package scriptedagent is a stand-in for the Hermes CLI in tests and local runs: the real
// agent cannot be installed on these machines. It plays the headless contract the host uses,
//
//	hermes chat -q PROMPT --quiet --source tool --max-turns N [--resume ID]
//
// against the job workspace it runs in (manifest.json, checkpoint.json): it writes
// Hermes-shaped sessions and messages rows into $HERMES_HOME/state.db, asks the gateway's
// model for each piece of work, shell-calls `sartiq` for the capability's write surface one
// category (or batch of products) at a time, and prints a final answer whose last JSON
// object says what it persisted.
//
// Fault knobs come from $HERMES_HOME/scripted-agent.json, a file a test writes into the
// org's home (so they reach the agent through the dispatcher and a container alike):
// stall before a write, stop at the turn limit after K writes, crash at a write, or claim a
// category it never wrote.
package scriptedagent

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"hermeshost/orghome/hermesstate"
)

// The environment the host gives the agent: where its home is and how it reaches the model.
const (
	EnvHome    = "HERMES_HOME"
	EnvBaseURL = "OPENAI_BASE_URL" // the gateway's /v1
	EnvAPIKey  = "OPENAI_API_KEY"  // the org's gateway key
	EnvModel   = "HERMES_MODEL"
	EnvSartiq  = "SARTIQ_BIN" // the sartiq command; default "sartiq" on PATH
	// EnvHooks is the worker's subagent hook socket (see worker.HookProxy), when it serves
	// one.
	EnvHooks = "HERMES_HOST_HOOKS_SOCKET"
)

// KnobsFile is read from the home; absent means no faults.
const KnobsFile = "scripted-agent.json"

// Knobs are the faults a test asks for. Write counts are of this run's writes, from 1.
type Knobs struct {
	// StallAtWrite blocks before that write until the agent is killed.
	StallAtWrite int `json:"stall_at_write,omitempty"`
	// StopAfterWrites ends a fresh (not resumed) run at the turn limit after that many writes.
	StopAfterWrites int `json:"stop_after_writes,omitempty"`
	// CrashAtWrite exits abruptly (status 70) before that write, on every run.
	CrashAtWrite int `json:"crash_at_write,omitempty"`
	// ClaimExtra names categories the final answer claims although nothing wrote them.
	ClaimExtra []string `json:"claim_extra,omitempty"`
	// Subagent has the agent run one child through the worker's hooks before its work.
	Subagent *SubagentKnob `json:"subagent,omitempty"`
}

// SubagentKnob is the child the agent runs: started with the start hook, it drains its
// mailbox until a message arrives (acknowledging it and quoting it in its summary), a cancel
// says stop, or WaitMS passes; then the stop hook ends it. WaitMS 0 drains once.
type SubagentKnob struct {
	ID     string `json:"id"`
	Goal   string `json:"goal"`
	Role   string `json:"role,omitempty"`
	WaitMS int    `json:"wait_ms,omitempty"`
}

// Manifest is the part of the job manifest the agent reads.
type Manifest struct {
	JobID          string   `json:"job_id"`
	Type           string   `json:"type"`
	OrganizationID string   `json:"organization_id"`
	Instructions   string   `json:"instructions"`
	Categories     []string `json:"categories"`
	Sources        []struct {
		Name    string `json:"name"`
		Content string `json:"content"`
	} `json:"sources"`
}

// Checkpoint is what the worker says is already persisted.
type Checkpoint struct {
	Categories []string `json:"categories"`
}

// Exit codes, as the CLI would give them.
const (
	ExitOK      = 0
	ExitFailed  = 1
	ExitUsage   = 2
	ExitCrashed = 70
)

type run struct {
	ctx       context.Context
	stdout    io.Writer
	stderr    io.Writer
	home      string
	prompt    string
	maxTurns  int
	resume    string
	turns     int
	writes    int
	knobs     Knobs
	db        *sql.DB
	session   string
	baseURL   string
	apiKey    string
	model     string
	sartiqBin string
}

// Main runs the agent with args (without the program name) and returns its exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	r := &run{ctx: ctx, stdout: stdout, stderr: stderr}
	if err := r.parse(args); err != nil {
		fmt.Fprintln(stderr, "scripted-agent:", err)
		return ExitUsage
	}
	code, err := r.main()
	if err != nil {
		fmt.Fprintln(stderr, "scripted-agent:", err)
	}
	return code
}

func (r *run) parse(args []string) error {
	if len(args) == 0 || args[0] != "chat" {
		return errors.New("usage: chat -q PROMPT --quiet --source tool --max-turns N [--resume ID]")
	}
	fs := flag.NewFlagSet("chat", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&r.prompt, "q", "", "the prompt")
	fs.Bool("quiet", false, "headless output")
	source := fs.String("source", "", "session source")
	fs.IntVar(&r.maxTurns, "max-turns", 0, "turn limit")
	fs.StringVar(&r.resume, "resume", "", "session to resume")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if r.prompt == "" || *source != "tool" || r.maxTurns < 1 || fs.NArg() > 0 {
		return errors.New("usage: chat -q PROMPT --quiet --source tool --max-turns N [--resume ID]")
	}
	r.home = os.Getenv(EnvHome)
	r.baseURL = strings.TrimRight(os.Getenv(EnvBaseURL), "/")
	r.apiKey = os.Getenv(EnvAPIKey)
	r.model = os.Getenv(EnvModel)
	r.sartiqBin = os.Getenv(EnvSartiq)
	if r.sartiqBin == "" {
		r.sartiqBin = "sartiq"
	}
	if r.home == "" || r.baseURL == "" || r.model == "" {
		return fmt.Errorf("%s, %s and %s must be set", EnvHome, EnvBaseURL, EnvModel)
	}
	return nil
}

func (r *run) main() (int, error) {
	if err := r.loadKnobs(); err != nil {
		return ExitFailed, err
	}
	var m Manifest
	if err := readJSON("manifest.json", &m); err != nil {
		return ExitFailed, err
	}
	var done Checkpoint
	if err := readJSON("checkpoint.json", &done); err != nil && !errors.Is(err, os.ErrNotExist) {
		return ExitFailed, err
	}
	db, err := hermesstate.Create(r.ctx, filepath.Join(r.home, "state.db"))
	if err != nil {
		return ExitFailed, err
	}
	defer db.Close()
	r.db = db
	if err := r.openSession(m); err != nil {
		return ExitFailed, err
	}
	if err := r.message("user", r.prompt, nil, "", ""); err != nil {
		return ExitFailed, err
	}

	if r.knobs.Subagent != nil {
		if err := r.child(*r.knobs.Subagent); err != nil {
			_ = r.endSession("error")
			return ExitFailed, err
		}
	}
	var final map[string]any
	var stopped bool
	switch m.Type {
	case "guidelines_extraction":
		final, stopped, err = r.guidelines(m, done)
	case "product_ingest":
		final, stopped, err = r.products(m)
	default:
		err = fmt.Errorf("no script for job type %q", m.Type)
	}
	if err != nil {
		_ = r.endSession("error")
		return ExitFailed, err
	}
	if stopped {
		fmt.Fprintf(r.stdout, "Stopped: reached the turn limit (%d turns) before finishing.\n", r.maxTurns)
		return ExitOK, r.endSession("max_turns")
	}
	answer, _ := json.Marshal(final)
	text := "Done. Everything is proposed for review.\n" + string(answer)
	if err := r.message("assistant", text, nil, "", ""); err != nil {
		return ExitFailed, err
	}
	fmt.Fprintln(r.stdout, text)
	return ExitOK, r.endSession("completed")
}

func (r *run) loadKnobs() error {
	b, err := os.ReadFile(filepath.Join(r.home, KnobsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &r.knobs); err != nil {
		return fmt.Errorf("%s: %w", KnobsFile, err)
	}
	return nil
}

func readJSON(name string, v any) error {
	b, err := os.ReadFile(name)
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	return nil
}

// beforeWrite spends a turn and applies the fault knobs; it reports whether the turn limit
// stops the run here.
func (r *run) beforeWrite() (bool, error) {
	if r.turns >= r.maxTurns {
		return true, nil
	}
	if r.resume == "" && r.knobs.StopAfterWrites > 0 && r.writes >= r.knobs.StopAfterWrites {
		return true, nil
	}
	r.turns++
	next := r.writes + 1
	if r.knobs.CrashAtWrite == next {
		fmt.Fprintf(r.stderr, "scripted-agent: crashing before write %d, as %s asks\n", next, KnobsFile)
		os.Exit(ExitCrashed)
	}
	if r.knobs.StallAtWrite == next {
		fmt.Fprintf(r.stderr, "scripted-agent: stalling before write %d, as %s asks\n", next, KnobsFile)
		<-r.ctx.Done()
		return false, r.ctx.Err()
	}
	return false, nil
}

func (r *run) guidelines(m Manifest, done Checkpoint) (map[string]any, bool, error) {
	persisted := append([]string(nil), done.Categories...)
	source := ""
	var names []string
	for _, s := range m.Sources {
		source += s.Content + "\n"
		names = append(names, s.Name)
	}
	for _, cat := range m.Categories {
		if slices.Contains(persisted, cat) {
			continue
		}
		stop, err := r.beforeWrite()
		if err != nil || stop {
			return nil, stop, err
		}
		content, err := r.ask(fmt.Sprintf("Write the %s guidelines of organization %s from these sources:\n%s", cat, m.OrganizationID, source))
		if err != nil {
			return nil, false, err
		}
		body, _ := json.Marshal(map[string]any{"content": content, "sources": names})
		if err := r.sartiq("proposeGuidelines", []string{"org=" + m.OrganizationID, "category=" + cat}, string(body)); err != nil {
			return nil, false, err
		}
		r.writes++
		persisted = append(persisted, cat)
	}
	return map[string]any{"categories": append(persisted, r.knobs.ClaimExtra...)}, false, nil
}

// products proposes one product per catalogue row whose SKU the org does not have yet.
func (r *run) products(m Manifest) (map[string]any, bool, error) {
	out, err := r.sartiqOut("listProducts", []string{"org=" + m.OrganizationID}, "")
	if err != nil {
		return nil, false, err
	}
	var list struct {
		Products []struct {
			SKU string `json:"sku"`
		} `json:"products"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, false, fmt.Errorf("listProducts answer: %w", err)
	}
	known := map[string]bool{}
	for _, p := range list.Products {
		known[p.SKU] = true
	}
	type product struct {
		SKU         string `json:"sku"`
		Name        string `json:"name"`
		Description string `json:"description,omitempty"`
	}
	var proposals []product
	for _, s := range m.Sources {
		for i, line := range strings.Split(strings.TrimSpace(s.Content), "\n") {
			cols := strings.Split(line, ",")
			if i == 0 || len(cols) < 2 || known[cols[0]] {
				continue
			}
			proposals = append(proposals, product{SKU: strings.TrimSpace(cols[0]), Name: strings.TrimSpace(cols[1])})
		}
	}
	var skus []string
	for _, p := range proposals {
		stop, err := r.beforeWrite()
		if err != nil || stop {
			return nil, stop, err
		}
		desc, err := r.ask("Describe the product " + p.Name + " for a catalogue, in one sentence.")
		if err != nil {
			return nil, false, err
		}
		p.Description = desc
		body, _ := json.Marshal(map[string]any{"products": []product{p}})
		if err := r.sartiq("proposeProducts", []string{"org=" + m.OrganizationID}, string(body)); err != nil {
			return nil, false, err
		}
		r.writes++
		skus = append(skus, p.SKU)
	}
	return map[string]any{"proposed": skus}, false, nil
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return time.Now().UTC().Format("20060102_150405") + "_" + hex.EncodeToString(b[:])
}

func now() float64 { return float64(time.Now().UnixMicro()) / 1e6 }

func (r *run) openSession(m Manifest) error {
	if r.resume != "" {
		var n int
		if err := r.db.QueryRowContext(r.ctx, `SELECT count(*) FROM sessions WHERE id = ?`, r.resume).Scan(&n); err != nil {
			return fmt.Errorf("resume %s: %w", r.resume, err)
		}
		if n == 0 {
			return fmt.Errorf("resume %s: no such session", r.resume)
		}
		r.session = r.resume
		_, err := r.db.ExecContext(r.ctx, `UPDATE sessions SET ended_at = NULL, end_reason = NULL WHERE id = ?`, r.session)
		return err
	}
	r.session = newID()
	return hermesstate.InsertSession(r.ctx, r.db, hermesstate.Session{
		ID: r.session, Source: "tool", Model: r.model, StartedAt: now(),
		Title: fmt.Sprintf("%s %s", m.Type, m.JobID),
	})
}

func (r *run) endSession(reason string) error {
	_, err := r.db.ExecContext(context.Background(), `UPDATE sessions SET ended_at = ?, end_reason = ?,
		message_count = (SELECT count(*) FROM messages WHERE session_id = ?),
		tool_call_count = (SELECT count(*) FROM messages WHERE session_id = ? AND role = 'tool')
		WHERE id = ?`, now(), reason, r.session, r.session, r.session)
	if err != nil {
		return fmt.Errorf("end session %s: %w", r.session, err)
	}
	return nil
}

func (r *run) message(role, content string, calls []hermesstate.ToolCall, toolName, callID string) error {
	return hermesstate.InsertMessage(r.ctx, r.db, hermesstate.Message{
		SessionID: r.session, Role: role, Content: content, ToolCalls: calls,
		ToolName: toolName, ToolCallID: callID, Timestamp: now(),
	})
}

// sartiq shell-calls `sartiq call`, recording the call and its answer as Hermes' terminal
// tool would.
func (r *run) sartiq(op string, paths []string, body string) error {
	_, err := r.sartiqOut(op, paths, body)
	return err
}

func (r *run) sartiqOut(op string, paths []string, body string) ([]byte, error) {
	args := []string{"call", op}
	for _, p := range paths {
		args = append(args, "--path", p)
	}
	if body != "" {
		args = append(args, "--json", body)
	}
	callID := "call_" + newID()
	cmdline, _ := json.Marshal(map[string]string{"command": r.sartiqBin + " " + strings.Join(args, " ")})
	if err := r.message("assistant", "", []hermesstate.ToolCall{{ID: callID, Name: "terminal", Arguments: string(cmdline)}}, "", ""); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(r.ctx, r.sartiqBin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	runErr := cmd.Run()
	result := out.String()
	if runErr != nil {
		result = strings.TrimSpace(errb.String())
	}
	if err := r.message("tool", result, nil, "terminal", callID); err != nil {
		return nil, err
	}
	if runErr != nil {
		return nil, fmt.Errorf("sartiq %s: %v: %s", op, runErr, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}
