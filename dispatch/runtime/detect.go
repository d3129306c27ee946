package runtime

import (
	"context"
	"fmt"
	"time"

	"github.com/docker/docker/client"
)

// pingTimeout bounds how long Detect waits for an engine to answer.
const pingTimeout = 3 * time.Second

// Detect returns Docker when an engine named by the DOCKER_* environment answers a ping,
// and Process otherwise, and logs which it chose and why. An engine that answers but cannot
// serve (missing images, say) is an error, not a reason to fall back: that would quietly
// drop the isolation the operator set up. A Process picked without a sandbox says so, with
// the engine that did not answer, in its Unisolated: a caller must refuse it unless told
// otherwise.
func Detect(ctx context.Context, cfg Config) (Runtime, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return processBecause(cfg, fmt.Errorf("docker client: %w", err))
	}
	pingCtx, cancel := context.WithTimeout(ctx, pingTimeout)
	_, err = cli.Ping(pingCtx)
	cancel()
	if err != nil {
		engine := cli.DaemonHost()
		cli.Close()
		return processBecause(cfg, fmt.Errorf("no docker engine answered at %s: %w", engine, err))
	}
	d, err := newDocker(ctx, cfg, cli)
	if err != nil {
		cli.Close()
		return nil, err
	}
	cfg.Logger.Info("container runtime chosen", "runtime", d.Kind(), "engine", cli.DaemonHost(),
		"api_version", cli.ClientVersion())
	return d, nil
}

func processBecause(cfg Config, reason error) (Runtime, error) {
	p, err := NewProcess(cfg)
	if err != nil {
		return nil, err
	}
	p.because = reason
	if err := p.Unisolated(); err != nil {
		cfg.Logger.Warn("container runtime chosen", "runtime", p.Kind(), "sandboxed", false, "reason", reason.Error(),
			"unisolated", err.Error())
		return p, nil
	}
	cfg.Logger.Info("container runtime chosen", "runtime", p.Kind(), "sandboxed", true, "reason", reason.Error())
	return p, nil
}
