package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"hermeshost/internal/hosttest"
	"hermeshost/pg/pgtest"
)

// The hostile-agent suite through `dev`, as a new user would try it: acme's agent is a
// shell script that looks around before it hands over to the scripted agent, and writes
// what it reached to reached.log in its home. On the sandboxed process runtime and on
// Docker it must reach nothing outside its org: not Postgres, the launcher, the dispatcher's
// control API, the Docker socket, a host service bound to every address (on Docker, not
// at the bridge's gateway address either), another org's home, a host process's
// environment, or a socket that is not its own; the job still completes.

// hostileProbe is the script. Each probe writes one line "<probe>: <what happened>".
// Applets are busybox's: the Docker image's only shell, and on the host called by name.
const hostileProbe = `#!/bin/sh
bb() { if command -v busybox >/dev/null 2>&1; then busybox "$@"; else "$@"; fi; }
log="$HERMES_HOME/reached.log"
# On the process runtime one script serves every org; in a container only acme's home has it.
if [ "${HERMES_HOME##*/}" = acme ] || [ "$HERMES_HOME" = /home/hermes ]; then
  : > "$log"
  tcp() { # name host port
    if bb nc -w 2 "$2" "$3" </dev/null >/dev/null 2>&1; then echo "$1 $2:$3: CONNECTED" >> "$log"; else echo "$1 $2:$3: refused" >> "$log"; fi
  }
  # The default route's gateway, in a container only: there it is the bridge's address on
  # this machine; on the host's network it would be another machine, never a target.
  gw=""
  [ "$HERMES_HOME" = /home/hermes ] && gw=$(bb ip route 2>/dev/null | bb awk '/^default/ {print $3}')
  echo "gateway: ${gw:-none}" >> "$log"
  for host in 127.0.0.1 $gw; do
    tcp wide "$host" @WIDEPORT@
    tcp postgres "$host" @PGPORT@
    tcp launcher "$host" @LAUNCHERPORT@
    tcp control "$host" @CONTROLPORT@
    tcp backend "$host" @BACKENDPORT@
  done
  for s in /var/run/docker.sock /run/docker.sock; do
    if [ -e "$s" ]; then echo "docker $s: PRESENT" >> "$log"; else echo "docker $s: absent" >> "$log"; fi
  done
  if cat "@OTHERHOME@/SOUL.md" >/dev/null 2>&1 || cat /home/globex/SOUL.md >/dev/null 2>&1; then echo "other-home: READ" >> "$log"; else echo "other-home: unreadable" >> "$log"; fi
  if bb ls "@ORGSROOT@" 2>/dev/null | bb grep -q globex; then echo "orgs-root: LISTED" >> "$log"; else echo "orgs-root: not listed" >> "$log"; fi
  for f in /proc/[0-9]*/environ; do
    if bb grep -qa -e SARTIQ_TOKEN= -e CONTROL_KEY= -e DATABASE_URL= -e BOT_TOKEN= "$f" 2>/dev/null; then echo "environ $f: SECRETS" >> "$log"; fi
  done
  echo "environ: done" >> "$log"
  # Every socket it can find, to be checked against its own.
  bb find / \( -path /proc -o -path /sys -o -path /dev -o -path /usr -o -path /lib -o -path /lib64 -o -path /etc \) -prune -o -type s -print 2>/dev/null | while read -r s; do echo "socket $s" >> "$log"; done
  # Every port listening on its loopback, asked without a key.
  for port in $(bb netstat -ltn 2>/dev/null | bb awk 'NR>2 {split($4, a, ":"); print a[length(a)]}'); do
    answer=$(bb wget -q -O - "http://127.0.0.1:$port/v1/jobs" 2>&1 | bb head -c 200 | bb tr '\n' ' ')
    echo "loopback $port: $answer" >> "$log"
  done
  echo "probe: done" >> "$log"
fi
exec scripted-agent "$@"
`

