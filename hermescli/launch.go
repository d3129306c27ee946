package hermescli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"hermeshost/orghome"
)

// Setup is what the home must say before an agent starts there, the same for a job and a
// chat turn: the gateway as the provider (its key under KeyEnv), the image's bundled
// skills read in place, the host's plugin.
func Setup(gatewayURL, model, bundledSkills string, plugin orghome.Plugin) orghome.AgentSetup {
	return orghome.AgentSetup{
		Provider: Provider, BaseURL: gatewayURL + "/v1", Model: model,
		KeyEnv: KeyEnv, BundledSkills: bundledSkills, Plugin: plugin,
	}
}

// Launch is one start of the agent, the same for a job and a chat turn: its own process
// group, killed with its caller, and in its environment only its home, the org's gateway
// key under the name config.yaml gives it, and what the caller adds (a job's sockets, the
// unit's egress proxy: ProxyEnv). No
// endpoint: the real CLI reads that from config.yaml only.
type Launch struct {
	Bin        string
	Args       []string
	Home       string // HOME and HERMES_HOME
	GatewayKey string
	Dir        string   // the working folder
	PathFirst  string   // a folder put before PATH ("" for none): where sartiq is
	Env        []string // more KEY=VALUE pairs
	Stderr     io.Writer
}

// waitDelay bounds the wait for the pipes of a process the agent left behind.
const waitDelay = 5 * time.Second

// Run starts the agent, calls started (if set) once it runs, and waits for it; when ctx
// ends first, the whole process group is killed and the code is -1. A non-zero exit is a
// code, not an error.
func (l Launch) Run(ctx context.Context, started func()) (Result, int, error) {
	cmd := exec.Command(l.Bin, l.Args...)
	cmd.Dir = l.Dir
	path := os.Getenv("PATH")
	if l.PathFirst != "" {
		path = l.PathFirst + string(os.PathListSeparator) + path
	}
	cmd.Env = append([]string{"PATH=" + path, "HOME=" + l.Home, "HERMES_HOME=" + l.Home, KeyEnv + "=" + l.GatewayKey}, l.Env...)
	// Its own group, so a stop kills everything it started; and killed with its caller, so
	// no agent outlives the home lock its caller held.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var out Output
	cmd.Stdout = out.Stdout()
	cmd.Stderr = out.Stderr(l.Stderr)
	cmd.WaitDelay = waitDelay
	if err := cmd.Start(); err != nil {
		return Result{}, 0, fmt.Errorf("start the agent %s: %w", l.Bin, err)
	}
	if started != nil {
		started()
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		return out.Result(), exitCode(err), nil
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-waited
		return out.Result(), -1, nil
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
