package runtime

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// benchDocker is a Docker runtime for benchmarks, logging nowhere, with one org.
func benchDocker(b *testing.B) (*Docker, Config, string) {
	requireEngine(b)
	cfg := testConfig(b, nil)
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	d, err := NewDocker(b.Context(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	org := newOrg(b, cfg, "bench")
	b.Cleanup(func() {
		if err := d.Stop(context.Background(), org, RoleWorker); err != nil {
			b.Error(err)
		}
		d.Close()
	})
	return d, cfg, org
}

// BenchmarkWarmEnsureExec is what the dispatcher does per job on a running worker, beside
// a bare `docker exec` of the same program in the same container.
func BenchmarkWarmEnsureExec(b *testing.B) {
	d, _, org := benchDocker(b)
	ctx := b.Context()
	e, err := d.EnsureWorker(ctx, org)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("runtime", func(b *testing.B) {
		for b.Loop() {
			if _, err := d.EnsureWorker(ctx, org); err != nil {
				b.Fatal(err)
			}
			var out bytes.Buffer
			status, err := d.Exec(ctx, org, Command{Args: []string{"testagent", "echo"}, Stdin: strings.NewReader("ping\n"), Stdout: &out})
			if err != nil || status.Code != 0 || out.String() != "ping\n" {
				b.Fatalf("exec: %v %v %q", status, err, out.String())
			}
		}
	})
	b.Run("docker-exec-cli", func(b *testing.B) {
		for b.Loop() {
			cmd := exec.CommandContext(ctx, "docker", "exec", "-i", e.ID, "testagent", "echo")
			cmd.Stdin = strings.NewReader("ping\n")
			out, err := cmd.Output()
			if err != nil || string(out) != "ping\n" {
				b.Fatalf("docker exec: %v %q", err, out)
			}
		}
	})
}

// BenchmarkColdEnsure starts a worker from nothing, beside `docker run` of the same image
// with the same mounts and hardening.
func BenchmarkColdEnsure(b *testing.B) {
	d, cfg, org := benchDocker(b)
	ctx := b.Context()
	b.Run("runtime", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			if err := d.Stop(ctx, org, RoleWorker); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if e, err := d.EnsureWorker(ctx, org); err != nil || !e.Cold {
				b.Fatalf("cold ensure: %+v %v", e, err)
			}
		}
	})
	b.Run("docker-run-cli", func(b *testing.B) {
		name := "hermes-bench-" + suite.runID
		remove := func() {
			if out, err := exec.Command("docker", "rm", "-f", name).CombinedOutput(); err != nil {
				b.Fatalf("docker rm: %v %s", err, out)
			}
		}
		b.Cleanup(remove)
		home := filepath.Join(cfg.OrgsRoot, org)
		for range b.N {
			b.StopTimer()
			remove()
			b.StartTimer()
			out, err := exec.CommandContext(ctx, "docker", "run", "-d", "--name", name, "--init",
				"--network", "host", "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
				"--security-opt", "no-new-privileges",
				"-v", home+":/home/hermes", "-v", filepath.Join(cfg.WorkspacesRoot, org)+":/workspaces",
				"-v", filepath.Join(home, "SOUL.md")+":/home/hermes/SOUL.md:ro",
				cfg.WorkerImage, "testagent", "idle").CombinedOutput()
			if err != nil {
				b.Fatalf("docker run: %v %s", err, out)
			}
		}
	})
}

// BenchmarkSweep is what the end of every exec adds (see Docker.sweep): the end of an exec
// that left nothing (the engine's process list, and no sweep), beside the sweep exec the
// same worker cost before that check (sweep-exec-clean), and the end of one that left a
// detached process to kill.
func BenchmarkSweep(b *testing.B) {
	d, _, org := benchDocker(b)
	ctx := b.Context()
	if _, err := d.EnsureWorker(ctx, org); err != nil {
		b.Fatal(err)
	}
	unit := func() *dockerUnit {
		d.mu.Lock()
		defer d.mu.Unlock()
		u := d.units[UnitName(org, RoleWorker)]
		u.sweeping = make(chan struct{})
		return u
	}
	b.Run("nothing-left", func(b *testing.B) {
		before := testutil.ToFloat64(d.cfg.Metrics.sweeps.WithLabelValues("docker", "nothing_left"))
		for range b.N {
			b.StopTimer()
			time.Sleep(statsInterval) // jobs are further apart than that; see statsInterval
			u := unit()
			b.StartTimer()
			d.sweep(ctx, UnitName(org, RoleWorker), u)
		}
		if got := testutil.ToFloat64(d.cfg.Metrics.sweeps.WithLabelValues("docker", "nothing_left")); got-before != float64(b.N) {
			b.Fatalf("%v of %d ends found nothing left", got-before, b.N)
		}
	})
	b.Run("sweep-exec-clean", func(b *testing.B) {
		for b.Loop() {
			u := unit()
			d.killLeft(ctx, UnitName(org, RoleWorker), u)
			close(u.sweeping)
			u.sweeping = nil
		}
	})
	b.Run("one-left", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			u := unit()
			if _, _, err := d.exec(ctx, UnitName(org, RoleWorker), u, Command{Args: []string{"testagent", "detach", "bench"}}); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			d.sweep(ctx, UnitName(org, RoleWorker), u)
		}
	})
	if got := testutil.ToFloat64(d.cfg.Metrics.sweeps.WithLabelValues("docker", "failed")); got != 0 {
		b.Fatalf("%v sweeps failed", got)
	}
}
