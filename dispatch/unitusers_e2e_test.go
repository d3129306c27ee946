package dispatch_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"hermeshost/dispatch"
	"hermeshost/dispatch/runtime"
	"hermeshost/sartiq"
	"hermeshost/sartiq/backend"
)

// With UNIT_UIDS each org's units run as a uid of its own: the demo orgs' agents, run by
// the real worker, each see their org's uid from unit_users, no two orgs the same, and
// each home is that uid's.

// uidLogger is an agent that notes the uid and gid it runs as in its home's uid.log, then
// hands over to the scripted agent.
const uidLogger = "#!/bin/sh\necho \"uid=$(id -u) gid=$(id -g)\" >>\"$HERMES_HOME/uid.log\"\nexec scripted-agent \"$@\"\n"

func unitUsersFor(t *testing.T, f *fixture) *dispatch.UnitUsers {
	t.Helper()
	users, err := dispatch.NewUnitUsers(f.db, 200000, 200099)
	if err != nil {
		t.Fatal(err)
	}
	return users
}

// checkEachOrgItsOwnUID runs the demo jobs and checks what each org's agent ran as.
func checkEachOrgItsOwnUID(t *testing.T, f *fixture) {
	t.Helper()
	f.cfg.ClaimEnabled = true
	settle(t, f, 3*time.Minute)
	owners := map[int]string{}
	for _, org := range backend.DemoOrganizations {
		var uid int
		if err := f.db.QueryRow(context.Background(), `SELECT uid FROM unit_users WHERE org = $1`, org).Scan(&uid); err != nil {
			t.Fatalf("%s has no row in unit_users: %v", org, err)
		}
		if other, ok := owners[uid]; ok {
			t.Fatalf("uid %d is both %s's and %s's", uid, other, org)
		}
		owners[uid] = org
		if st := f.jobsOf(t, org); st[sartiq.StatusCompleted] != 2 || len(st) != 1 {
			t.Errorf("%s's jobs: %v, want both completed", org, st)
		}
		home := filepath.Join(f.cfg.OrgsRoot, org)
		raw, err := os.ReadFile(filepath.Join(home, "uid.log"))
		if err != nil {
			t.Fatalf("%s's agent noted nothing: %v", org, err)
		}
		want := fmt.Sprintf("uid=%d gid=%d", uid, uid)
		for line := range strings.SplitSeq(strings.TrimSpace(string(raw)), "\n") {
			if line != want {
				t.Errorf("%s's agent ran as %q, want %q (its own)", org, line, want)
			}
		}
		st, err := os.Stat(home)
		if err != nil {
			t.Fatal(err)
		}
		if sys := st.Sys().(*syscall.Stat_t); int(sys.Uid) != uid || int(sys.Gid) != uid || st.Mode().Perm() != 0o700 {
			t.Errorf("%s's home is %d:%d %v, want its own %d:%d 0700", org, sys.Uid, sys.Gid, st.Mode().Perm(), uid, uid)
		}
	}
}

func TestDockerEachOrgRunsAsAUidOfItsOwn(t *testing.T) {
	f := newFixture(t, true)
	f.cfg.MaxAttempts = 2
	useDockerWith(t, f, dockerOptions{shell: true, users: unitUsersFor(t, f)})
	for _, org := range backend.DemoOrganizations {
		if err := os.WriteFile(filepath.Join(f.cfg.OrgsRoot, org, "agent"), []byte(uidLogger), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f.cfg.WorkerEnv = append(f.cfg.WorkerEnv, "HERMES_BIN="+dockerAgentBin)
	checkEachOrgItsOwnUID(t, f)
}

func TestSandboxedEachOrgRunsAsAUidOfItsOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root gives an org's files to its uid")
	}
	f := newFixture(t, true)
	f.cfg.MaxAttempts = 2
	useSandboxedWith(t, f, runtime.Limits{}, unitUsersFor(t, f))
	agent := filepath.Join(t.TempDir(), "uid-logger")
	if err := os.WriteFile(agent, []byte(uidLogger), 0o755); err != nil {
		t.Fatal(err)
	}
	f.cfg.WorkerEnv = append(f.cfg.WorkerEnv, "HERMES_BIN="+agent)
	checkEachOrgItsOwnUID(t, f)
}