func TestAHostileAgentReachesNothingOutsideItsOrg(t *testing.T) {
	t.Run("process", func(t *testing.T) {
		if _, err := exec.LookPath("bwrap"); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatal("CI is set, so the sandboxed runtime must be tested: apt-get install bubblewrap")
			}
			t.Skip("no bubblewrap: ", err)
		}
		orgs := t.TempDir()
		agent := filepath.Join(t.TempDir(), "agent")
		testHostileAgent(t, orgs, agent, func(script string) {
			if err := os.WriteFile(agent, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "HERMES_RUNTIME=process", "HERMES_SANDBOX=bwrap", "DOCKER_HOST=unix:///nonexistent/docker.sock")
	})
	t.Run("docker", func(t *testing.T) {
		if err := exec.Command("docker", "info").Run(); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatal("CI is set, so the Docker runtime must be tested: ", err)
			}
			t.Skip("no Docker engine answers (make test starts one): ", err)
		}
		busybox, err := os.ReadFile("/bin/busybox")
		if err != nil {
			if os.Getenv("CI") != "" {
				t.Fatal("CI is set, so the hostile agent must run: apt-get install busybox-static: ", err)
			}
			t.Skip("no static busybox: ", err)
		}
		hosttest.LockDemoOrgContainers(t, 3*time.Minute)
		bins := t.TempDir()
		if err := hosttest.BuildBinaries(bins); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bins, "sh"), busybox, 0o755); err != nil {
			t.Fatal(err)
		}
		tag := fmt.Sprintf("hostile-e2e-%d", time.Now().UnixNano())
		images := []string{"HERMES_WORKER_IMAGE=hermes-host-worker:" + tag, "HERMES_DASHBOARD_IMAGE=hermes-host-dashboard:" + tag}
		build := exec.Command(filepath.Join(bins, "hermes-host"), "images", "build",
			filepath.Join(bins, "hermes-host"), filepath.Join(bins, "scripted-agent"), filepath.Join(bins, "sh"))
		build.Env = append([]string{"PATH=" + os.Getenv("PATH")}, images...)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("images build: %v\n%s", err, out)
		}
		t.Cleanup(func() {
			_ = exec.Command("docker", "rmi", "-f", "hermes-host-worker:"+tag, "hermes-host-dashboard:"+tag).Run()
		})
		orgs := t.TempDir()
		// In a container the agent is in its home, which is mounted at /home/hermes.
		log, ports := testHostileAgent(t, orgs, "/home/hermes/agent", func(script string) {
			for org, body := range map[string]string{"acme": script, "globex": "#!/bin/sh\nexec scripted-agent \"$@\"\n"} {
				if err := os.MkdirAll(filepath.Join(orgs, org), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(orgs, org, "agent"), []byte(body), 0o755); err != nil {
					t.Fatal(err)
				}
			}
		}, append(images, "HERMES_RUNTIME=docker")...)
		onDockersBridge(t, log, ports)
	})
}

// onDockersBridge asserts the probe ran in a container on a bridge (it saw a default route)
// and reached nothing at the bridge's gateway address either, not even a host service bound
// to every address.
func onDockersBridge(t *testing.T, log string, ports probedPorts) {
	gw := ""
	for _, line := range strings.Split(log, "\n") {
		if g, ok := strings.CutPrefix(line, "gateway: "); ok {
			gw = g
		}
	}
	if gw == "" || gw == "none" {
		t.Fatalf("the probe saw no default route in its container:\n%s", log)
	}
	if want := "wide " + gw + ":" + ports.wide + ": refused"; !strings.Contains(log, want) {
		t.Errorf("reached.log lacks %q", want)
	}
}

