// Package scriptedagent is a stand-in for the Hermes CLI in tests and local runs: the real
// agent cannot be installed on these machines. It is a model of the real CLI's headless
// contract as ../shared/HERMES.md records it, not a convenience, and where the two differ
// HERMES.md is right:
//
//		hermes chat -q PROMPT -Q --source tool --max-turns N [--resume ID]
//
//	  - its model endpoint comes from $HERMES_HOME/config.yaml only (model.provider, and the
//	    providers block's base_url and key_env); OPENAI_BASE_URL and HERMES_MODEL are not read,
//	    and a home without a provider fails the run as the real CLI does offline;
//	  - it probes the endpoint at start-up, best effort (a failed leg goes on to the next,
//	    a connect timeout ends the probing, neither ends the run), and streams every
//	    completion (stream: true); a
//	    call that cannot connect or whose stream breaks is tried three more times, as the
//	    real CLI does (it waits 100 ms, doubling, where the real one waits seconds);
//	  - it stores sessions and messages in $HERMES_HOME/state.db in the shape of the pinned
//	    release (schema 22): the session stays open after the run, its title NULL, no system
//	    message row (the prompt is on the session), ids like 20261203_141812_7c2bfe; a
//	    failed run leaves the user message and no assistant row;
//	  - at --max-turns it prints the real CLI's line, asks the model for a summary, prints it
//	    and exits 0; the session id goes to stderr as "session_id: <id>";
//	  - subagent hooks fire only when the host's plugin is installed and enabled, and speak to
//	    the hook socket exactly as the plugin does (see subagent.go).
//
// The work it does is scripted against the job workspace it runs in (manifest.json,
// checkpoint.json): it asks the gateway's model for each piece of work, shell-calls
// `sartiq` (found on PATH) for the capability's write surface one category (or product) at
// a time, and prints a final answer whose last JSON object says what it persisted. Started
// where there is no manifest.json, it plays a dashboard's chat turn instead (chat.go).
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

// EnvHome is where the agent's home is; the only variable the stand-in reads besides the
// key variable config.yaml names and the plugin's socket.
const EnvHome = "HERMES_HOME"

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
	// SummaryJSON makes the summary at the turn limit hold a JSON object (the categories so
	// far), as a real model's summary may: the host must go by the turn-limit line.
	SummaryJSON bool `json:"summary_json,omitempty"`
	// Subagent has the agent delegate one child before its work; Subagents more, one after
	// another (an empty ID is made as Hermes makes them, sa-<n>-<hex>).
	Subagent  *SubagentKnob  `json:"subagent,omitempty"`
	Subagents []SubagentKnob `json:"subagents,omitempty"`
	// StepMS makes each write wait that long first, and each of a child's steps take it:
	// a run slow enough to watch (make run's demo homes ask for it).
	StepMS int `json:"step_ms,omitempty"`
	// ChatStepMS slows each step of a chat turn (see chat.go) by that many milliseconds.
	ChatStepMS int `json:"chat_step_ms,omitempty"`
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

// TurnLimitNotice is the user message the real CLI stores when it asks for the summary.
const TurnLimitNotice = "You've reached the maximum number of tool-calling iterations allowed. " +
	"Please provide a final response summarizing what you've found and accomplished so far, without calling any more tools."

type run struct {
	ctx          context.Context
	stdout       io.Writer
	stderr       io.Writer
	home         string
	prompt       string
	maxTurns     int
	resume       string
	flagModel    string
	flagProvider string
	turns        int
	writes       int
	knobs        Knobs
	settings     settings
	ep           endpoint
	db           *sql.DB
	session      string
	systemPrompt string
}

const usageLine = "usage: chat -q PROMPT [-Q] --source tool --max-turns N [--resume ID] [-m MODEL] [--provider NAME]"

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
		return errors.New(usageLine)
	}
	fs := flag.NewFlagSet("chat", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&r.prompt, "q", "", "the prompt")
	fs.Bool("Q", false, "quiet: only the final answer on stdout")
	fs.Bool("quiet", false, "quiet: only the final answer on stdout")
	source := fs.String("source", "", "session source")
	fs.IntVar(&r.maxTurns, "max-turns", 0, "turn limit")
	fs.StringVar(&r.resume, "resume", "", "session to resume")
	fs.StringVar(&r.flagModel, "m", "", "model")
	fs.StringVar(&r.flagProvider, "provider", "", "provider")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if r.prompt == "" || *source != "tool" || r.maxTurns < 1 || fs.NArg() > 0 {
		return errors.New(usageLine)
	}
	r.home = os.Getenv(EnvHome)
	if r.home == "" {
		return fmt.Errorf("%s must be set", EnvHome)
	}
	return nil
}

