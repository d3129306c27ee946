package runtime

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/client"
)

// ScratchImage is an image holding nothing but static binaries, built through the Engine
// API from a build context made here: no registry and no base image are needed.
type ScratchImage struct {
	Tag string
	// Binaries are host paths of statically linked programs; each lands in /bin under its
	// base name, and /bin is the image's PATH.
	Binaries []string
	Cmd      []string          // default command; runtimes always give their own
	Labels   map[string]string // never secrets: labels are public to the engine
}

// HostImages are the worker and dashboard images of hermes-host. Both hold the same
// binaries (a dashboard's chat runs an agent too); they differ in their default command.
func HostImages(workerTag, dashboardTag string, binaries []string) []ScratchImage {
	return []ScratchImage{
		{Tag: workerTag, Binaries: binaries, Cmd: []string{"hermes-host", "worker", "idle"},
			Labels: map[string]string{"org.opencontainers.image.title": "hermes-host worker"}},
		{Tag: dashboardTag, Binaries: binaries, Cmd: []string{"hermes-host", "dashboard"},
			Labels: map[string]string{"org.opencontainers.image.title": "hermes-host dashboard"}},
	}
}

// BuildScratchImage builds img on the engine cli talks to and returns the image ID.
func BuildScratchImage(ctx context.Context, cli client.ImageAPIClient, img ScratchImage) (string, error) {
	if img.Tag == "" || len(img.Binaries) == 0 {
		return "", errors.New("build image: a tag and at least one binary are required")
	}
	buildContext, err := scratchContext(img)
	if err != nil {
		return "", fmt.Errorf("build image %s: %w", img.Tag, err)
	}
	resp, err := cli.ImageBuild(ctx, buildContext, build.ImageBuildOptions{
		Tags:        []string{img.Tag},
		Dockerfile:  "Dockerfile",
		Labels:      img.Labels,
		Remove:      true,
		ForceRemove: true,
		Version:     build.BuilderV1, // the classic builder is all FROM scratch needs
	})
	if err != nil {
		return "", fmt.Errorf("build image %s: %w", img.Tag, err)
	}
	defer resp.Body.Close()
	id, err := readBuildStream(resp.Body)
	if err != nil {
		return "", fmt.Errorf("build image %s: %w", img.Tag, err)
	}
	return id, nil
}

// BuildHostImages builds HostImages on the engine named by the DOCKER_* environment.
func BuildHostImages(ctx context.Context, workerTag, dashboardTag string, binaries []string) error {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return fmt.Errorf("docker client: %w", err)
	}
	defer cli.Close()
	for _, img := range HostImages(workerTag, dashboardTag, binaries) {
		if _, err := BuildScratchImage(ctx, cli, img); err != nil {
			return err
		}
	}
	return nil
}

// scratchContext is the tar build context: the binaries under bin/ and a Dockerfile.
func scratchContext(img ScratchImage) (io.Reader, error) {
	var names []string
	for _, path := range img.Binaries {
		if err := checkStatic(path); err != nil {
			return nil, err
		}
		name := filepath.Base(path)
		if slices.Contains(names, name) {
			return nil, fmt.Errorf("two binaries named %s", name)
		}
		names = append(names, name)
	}
	cmd, err := json.Marshal(img.Cmd)
	if err != nil {
		return nil, err
	}
	dockerfile := "FROM scratch\nCOPY bin/ /bin/\nENV PATH=/bin\n"
	if len(img.Cmd) > 0 {
		dockerfile += "CMD " + string(cmd) + "\n"
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	// A fixed time keeps the context, and so the builder's cache, the same for the same
	// binaries.
	epoch := time.Unix(0, 0)
	if err := tw.WriteHeader(&tar.Header{Name: "Dockerfile", Mode: 0o644, Size: int64(len(dockerfile)), ModTime: epoch}); err != nil {
		return nil, err
	}
	if _, err := io.WriteString(tw, dockerfile); err != nil {
		return nil, err
	}
	if err := tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch}); err != nil {
		return nil, err
	}
	for i, path := range img.Binaries {
		if err := addFile(tw, path, "bin/"+names[i], epoch); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return &buf, nil
}

func addFile(tw *tar.Writer, path, name string, modTime time.Time) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: fi.Size(), ModTime: modTime}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// checkStatic refuses a binary that needs a dynamic loader: in a scratch image it would
// fail with a bare "no such file or directory".
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("binary %s: %w", path, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("binary %s is dynamically linked (build it with CGO_ENABLED=0)", path)
		}
	}
	return nil
}

// readBuildStream follows the engine's JSON build messages to the end and returns the
// built image's ID, or the builder's error.
func readBuildStream(r io.Reader) (string, error) {
	var id string
	var tail []string // the last lines of builder output, to explain a failure
	dec := json.NewDecoder(r)
	for {
		var msg struct {
			Stream      string `json:"stream"`
			Error       string `json:"error"`
			ErrorDetail *struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
			Aux *struct {
				ID string `json:"ID"`
			} `json:"aux"`
		}
		err := dec.Decode(&msg)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("read build output: %w", err)
		}
		if msg.ErrorDetail != nil && msg.ErrorDetail.Message != "" {
			msg.Error = msg.ErrorDetail.Message
		}
		if msg.Error != "" {
			return "", fmt.Errorf("%s (after: %s)", msg.Error, strings.Join(tail, " | "))
		}
		if msg.Aux != nil && msg.Aux.ID != "" {
			id = msg.Aux.ID
		}
		if line := strings.TrimSpace(msg.Stream); line != "" {
			tail = append(tail, line)
			if len(tail) > 5 {
				tail = tail[1:]
			}
		}
	}
	if id == "" {
		return "", fmt.Errorf("engine reported no image ID (after: %s)", strings.Join(tail, " | "))
	}
	return id, nil
}
