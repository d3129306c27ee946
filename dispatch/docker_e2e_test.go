package dispatch_test

import (
	"context"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"

	"hermeshost/dispatch/runtime"
	"hermeshost/sartiq/backend"
)

func TestDemoJobsCompleteInDockerWorkers(t *testing.T) {
	f := newFixture(t, true)
	dr := useDocker(t, f)
	f.cfg.ClaimEnabled = true
	d := f.dispatcher(t)
	cycleUntilDone(t, f, d, 45*time.Second)
	checkDemoJobsDone(t, f, 4, 0)

	ctx := context.Background()
	var viaDocker int
	if err := f.db.QueryRow(ctx, `SELECT count(*) FROM mirror_job_events WHERE kind = 'deliver' AND data->>'runtime' = 'docker'`).Scan(&viaDocker); err != nil || viaDocker != 4 {
		t.Errorf("%d of 4 jobs delivered through the docker runtime (%v)", viaDocker, err)
	}
	for _, org := range backend.DemoOrganizations {
		name := runtime.UnitName(org, runtime.RoleWorker)
		info, err := dr.engine.ContainerInspect(ctx, name)
		if err != nil {
			t.Errorf("container %s: %v", name, err)
			continue
		}
		for k, want := range map[string]string{runtime.LabelManaged: "true", runtime.LabelScope: dr.scope,
			runtime.LabelOrg: org, runtime.LabelRole: string(runtime.RoleWorker), runtime.LabelInstance: dr.scope} {
			if got := info.Config.Labels[k]; got != want {
				t.Errorf("%s: label %s = %q, want %q", name, k, got, want)
			}
		}
		if !info.State.Running || info.Config.Image != dr.image || string(info.HostConfig.NetworkMode) != "hermes-units-"+dr.scope {
			t.Errorf("%s: running %v, image %s, network %s; want the test's image running on the scope's units network",
				name, info.State.Running, info.Config.Image, info.HostConfig.NetworkMode)
		}
	}
}

func TestKilledWorkerContainerJobIsReclaimedAndCompleted(t *testing.T) {
	f := newFixture(t, true)
	dr := useDocker(t, f)
	var killed runtime.Unit
	reason := killMidJob(t, f, func(t *testing.T) {
		killed = workerUnit(t, dr, "acme")
		ctx := context.Background()
		waited, errs := dr.engine.ContainerWait(ctx, killed.ID, container.WaitConditionNotRunning)
		if err := dr.engine.ContainerKill(ctx, killed.ID, "KILL"); err != nil {
			t.Fatalf("kill %s: %v", killed.Name, err)
		}
		select {
		case <-waited:
		case err := <-errs:
			t.Fatalf("wait for %s to die: %v", killed.Name, err)
		}
	})
	if !strings.Contains(reason, runtime.ErrWorkerGone.Error()) {
		t.Errorf("attempt 1 ended %q, want the worker gone", reason)
	}
	// The re-claimed run had a fresh container, which took the killed one's place.
	if now := workerUnit(t, dr, "acme"); !now.Running || now.ID == killed.ID {
		t.Errorf("acme's worker after the re-claim: %+v, want a fresh container in place of %s", now, killed.ID)
	}
	if _, err := dr.engine.ContainerInspect(context.Background(), killed.ID); !cerrdefs.IsNotFound(err) {
		t.Errorf("the killed container is still there (inspect: %v)", err)
	}
}
