package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

// suite is what TestMain prepares once for every test.
var suite struct {
	runID    string // sets this run's org IDs, instance IDs and image tag apart from any other
	agentDir string // holds the testagent binary
	agent    string // its path
	engine   *client.Client
	// engineErr says why there is no usable engine; nil when there is one.
	engineErr error
	image     string // FROM scratch test image holding testagent
	instances atomic.Int64
}

func TestMain(m *testing.M) { os.Exit(runSuite(m)) }

func runSuite(m *testing.M) int {
	suite.runID = randomHex(3)
	dir, err := os.MkdirTemp("", "hermes-runtime-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	suite.agentDir = dir
	suite.agent = filepath.Join(dir, "testagent")
	build := exec.Command("go", "build", "-o", suite.agent, "./internal/testagent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build testagent: %v\n%s", err, out)
		return 1
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	suite.engineErr = openEngine(ctx)
	cancel()
	code := m.Run()
	if suite.engine != nil {
		// A deadline of its own: the tests themselves may have taken minutes.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := removeLeftovers(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
		suite.engine.Close()
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
		code = 1
	}
	return code
}

// openEngine connects to the engine and builds the test image; an error says why Docker
// tests cannot run.
func openEngine(ctx context.Context) error {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := cli.Ping(pingCtx); err != nil {
		cli.Close()
		return fmt.Errorf("no Docker engine reachable at %s: %w", cli.DaemonHost(), err)
	}
	suite.engine = cli
	suite.image = "hermes-runtime-test:" + suite.runID
	_, err = BuildScratchImage(ctx, cli, ScratchImage{
		Tag:      suite.image,
		Binaries: []string{suite.agent},
		Cmd:      []string{"testagent", "idle"},
		Labels:   map[string]string{"hermes.test": "runtime"},
	})
	if err != nil {
		return fmt.Errorf("build test image: %w", err)
	}
	return nil
}

// removeLeftovers fails the run if any container of this run's scope is left, and removes
// them and the test image.
func removeLeftovers(ctx context.Context) error {
	list, err := suite.engine.ContainerList(ctx, container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", LabelManaged+"=true"), filters.Arg("label", LabelScope+"="+testScope()))})
	if err != nil {
		return fmt.Errorf("list leftover containers: %w", err)
	}
	var left []string
	for _, c := range list {
		left = append(left, containerName(c.Names))
		_ = suite.engine.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
	}
	if _, err := suite.engine.ImageRemove(ctx, suite.image, image.RemoveOptions{Force: true, PruneChildren: true}); err != nil {
		return fmt.Errorf("remove test image: %w", err)
	}
	if len(left) > 0 {
		return fmt.Errorf("containers left with the managed label: %s", strings.Join(left, ", "))
	}
	return nil
}

// testScope keeps this run's containers apart from any other runtime on the engine.
func testScope() string { return "test-" + suite.runID }

// requireEngine skips a Docker test when no engine is reachable, except under CI, which
// must run them.
func requireEngine(tb testing.TB) {
	tb.Helper()
	if suite.engineErr == nil {
		return
	}
	if os.Getenv("CI") != "" {
		tb.Fatalf("CI is set, so Docker tests must run: %v", suite.engineErr)
	}
	tb.Skipf("Docker tests skipped (%v); start dockerd or point DOCKER_HOST at an engine", suite.engineErr)
}

// testConfig is a config for one test: fresh directories, its own instance and metrics,
// logs to the test's output and to logs.
func testConfig(t testing.TB, logs io.Writer) Config {
	root := t.TempDir()
	out := io.Writer(t.Output())
	if logs != nil {
		out = io.MultiWriter(out, logs)
	}
	return Config{
		Instance:       "instance-" + strconv.FormatInt(suite.instances.Add(1), 10),
		Scope:          testScope(),
		OrgsRoot:       filepath.Join(root, "orgs"),
		WorkspacesRoot: filepath.Join(root, "workspaces"),
		WorkerIdle:     []string{"testagent", "idle"},
		WorkerImage:    suite.image,
		DashboardImage: suite.image,
		Network:        "host",
		BinDir:         suite.agentDir,
		Output:         out,
		Logger:         slog.New(slog.NewTextHandler(out, nil)),
		Metrics:        NewMetrics(prometheus.NewRegistry()),
	}
}

// newOrg makes an org home with a SOUL.md and returns the org ID.
func newOrg(t testing.TB, cfg Config, name string) string {
	t.Helper()
	org := suite.runID + "-" + name
	home := filepath.Join(cfg.OrgsRoot, org)
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "SOUL.md"), []byte("soul of "+org+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return org
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// fakeClock is a settable clock for idle timeouts.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
