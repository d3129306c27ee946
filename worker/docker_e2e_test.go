package worker_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"

	"hermeshost/dispatch/runtime"
)

// The Docker variant runs the same tests in a worker container built FROM scratch from the
// two static binaries, on the local engine.

var (
	dockerScope = "worker-e2e-" + randomHex()
	dockerImage = "hermes-worker-e2e:" + randomHex()
	engineErr   error
)

func randomHex() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func openEngine(ctx context.Context) error {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	if _, err := cli.Ping(ctx); err != nil {
		cli.Close()
		return fmt.Errorf("no Docker engine reachable: %w", err)
	}
	defer cli.Close()
	_, err = runtime.BuildScratchImage(ctx, cli, runtime.ScratchImage{
		Tag:      dockerImage,
		Binaries: []string{filepath.Join(binDir, "hermes-host"), filepath.Join(binDir, "scripted-agent")},
		Cmd:      []string{"hermes-host", "worker", "idle"},
	})
	return err
}

// closeEngine removes every container of this run's scope and the image.
func closeEngine(ctx context.Context) error {
	if engineErr != nil {
		return nil
	}
	engine, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	defer engine.Close()
	list, err := engine.ContainerList(ctx, container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", runtime.LabelScope+"="+dockerScope))})
	if err != nil {
		return err
	}
	for _, c := range list {
		_ = engine.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
	}
	_, err = engine.ImageRemove(ctx, dockerImage, image.RemoveOptions{Force: true, PruneChildren: true})
	if len(list) > 0 {
		return fmt.Errorf("%d containers of the test scope were left behind", len(list))
	}
	return err
}

// requireEngine skips a Docker test without an engine, except under CI, which must run it.
func requireEngine(t *testing.T) {
	t.Helper()
	if engineErr == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("CI is set, so the Docker tests must run: %v", engineErr)
	}
	t.Skipf("Docker tests skipped (%v); start dockerd to include them", engineErr)
}
