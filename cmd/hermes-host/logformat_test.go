package main

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"hermeshost/internal/testio"
	"hermeshost/pg/pgtest"
)

// ansi matches the colour escapes of the text format.
var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

// textRecord is a line of the text format, colour removed: time, level, process, message.
var textRecord = regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO |WARN |ERROR) (\S+) +\S`)

// stderrKinds opens what a process under test writes its stderr to, and reads it back.
type stderrTo struct {
	// w is given to the process; read reads what it wrote, until it is closed.
	w    *os.File
	read io.ReadCloser
	// started closes the test's copy of w where it holds one.
	started func()
}

func openStderr(t *testing.T, kind string) stderrTo {
	t.Helper()
	switch kind {
	case "terminal":
		term, reader, err := testio.OpenPTY()
		if err != nil {
			t.Fatal(err)
		}
		return stderrTo{w: term, read: reader, started: func() { term.Close() }}
	case "pipe":
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		return stderrTo{w: w, read: r, started: func() { w.Close() }}
	case "file":
		path := filepath.Join(t.TempDir(), "stderr.log")
		w, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		r, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		return stderrTo{w: w, read: &fileTail{r}, started: func() { w.Close() }}
	}
	t.Fatalf("unknown stderr %q", kind)
	return stderrTo{}
}

// fileTail reads a file that a process is still writing: at its end it waits for more.
type fileTail struct{ f *os.File }

func (f *fileTail) Read(p []byte) (int, error) {
	for i := 0; ; i++ {
		n, err := f.f.Read(p)
		if n > 0 || err != io.EOF || i > 500 {
			return n, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *fileTail) Close() error { return f.f.Close() }

// A process logs text on a terminal and JSON on a pipe or a file unless LOG_FORMAT says
// otherwise; a file always gets JSON; NO_COLOR turns the colours off.
func TestLogFormatFollowsStderrAndLOG_FORMAT(t *testing.T) {
	cases := []struct {
		stderr string
		env    []string
		want   string
	}{
		{"terminal", nil, "text+color"},
		{"terminal", []string{"LOG_FORMAT=auto"}, "text+color"},
		{"terminal", []string{"NO_COLOR=1"}, "text"},
		{"terminal", []string{"LOG_FORMAT=json"}, "json"},
		{"pipe", nil, "json"},
		{"pipe", []string{"LOG_FORMAT=text"}, "text"},
		{"file", nil, "json"},
		{"file", []string{"LOG_FORMAT=text"}, "json"},
	}
	for _, c := range cases {
		t.Run(c.stderr+"/"+strings.Join(c.env, ","), func(t *testing.T) {
			cmd := exec.Command(binary, "worker", "idle")
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, c.env...)
			out := openStderr(t, c.stderr)
			defer out.read.Close()
			cmd.Stderr = out.w
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			out.started()
			defer cmd.Process.Kill() //nolint:errcheck // cleanup after a failed assertion
			line, err := bufio.NewReader(out.read).ReadString('\n')
			if err != nil {
				t.Fatalf("no line logged: %q, %v", line, err)
			}
			line = strings.TrimRight(line, "\r\n")
			got := "text"
			var rec map[string]any
			switch {
			case json.Unmarshal([]byte(line), &rec) == nil:
				got = "json"
				if rec["msg"] != "worker idle: jobs are executed beside this process" || rec["process"] != "worker" || rec["level"] != "INFO" {
					t.Fatalf("JSON record %q", line)
				}
			case ansi.MatchString(line):
				got = "text+color"
			}
			if got != "json" {
				plain := ansi.ReplaceAllString(line, "")
				if !textRecord.MatchString(plain) || !strings.HasSuffix(plain, " INFO  worker     worker idle: jobs are executed beside this process") {
					t.Fatalf("text record %q", line)
				}
			}
			if got != c.want {
				t.Fatalf("logged %s, want %s: %q", got, c.want, line)
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("worker idle did not exit cleanly: %v", err)
			}
		})
	}
	r := run(t, map[string]string{"LOG_FORMAT": "yaml"}, "worker", "idle")
	if r.code != 1 || strings.TrimSpace(r.stderr) != `hermes-host worker idle: config: LOG_FORMAT: "yaml" is not one of auto, json, text` {
		t.Fatalf("bad LOG_FORMAT: %+v", r)
	}
	if r := run(t, nil, "dev", "--help"); !strings.Contains(r.stdout, "LOG_FORMAT") {
		t.Fatalf("dev --help lacks LOG_FORMAT:\n%s", r.stdout)
	}
}

// `hermes-host dev` logs every line as a record in its own format: its own, and the JSON
// its org units (the process runtime's workers) log to it, under the unit's process name.
// The units do not read LOG_FORMAT and write to a pipe, so they log JSON: on a terminal it
// is shown as text, and with LOG_FORMAT it follows dev's format wherever dev writes.
func TestDevShowsItsUnitsLinesInItsOwnFormat(t *testing.T) {
	cases := []struct {
		stderr, format string
		json           bool
	}{
		{"terminal", "", false},
		{"terminal", "json", true},
		{"pipe", "text", false},
	}
	for _, c := range cases {
		t.Run(c.stderr+"/"+c.format, func(t *testing.T) {
			url, _ := pgtest.EmptySchema(t)
			backendURL, _ := pgtest.EmptySchema(t)
			cmd := exec.Command(binary, "dev", "--addr", "127.0.0.1:0", "--backend-addr", "127.0.0.1:0", "--gateway-addr", "127.0.0.1:0",
				"--launcher-addr", "127.0.0.1:0", "--control-addr", "127.0.0.1:0", "--orgs-root", filepath.Join(t.TempDir(), "orgs"))
			// Claiming, so that the demo orgs' workers start; no Docker engine, so that they
			// are the process runtime's children, whatever runs on this machine.
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DATABASE_URL=" + url, "BACKEND_DATABASE_URL=" + backendURL,
				"GATEWAY_SECRET=dev-test-secret", "CLAIM_ENABLED=true", "POLL_INTERVAL=1s", "DOCKER_HOST=unix:///nonexistent/docker.sock"}
			if c.format != "" {
				cmd.Env = append(cmd.Env, "LOG_FORMAT="+c.format)
			}
			var stdout testio.Buffer
			cmd.Stdout = &stdout
			out := openStderr(t, c.stderr)
			cmd.Stderr = out.w
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			out.started()
			defer cmd.Process.Kill() //nolint:errcheck // cleanup after a failed assertion
			var logs testio.Buffer
			ended := make(chan struct{})
			go func() {
				// A terminal's reader fails (EIO) once dev and its units have closed it.
				io.Copy(&logs, out.read) //nolint:errcheck
				close(ended)
			}()
			defer out.read.Close()

			unitLine := regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d\.\d{3} INFO  worker     worker idle: jobs are executed beside this process\r?$`)
			if c.json {
				unitLine = regexp.MustCompile(`(?m)^\{"time":"[^"]+","level":"INFO","msg":"worker idle: jobs are executed beside this process","process":"worker"\}\r?$`)
			}
			// The unit's record as the unit wrote it, not re-emitted by dev.
			rawLine := regexp.MustCompile(`"msg":"worker idle: jobs are executed beside this process"`)
			if c.json {
				rawLine = regexp.MustCompile(`INFO  worker     worker idle: jobs are executed beside this process`)
			}
			deadline := time.Now().Add(90 * time.Second)
			for !unitLine.MatchString(ansi.ReplaceAllString(logs.String(), "")) {
				if rawLine.MatchString(ansi.ReplaceAllString(logs.String(), "")) {
					t.Fatalf("a worker's record reached dev's stderr in the worker's own format:\n%s", logs.String())
				}
				if time.Now().After(deadline) {
					t.Fatalf("no worker's line came through dev:\n%s", logs.String())
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("dev did not exit cleanly on SIGTERM: %v\n%s", err, logs.String())
			}
			select {
			case <-ended:
			case <-time.After(10 * time.Second):
				t.Fatal("dev's stderr stayed open after it exited")
			}

			all := logs.String()
			if colored := strings.Contains(all, "\x1b["); colored != (c.stderr == "terminal" && !c.json) {
				t.Fatalf("colour: %v, on a %s with LOG_FORMAT=%q:\n%s", colored, c.stderr, c.format, all)
			}
			for _, l := range strings.Split(strings.TrimSuffix(all, "\n"), "\n") {
				l = strings.TrimSuffix(ansi.ReplaceAllString(l, ""), "\r")
				if c.json {
					var rec struct{ Msg, Process string }
					if err := json.Unmarshal([]byte(l), &rec); err != nil || rec.Msg == "" || rec.Process == "" {
						t.Fatalf("not a JSON record with a process: %q\n%s", l, all)
					}
					continue
				}
				if !textRecord.MatchString(l) {
					t.Fatalf("not a readable record: %q\n%s", l, all)
				}
			}
			if !c.json && !regexp.MustCompile(`(?m)^\S+ INFO  dev        hermes-host dev is up status_url=http://127\.0\.0\.1:\d+ `).MatchString(ansi.ReplaceAllString(all, "")) {
				t.Fatalf("dev's own records are not text:\n%s", all)
			}
			// The launcher's login is on stdout, not among the records.
			if !strings.Contains(stdout.String(), "Log in as admin with password ") {
				t.Fatalf("stdout: %q", stdout.String())
			}
		})
	}
}
