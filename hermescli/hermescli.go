// Package hermescli is the host's side of the real Hermes CLI's headless contract
// (../shared/HERMES.md): the command line of a run, the environment it gets, and what the
// host reads back from its output. Jobs use it, and a dashboard's chat turn will too, so
// every agent start speaks to Hermes the same way.
//
//	hermes chat -q PROMPT -Q --source tool --max-turns N [--resume ID]
//
// The model endpoint is not here: the real CLI reads it from the home's config.yaml only
// (orghome.EnsureAgentSetup writes it), with the org's gateway key in the variable KeyEnv.
package hermescli

import (
	"bytes"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// Provider is the name under which config.yaml lists the host's gateway.
const Provider = "hermes-host"

// KeyEnv is the variable of the agent's environment that holds the org's gateway key;
// config.yaml names it (providers.<Provider>.key_env) and never holds the key.
const KeyEnv = "HERMES_HOST_GATEWAY_KEY"

// HooksSocketEnv is where the host's plugin, inside the agent, finds the worker's subagent
// hook socket.
const HooksSocketEnv = "HERMES_HOST_HOOKS_SOCKET"

// ProxyEnv points the agent's HTTP clients (Python's urllib, requests and httpx read
// these) at the unit's egress proxy, proxyURL, for the public internet; its loopback (the
// gateway's forwarder) stays direct. None without a proxy.
func ProxyEnv(proxyURL string) []string {
	if proxyURL == "" {
		return nil
	}
	const direct = "127.0.0.1,localhost,::1"
	return []string{"HTTPS_PROXY=" + proxyURL, "HTTP_PROXY=" + proxyURL, "https_proxy=" + proxyURL,
		"http_proxy=" + proxyURL, "NO_PROXY=" + direct, "no_proxy=" + direct}
}

// Args is the command line of one headless run. --ignore-rules is never passed: it would
// drop SOUL.md and memory.
func Args(prompt string, maxTurns int, resume string) []string {
	args := []string{"chat", "-q", prompt, "-Q", "--source", "tool", "--max-turns", strconv.Itoa(maxTurns)}
	if resume != "" {
		args = append(args, "--resume", resume)
	}
	return args
}

// TurnLimitLine is what the CLI prints when a run reaches --max-turns; it then asks the model
// for a summary, prints it and exits 0. The summary may hold JSON, so this line, not a
// missing final JSON object, says the run stopped at its limit.
const TurnLimitLine = "Reached maximum iterations"

// sessionLine is the CLI's "session_id: <id>" on stderr; ids look like 20261203_141812_7c2bfe.
var sessionLine = regexp.MustCompile(`^session_id:\s*([A-Za-z0-9][A-Za-z0-9_.:-]{0,127})\s*$`)

// Limits of what is kept of a run's output: the answer is read from the end of stdout, and a
// flood is cut rather than buffered without bound.
const (
	MaxStdout = 4 << 20
	maxLine   = 64 << 10
)

// Output watches one run's stdout and stderr as they are written. Its writers pass stderr
// on (to the worker's own log, say) and keep stdout up to MaxStdout.
type Output struct {
	mu        sync.Mutex
	stdout    bytes.Buffer
	cut       bool
	session   string
	turnLimit bool
	partial   [2][]byte // an unfinished line of stdout, of stderr
}

// Stdout is the writer for the run's stdout.
func (o *Output) Stdout() *StreamWriter { return &StreamWriter{o: o, stream: 0} }

// Stderr is the writer for the run's stderr; what it gets is also written to pass (if set).
func (o *Output) Stderr(pass io.Writer) *StreamWriter {
	return &StreamWriter{o: o, stream: 1, pass: pass}
}

// StreamWriter is one stream of an Output.
type StreamWriter struct {
	o      *Output
	stream int
	pass   io.Writer
}

func (w *StreamWriter) Write(p []byte) (int, error) {
	o := w.o
	o.mu.Lock()
	if w.stream == 0 {
		if room := MaxStdout - o.stdout.Len(); room < len(p) {
			o.stdout.Write(p[:max(room, 0)])
			o.cut = true
		} else {
			o.stdout.Write(p)
		}
	}
	o.scan(w.stream, p)
	o.mu.Unlock()
	if w.pass != nil {
		_, _ = w.pass.Write(p)
	}
	return len(p), nil
}

// scan reads complete lines for the markers; a line longer than maxLine is no marker.
func (o *Output) scan(stream int, p []byte) {
	buf := append(o.partial[stream], p...)
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			break
		}
		o.line(stream, buf[:i])
		buf = buf[i+1:]
	}
	if len(buf) > maxLine {
		buf = nil
	}
	o.partial[stream] = append([]byte(nil), buf...)
}

func (o *Output) line(stream int, l []byte) {
	s := strings.TrimSpace(string(l))
	if strings.Contains(s, TurnLimitLine) {
		o.turnLimit = true
	}
	if stream == 1 {
		if m := sessionLine.FindStringSubmatch(s); m != nil {
			o.session = m[1]
		}
	}
}

// Result is what a finished run said.
type Result struct {
	Stdout    []byte // the final answer (after any warning lines), at most MaxStdout
	StdoutCut bool   // stdout was longer and its end is lost
	SessionID string // from the CLI's session_id line; empty when it printed none
	TurnLimit bool   // the run stopped at --max-turns
}

// Result reads what the run wrote; call it after the process has exited.
func (o *Output) Result() Result {
	o.mu.Lock()
	defer o.mu.Unlock()
	for s := range o.partial {
		if len(o.partial[s]) > 0 {
			o.line(s, o.partial[s])
			o.partial[s] = nil
		}
	}
	return Result{Stdout: bytes.Clone(o.stdout.Bytes()), StdoutCut: o.cut, SessionID: o.session, TurnLimit: o.turnLimit}
}