// The probe itself, on a runtime that does not contain: unsandboxed, on the host's
// network, the same script reaches Postgres, the launcher and the control API and finds
// the worker's sockets of other jobs' processes. The suite's checks can fail.
func TestTheHostileProbeSeesWhatAnUncontainedAgentReaches(t *testing.T) {
	orgs := t.TempDir()
	agent := filepath.Join(t.TempDir(), "agent")
	log, ports := runHostileAgent(t, orgs, agent, func(script string) {
		if err := os.WriteFile(agent, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}, "HERMES_RUNTIME=process", "HERMES_SANDBOX=none", "UNIT_NETWORK=host", "DOCKER_HOST=unix:///nonexistent/docker.sock")
	for _, want := range []string{"postgres 127.0.0.1:" + ports.pg + ": CONNECTED", "launcher 127.0.0.1:" + ports.launcher + ": CONNECTED",
		"control 127.0.0.1:" + ports.control + ": CONNECTED", "wide 127.0.0.1:" + ports.wide + ": CONNECTED", "other-home: READ", "orgs-root: LISTED"} {
		if !strings.Contains(log, want) {
			t.Errorf("uncontained, the probe did not see %q:\n%s", want, log)
		}
	}
}

type probedPorts struct{ pg, launcher, control, backend, wide string }

func testHostileAgent(t *testing.T, orgs, agent string, install func(script string), env ...string) (string, probedPorts) {
	log, ports := runHostileAgent(t, orgs, agent, install, env...)
	checkContained(t, log, ports)
	return log, ports
}

// wideService is a host service bound to every address, as many are: it accepts and closes
// connections until the test ends, and answers with its port.
func wideService(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// runHostileAgent runs dev with the probe as acme's agent until acme's jobs completed, and
// returns what the probe wrote.
func runHostileAgent(t *testing.T, orgs, agent string, install func(script string), env ...string) (string, probedPorts) {
	pg, err := url.Parse(pgtest.URL(t))
	if err != nil || pg.Port() == "" {
		t.Fatal("the test database's URL names no port")
	}
	launcherPort, controlPort, backendPort, widePort := strconv.Itoa(hosttest.FreePort(t)), strconv.Itoa(hosttest.FreePort(t)), strconv.Itoa(hosttest.FreePort(t)), wideService(t)
	script := strings.NewReplacer("@WIDEPORT@", widePort, "@PGPORT@", pg.Port(), "@LAUNCHERPORT@", launcherPort, "@CONTROLPORT@", controlPort,
		"@BACKENDPORT@", backendPort, "@OTHERHOME@", filepath.Join(orgs, "globex"), "@ORGSROOT@", orgs).Replace(hostileProbe)
	install(script)
	dev := startDevAt(t, orgs, map[string]string{"--launcher-addr": "127.0.0.1:" + launcherPort,
		"--control-addr": "127.0.0.1:" + controlPort, "--backend-addr": "127.0.0.1:" + backendPort},
		append(env, "CLAIM_ENABLED=true", "HERMES_BIN="+agent)...)

	// The durable state: acme's jobs complete, the agent having looked around first.
	db, err := pgxpool.New(context.Background(), dev.backendDB)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var statuses string
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		var done, all int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE lower(status) = 'completed'), count(*),
			coalesce(string_agg(status, ','), '') FROM agent_jobs WHERE organization_id = 'acme'`).Scan(&done, &all, &statuses); err != nil {
			t.Fatalf("read acme's jobs: %v", err)
		}
		if all > 0 && done == all {
			break
		}
		if time.Now().After(deadline) {
			raw, _ := os.ReadFile(filepath.Join(orgs, "acme", "reached.log"))
			t.Fatalf("acme's jobs are %s, want all completed; reached.log:\n%s", statuses, raw)
		}
	}
	raw, err := os.ReadFile(filepath.Join(orgs, "acme", "reached.log"))
	if err != nil {
		t.Fatalf("the agent wrote no reached.log: %v", err)
	}
	log := string(raw)
	t.Logf("the hostile agent's reached.log:\n%s", log)
	return log, probedPorts{pg: pg.Port(), launcher: launcherPort, control: controlPort, backend: backendPort, wide: widePort}
}

// checkContained asserts the probe reached nothing outside its org.
func checkContained(t *testing.T, log string, ports probedPorts) {
	if !strings.Contains(log, "probe: done") || !strings.Contains(log, "environ: done") {
		t.Fatalf("the probe did not finish:\n%s", log)
	}
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		switch {
		case strings.HasSuffix(line, ": CONNECTED"), strings.HasSuffix(line, ": PRESENT"), strings.HasSuffix(line, ": READ"),
			strings.HasSuffix(line, ": LISTED"), strings.HasSuffix(line, ": SECRETS"):
			t.Errorf("the agent reached what it must not: %s", line)
		case strings.HasPrefix(line, "socket "):
			// Its own: the worker's token and hook sockets in its private /tmp, and the
			// host services of its org.
			s := strings.TrimPrefix(line, "socket ")
			if !strings.HasPrefix(s, "/tmp/") && !strings.HasPrefix(s, "/run/hermes-host/") {
				t.Errorf("the agent found a socket that is not its own: %s", s)
			}
		case strings.HasPrefix(line, "loopback "):
			// The forwarders on its loopback lead to its org's services, which ask for a
			// key it was not given (the control API's) or its own (the gateway's).
			if strings.Contains(line, `"jobs"`) || strings.Contains(line, "200 OK") {
				t.Errorf("a loopback port answered without a key: %s", line)
			}
		}
	}
	for _, want := range []string{"postgres 127.0.0.1:" + ports.pg + ": refused", "launcher 127.0.0.1:" + ports.launcher + ": refused",
		"control 127.0.0.1:" + ports.control + ": refused", "backend 127.0.0.1:" + ports.backend + ": refused",
		"wide 127.0.0.1:" + ports.wide + ": refused", "other-home: unreadable", "socket /run/hermes-host/control.sock"} {
		if !strings.Contains(log, want) {
			t.Errorf("reached.log lacks %q", want)
		}
	}
}
