package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestOnlyPublicAddressesOnTheWebsPortsOrAllowedOnes(t *testing.T) {
	p := New(Config{Allow: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}})
	var own string
	for _, a := range p.ownAddrs() {
		if !a.IsLoopback() {
			own = a.String()
			break
		}
	}
	cases := map[string]string{ // destination: "" when reachable, else a word of the reason
		"93.184.216.34:443":        "",
		"93.184.216.34:80":         "",
		"[2606:2800:220:1::1]:443": "",
		"93.184.216.34:22":         "port 22",
		"127.0.0.1:443":            "loopback",
		"[::1]:443":                "loopback",
		"[::ffff:127.0.0.1]:443":   "loopback",
		"10.0.0.1:443":             "private",
		"172.17.0.1:80":            "private",
		"192.168.1.1:443":          "private",
		"[fd00::1]:443":            "private",
		"169.254.169.254:80":       "link-local",
		"[fe80::1]:443":            "link-local",
		"100.100.100.200:80":       "reserved",
		"0.0.0.0:80":               "unspecified",
		"224.0.0.1:80":             "multicast",
		"[64:ff9b::7f00:1]:443":    "reserved",
		"[2002:7f00:1::1]:443":     "reserved",
		"255.255.255.255:80":       "reserved",
		"10.9.1.2:5432":            "", // allowed, on any port
		"localhost:443":            "loopback",
		"no-port.example":          "not host:port",
		"93.184.216.34:0":          "no port",
		"[fe80::1%25eth0]:443":     "zone",
	}
	if own != "" {
		// The host's own address: refused as the host's when public, else for its kind.
		cases[net.JoinHostPort(own, "443")] = "address"
		if classify(netip.MustParseAddr(own)) == "" {
			cases[net.JoinHostPort(own, "443")] = "the host itself"
		}
	}
	for dest, want := range cases {
		_, err := p.Vet(context.Background(), dest)
		switch {
		case want == "" && err != nil:
			t.Errorf("%s refused: %v", dest, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: %v, want refused for %q", dest, err, want)
		}
	}
}

// proxied serves a Proxy allowing 127.0.0.1 (the test's own servers) or nothing.
func proxied(t *testing.T, allowLoopback bool) (*httptest.Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := Config{Registerer: reg}
	if allowLoopback {
		cfg.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	}
	p := New(cfg)
	t.Cleanup(p.Close)
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv, reg
}

// echoTarget is a TCP server on loopback that answers each line with "echo " and the
// line; with once, it closes the connection after the first.
func echoTarget(t *testing.T, once bool) net.Listener {
	t.Helper()
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close() })
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					fmt.Fprintf(c, "echo %s", line)
					if once {
						return
					}
				}
			}()
		}
	}()
	return target
}

func TestConnectSplicesToAnAllowedAddressAndRefusesOthers(t *testing.T) {
	target := echoTarget(t, true)
	for _, allow := range []bool{true, false} {
		srv, reg := proxied(t, allow)
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		// The CONNECT and the first bytes in one write, as a TLS client sends them.
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\nhello\n", target.Addr(), target.Addr())
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		if !allow {
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "loopback") {
				t.Errorf("CONNECT to loopback: %d %s", resp.StatusCode, body)
			}
			if n := count(reg, "refused"); n != 1 {
				t.Errorf("refused = %v", n)
			}
			c.Close()
			continue
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT: %d", resp.StatusCode)
		}
		got, _ := io.ReadAll(br)
		c.Close()
		if string(got) != "echo hello\n" {
			t.Errorf("through the tunnel: %q", got)
		}
		if n := count(reg, "allowed"); n != 1 {
			t.Errorf("allowed = %v", n)
		}
	}
}

// count is hermes_egress_connections_total{result} in reg.
func count(reg *prometheus.Registry, result string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "hermes_egress_connections_total" && m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func TestPlainHTTPIsForwardedWithoutTheProxysHeaders(t *testing.T) {
	var seen http.Header
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r.Header.Clone()
		w.Header().Set("X-Answer", "yes")
		fmt.Fprintf(w, "path %s", r.URL.RequestURI())
	}))
	defer target.Close()
	srv, _ := proxied(t, true)
	proxyURL, _ := url.Parse(srv.URL)
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}
	req, _ := http.NewRequest(http.MethodGet, target.URL+"/a?b=c", nil)
	req.Header.Set("Proxy-Authorization", "Basic c2VjcmV0")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "path /a?b=c" || resp.Header.Get("X-Answer") != "yes" {
		t.Fatalf("forwarded: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if seen.Get("Proxy-Authorization") != "" {
		t.Error("the proxy's own header reached the destination")
	}

	denied, _ := proxied(t, false)
	proxyURL, _ = url.Parse(denied.URL)
	client = &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}
	resp, err = client.Get(target.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "loopback") {
		t.Fatalf("plain http to loopback: %d %q", resp.StatusCode, body)
	}
	// Not a proxy request at all.
	resp, err = http.Get(denied.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("an origin-form request: %d", resp.StatusCode)
	}
}

func TestRefusedIsAnError(t *testing.T) {
	p := New(Config{})
	_, err := p.Vet(context.Background(), "169.254.169.254:80")
	var r *Refused
	if !errors.As(err, &r) || r.Addr != netip.MustParseAddr("169.254.169.254") {
		t.Fatalf("%v", err)
	}
}

func TestAnOrgPastItsConnectionCapIsRefusedAndOthersAreNot(t *testing.T) {
	// Held open until the client closes, echoing each line.
	target := echoTarget(t, false)
	reg := prometheus.NewRegistry()
	p := New(Config{Registerer: reg, MaxConnsPerOrg: 2,
		Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		// The unit's socket names the org in the product; here the request says it.
		OrgOf: func(r *http.Request) string { return r.Header.Get("X-Test-Org") }})
	t.Cleanup(p.Close)
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)

	// tunnel opens a CONNECT for org and, when it is established, checks it carries bytes.
	tunnel := func(org string) (net.Conn, int) {
		t.Helper()
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nX-Test-Org: %s\r\n\r\n", target.Addr(), target.Addr(), org)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(resp.Body)
			c.Close()
			if resp.StatusCode == http.StatusTooManyRequests && !strings.Contains(string(body), "UNIT_EGRESS_CONNS") {
				t.Errorf("429 without the setting's name: %q", body)
			}
			return nil, resp.StatusCode
		}
		fmt.Fprintf(c, "ping %s\n", org)
		if line, err := br.ReadString('\n'); err != nil || line != "echo ping "+org+"\n" {
			t.Fatalf("through %s's tunnel: %q %v", org, line, err)
		}
		return c, resp.StatusCode
	}
	a1, _ := tunnel("acme")
	a2, _ := tunnel("acme")
	defer a2.Close()
	if _, code := tunnel("acme"); code != http.StatusTooManyRequests {
		t.Fatalf("acme's third connection: %d, want 429", code)
	}
	if n := count(reg, "limited"); n != 1 {
		t.Errorf("limited = %v, want 1", n)
	}
	b1, code := tunnel("globex")
	if code != http.StatusOK {
		t.Fatalf("globex, under its own cap: %d", code)
	}
	defer b1.Close()
	// Closing one of acme's gives its slot back once the proxy has seen the close.
	a1.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, code := tunnel("acme")
		if code == http.StatusOK {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("acme after closing a tunnel: still %d", code)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := count(reg, "allowed"); n < 4 {
		t.Errorf("allowed = %v, want at least 4", n)
	}
}
