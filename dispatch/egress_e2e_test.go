package dispatch_test

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"hermeshost/dispatch/runtime"
	"hermeshost/internal/egress"
	"hermeshost/internal/unitnet"
	"hermeshost/sartiq"
)

// With UNIT_EGRESS=public an org's agent, off the host's network, reaches the internet
// through the egress proxy on its org's socket (HTTPS_PROXY and HTTP_PROXY in its
// environment) and nothing private: not the cloud metadata address, not a private network.
// The stand-in for "the internet" is a server of the test's on the host's own address,
// which the proxy is told to allow as an operator allows an internal service
// (UNIT_EGRESS_ALLOW): this machine reaches no public address.

// hostAddr is an address of the host's own, not loopback, where the test's servers
// listen; the test skips without one.
func hostAddr(t *testing.T) netip.Addr {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() {
			return p.Addr()
		}
	}
	t.Skip("no address but loopback: nothing a unit could be proxied to")
	return netip.Addr{}
}

// internetStandIn serves "hello from <path>" over http and https at the host's address.
func internetStandIn(t *testing.T, addr netip.Addr) (plain, tls string) {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s", r.URL.Path) })
	var urls [2]string
	for i := range urls {
		ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}
		if i == 0 {
			srv.Start()
		} else {
			srv.StartTLS()
		}
		t.Cleanup(srv.Close)
		urls[i] = srv.URL
	}
	return urls[0], urls[1]
}

func egressFixture(t *testing.T) (*fixture, string, string) {
	t.Helper()
	f := newFixture(t, true)
	addr := hostAddr(t)
	plain, tls := internetStandIn(t, addr)
	f.egress = egress.New(egress.Config{Allow: []netip.Prefix{netip.PrefixFrom(addr, 32)}, OrgOf: unitnet.OrgOf, Log: f.cfg.Log})
	t.Cleanup(f.egress.Close)
	f.cfg.ClaimEnabled = true
	return f, plain, tls
}

// checkEgress checks what acme's agent noted in egress.log, once per run, and the log.
func checkEgress(t *testing.T, f *fixture, want []string) {
	t.Helper()
	settle(t, f, 3*time.Minute)
	if st := f.jobsOf(t, "acme"); st[sartiq.StatusCompleted] != 2 {
		t.Errorf("acme's jobs: %v, want both completed", st)
	}
	raw, err := os.ReadFile(filepath.Join(f.cfg.OrgsRoot, "acme", "egress.log"))
	if err != nil {
		t.Fatalf("acme's agent noted nothing: %v\n%s", err, f.logs.String())
	}
	got := string(raw)
	for _, w := range want {
		if strings.Count(got, w+"\n") != 2 {
			t.Errorf("egress.log lacks %q once per run:\n%s", w, got)
		}
	}
	logs := f.logs.String()
	for _, dest := range []string{"169.254.169.254:80", "10.255.255.1:80"} {
		if !strings.Contains(logs, `"msg":"egress refused","org":"acme","destination":"`+dest+`"`) {
			t.Errorf("the refusal of %s is not logged with its org:\n%s", dest, logs)
		}
	}
}

func TestSandboxedAgentReachesTheInternetOnlyThroughTheEgressProxy(t *testing.T) {
	f, plain, tls := egressFixture(t)
	useSandboxedLimits(t, f, runtime.Limits{})
	agent := hostileAgent(t, `python3 - "`+plain+`" "`+tls+`" >>"$HERMES_HOME/egress.log" 2>&1 <<'PY'
import os, ssl, sys, urllib.request
print("proxy", os.environ.get("HTTPS_PROXY"))
for url in [sys.argv[1] + "/plain", sys.argv[2] + "/tls", "http://169.254.169.254/latest/meta-data/", "http://10.255.255.1/"]:
    try:
        body = urllib.request.urlopen(url, timeout=20, context=ssl._create_unverified_context()).read().decode()
        print(url, "->", body)
    except Exception as e:
        print(url, "->", getattr(e, "code", type(e).__name__))
PY
exec scripted-agent "$@"`)
	f.cfg.WorkerEnv = append(f.cfg.WorkerEnv, "HERMES_BIN="+agent)
	checkEgress(t, f, []string{
		"proxy http://" + unitnet.EgressAddr,
		plain + "/plain -> hello from /plain",
		tls + "/tls -> hello from /tls",
		"http://169.254.169.254/latest/meta-data/ -> 403",
		"http://10.255.255.1/ -> 403",
	})
}

// In a FROM scratch unit the stand-in's client is busybox's nc (its wget, statically
// linked against glibc, cannot resolve even a numeric address there), speaking HTTP/1.0 to
// the proxy as $http_proxy names it.
func TestDockerAgentReachesTheInternetOnlyThroughTheEgressProxy(t *testing.T) {
	f, plain, _ := egressFixture(t)
	useDockerWith(t, f, dockerOptions{shell: true})
	dockerHostile(t, f, `log=/home/hermes/egress.log
echo "proxy $http_proxy" >>$log
for url in `+plain+`/plain http://169.254.169.254/latest/meta-data/ http://10.255.255.1/; do
	# The request's writer stays open until the answer is in: a client that closes its half
	# of the connection is one that went away, and its request is cancelled.
	(printf 'GET %s HTTP/1.0\r\n\r\n' "$url"; sleep 2) | nc ${http_proxy#http://} >/tmp/answer 2>&1
	echo "$url -> $(head -n 1 /tmp/answer | tr -d '\r') $(tail -n 1 /tmp/answer)" >>$log
done
exec scripted-agent "$@"`)
	checkEgress(t, f, []string{
		"proxy http://" + unitnet.EgressAddr,
		plain + "/plain -> HTTP/1.0 200 OK hello from /plain",
		"http://169.254.169.254/latest/meta-data/ -> HTTP/1.0 403 Forbidden egress to 169.254.169.254 refused: a link-local address (cloud metadata lives there)",
		"http://10.255.255.1/ -> HTTP/1.0 403 Forbidden egress to 10.255.255.1 refused: a private address",
	})
}