func (r *run) main() (int, error) {
	if err := r.loadKnobs(); err != nil {
		return ExitFailed, err
	}
	var err error
	if r.settings, err = readSettings(r.home); err != nil {
		return ExitFailed, err
	}
	if r.ep, err = r.settings.endpoint(r.flagModel, r.flagProvider); err != nil {
		return ExitFailed, err
	}
	r.probe()
	// A job's workspace holds its manifest; a chat turn runs with none.
	var m Manifest
	isChat := false
	if err := readJSON("manifest.json", &m); errors.Is(err, os.ErrNotExist) {
		isChat = true
	} else if err != nil {
		return ExitFailed, err
	}
	var done Checkpoint
	if err := readJSON("checkpoint.json", &done); err != nil && !errors.Is(err, os.ErrNotExist) {
		return ExitFailed, err
	}
	if r.systemPrompt, err = systemPrompt(r.home); err != nil {
		return ExitFailed, err
	}
	db, err := hermesstate.Create(r.ctx, filepath.Join(r.home, "state.db"))
	if err != nil {
		return ExitFailed, err
	}
	defer db.Close()
	r.db = db
	if err := r.openSession(); err != nil {
		return ExitFailed, err
	}
	// The id is printed however the run ends, as the real CLI does once it has a session.
	defer fmt.Fprintf(r.stderr, "session_id: %s\n", r.session)
	if err := r.message("user", r.prompt, nil, "", ""); err != nil {
		return ExitFailed, err
	}
	if isChat {
		return r.chat()
	}

	children := r.knobs.Subagents
	if r.knobs.Subagent != nil {
		children = append([]SubagentKnob{*r.knobs.Subagent}, children...)
	}
	for i, k := range children {
		if k.ID == "" {
			k.ID = fmt.Sprintf("sa-%d-%s", i, newHex(4))
		}
		if err := r.child(k); err != nil {
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
		return ExitFailed, err
	}
	if stopped {
		return r.summarize(final)
	}
	answer, _ := json.Marshal(final)
	text := "Done. Everything is proposed for review.\n" + string(answer)
	if err := r.message("assistant", text, nil, "", ""); err != nil {
		return ExitFailed, err
	}
	fmt.Fprintln(r.stdout, text)
	return ExitOK, nil
}

// summarize is the real CLI at its turn limit: the line, one more request without tools
// whose last message is a stored user message, the model's summary printed, exit 0.
func (r *run) summarize(sofar map[string]any) (int, error) {
	fmt.Fprintf(r.stdout, "⚠️  Reached maximum iterations (%d). Requesting summary...\n", r.maxTurns)
	summary, err := r.askAsUser(TurnLimitNotice)
	if err != nil {
		return ExitFailed, err
	}
	if r.knobs.SummaryJSON {
		b, _ := json.Marshal(sofar)
		summary += "\n" + string(b)
		if _, err := r.db.ExecContext(r.ctx, `UPDATE messages SET content = ? WHERE id = (SELECT max(id) FROM messages WHERE session_id = ?)`,
			summary, r.session); err != nil {
			return ExitFailed, err
		}
	}
	fmt.Fprintln(r.stdout, summary)
	return ExitOK, nil
}

// systemPrompt is what Hermes builds its prompt from and stores on the session: the
// identity, the memory and the skills of the home.
func systemPrompt(home string) (string, error) {
	var b strings.Builder
	soul, err := os.ReadFile(filepath.Join(home, "SOUL.md"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read SOUL.md: %w", err)
	}
	b.Write(soul)
	for _, f := range []string{"memories/MEMORY.md", "memories/USER.md"} {
		if mem, err := os.ReadFile(filepath.Join(home, f)); err == nil {
			fmt.Fprintf(&b, "\n\n# %s\n%s", f, mem)
		}
	}
	return b.String(), nil
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
	if r.knobs.StepMS > 0 {
		select {
		case <-time.After(time.Duration(r.knobs.StepMS) * time.Millisecond):
		case <-r.ctx.Done():
			return false, r.ctx.Err()
		}
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
			return map[string]any{"categories": persisted}, stop, err
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
			return map[string]any{"proposed": skus}, stop, err
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

// newID is a session id in the real CLI's shape: 20261203_141812_7c2bfe.
func newID() string {
	return time.Now().UTC().Format("20060102_150405") + "_" + newHex(3)
}

func newHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func now() float64 { return float64(time.Now().UnixMicro()) / 1e6 }

// openSession starts a fresh session, or reopens the one to resume: --resume appends to the
// same row, whose counters go on from where they were. A session is never ended by a run.
func (r *run) openSession() error {
	if r.resume != "" {
		var n int
		if err := r.db.QueryRowContext(r.ctx, `SELECT message_count FROM sessions WHERE id = ?`, r.resume).Scan(&n); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("resume %s: no such session", r.resume)
			}
			return fmt.Errorf("resume %s: %w", r.resume, err)
		}
		r.session = r.resume
		fmt.Fprintf(r.stderr, "↻ Resumed session %s (%d messages)\n", r.session, n)
		return nil
	}
	r.session = newID()
	return hermesstate.InsertSession(r.ctx, r.db, hermesstate.Session{
		ID: r.session, Source: "tool", Model: r.ep.model, StartedAt: now(), SystemPrompt: r.systemPrompt,
	})
}

// count adds one model call to the session's counters, as Hermes keeps them.
func (r *run) count(u usage) error {
	return hermesstate.AddUsage(r.ctx, r.db, r.session, hermesstate.Usage{
		APICalls: 1, InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, At: now(),
	})
}

func (r *run) message(role, content string, calls []hermesstate.ToolCall, toolName, callID string) error {
	return r.messageIn(r.session, role, content, calls, toolName, callID)
}

// messageIn stores one message of a session and counts it there.
func (r *run) messageIn(session, role, content string, calls []hermesstate.ToolCall, toolName, callID string) error {
	if err := hermesstate.InsertMessage(r.ctx, r.db, hermesstate.Message{
		SessionID: session, Role: role, Content: content, ToolCalls: calls,
		ToolName: toolName, ToolCallID: callID, Timestamp: now(),
	}); err != nil {
		return err
	}
	return hermesstate.AddUsage(r.ctx, r.db, session, hermesstate.Usage{Messages: 1, ToolCalls: len(calls), At: now()})
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
	cmdline, _ := json.Marshal(map[string]string{"command": "sartiq " + strings.Join(args, " ")})
	if err := r.message("assistant", "", []hermesstate.ToolCall{{ID: callID, Name: "terminal", Arguments: string(cmdline)}}, "", ""); err != nil {
		return nil, err
	}
	// Found on PATH, as a shell the model drives would find it.
	cmd := exec.CommandContext(r.ctx, "sartiq", args...)
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
