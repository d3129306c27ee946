package runtime

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Container names are one per org on an engine, so a runtime of another scope finds this
// scope's container under the name it wants: it must leave it alone, running or not, and
// say so, rather than remove it to make room (a test suite beside a real host would
// otherwise kill the host's job in flight).
func TestDockerNeverRemovesAnotherScopesContainer(t *testing.T) {
	requireEngine(t)
	ctx := testContext(t)
	cfg := testConfig(t, nil)
	owner := dockerHarness().start(t, cfg)
	neighbourCfg := cfg
	neighbourCfg.Scope, neighbourCfg.Instance = testScope()+"-neighbour", cfg.Instance+"-neighbour"
	neighbourCfg.Metrics = NewMetrics(prometheus.NewRegistry())
	neighbour := dockerHarness().start(t, neighbourCfg)
	org := newOrg(t, cfg, "name-taken")

	held := mustEnsureWorker(t, owner, org)
	if _, err := neighbour.EnsureWorker(ctx, org); !errors.Is(err, ErrNameTaken) {
		t.Fatalf("another scope's ensure of %s: %v, want ErrNameTaken", held.Name, err)
	}
	if out, _, _ := run(t, owner, org, "still here\n", nil, "testagent", "echo"); out != "still here\n" {
		t.Errorf("the owner's worker after the neighbour's ensure printed %q", out)
	}

	// Nor to stop.
	if err := neighbour.Stop(ctx, org, RoleWorker); !errors.Is(err, ErrNameTaken) {
		t.Fatalf("another scope's stop of %s: %v, want ErrNameTaken", held.Name, err)
	}
	if out, _, _ := run(t, owner, org, "after the stop\n", nil, "testagent", "echo"); out != "after the stop\n" {
		t.Errorf("the owner's worker after the neighbour's stop printed %q", out)
	}

	// An exited container of another scope is not the neighbour's to clear either.
	killContainer(t, owner, held.Unit)
	if _, err := neighbour.EnsureWorker(ctx, org); !errors.Is(err, ErrNameTaken) {
		t.Fatalf("another scope's ensure over an exited %s: %v, want ErrNameTaken", held.Name, err)
	}
	if _, err := suite.engine.ContainerInspect(ctx, held.ID); err != nil {
		t.Fatalf("the neighbour removed the owner's exited container: %v", err)
	}
	if again := mustEnsureWorker(t, owner, org); !again.Cold || again.ID == held.ID {
		t.Errorf("the owner's ensure over its own exited container = %+v, want a fresh one", again)
	}
}
