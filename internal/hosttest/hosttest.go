// Package hosttest holds what the end-to-end tests of the worker and the dispatcher share:
// the static binaries a worker container runs, and a real gateway on its demo upstream.
package hosttest

import (
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"hermeshost/gateway"
	"hermeshost/service"
)

// BuildBinaries builds hermes-host and the scripted agent, static, into dir.
func BuildBinaries(dir string) error {
	_, here, _, _ := runtime.Caller(0)
	repo := filepath.Join(filepath.Dir(here), "..", "..")
	for name, pkg := range map[string]string{"hermes-host": "./cmd/hermes-host", "scripted-agent": "./cmd/scripted-agent"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, name), pkg)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("build %s: %w", name, err)
		}
	}
	return nil
}

// DemoGateway starts the gateway in front of its demo upstream until the test ends and
// returns its URL; per-org keys derive from secret.
func DemoGateway(t testing.TB, secret, hostKey string) string {
	t.Helper()
	demo := httptest.NewServer(gateway.Demo())
	t.Cleanup(demo.Close)
	gw, err := gateway.New(gateway.Config{
		UpstreamURL: demo.URL + "/v1", Secret: service.Secret(secret), HostKey: service.Secret(hostKey),
		OrgRPS: 1000, OrgBurst: 1000, OrgConcurrency: 16, MaxRequestBytes: 1 << 20,
		Ops: service.NewOps(slog.New(slog.DiscardHandler)),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}
