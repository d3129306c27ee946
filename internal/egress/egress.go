// Package egress is the public internet for org units that are off the host's network
// (DESIGN section 9: "and, where jobs need it, the public internet"): an HTTP proxy,
// served on each org's egress.sock like the units' other host services, that takes
// CONNECT host:port (TLS, whatever the client) and absolute-form http:// requests, and
// connects only to public addresses on the web's ports (80 and 443), plus whatever
// addresses the operator allows. Never loopback, private networks, link-local (the cloud
// metadata address), shared address space, multicast, reserved or unspecified addresses,
// nor any address of the host's own interfaces (a host service bound to every address
// would answer there). A name is resolved once and the connection made to the address
// that passed, so a DNS answer that changes between the check and the dial (rebinding)
// reaches nothing new.
package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/internal/unitnet"
)

// Ports are the ports a public address may be reached on.
var Ports = []uint16{80, 443}

// Config is a Proxy's policy and plumbing.
type Config struct {
	// Allow are addresses reachable besides public ones, on any port: the operator's
	// internal services a job needs (UNIT_EGRESS_ALLOW).
	Allow []netip.Prefix
	// Resolver resolves names (default net.DefaultResolver).
	Resolver *net.Resolver
	// MaxConnsPerOrg bounds the connections one org has open through the proxy at once
	// (UNIT_EGRESS_CONNS, default 64): one more is refused with 429, so a runaway or
	// hostile agent cannot take the host's sockets from every other org.
	MaxConnsPerOrg int
	// DialTimeout bounds a connection's set-up (default 10 s).
	DialTimeout time.Duration
	// OrgOf names the org a request came from, for the log (default: none).
	OrgOf func(*http.Request) string
	Log   *slog.Logger
	// Registerer takes hermes_egress_connections_total{result} (nil: unregistered).
	Registerer prometheus.Registerer
}

// Proxy is the egress proxy's handler.
type Proxy struct {
	cfg       Config
	dialer    net.Dialer
	transport *http.Transport
	conns     *prometheus.CounterVec

	mu        sync.Mutex
	own       []netip.Addr // the host's interface addresses
	ownLoaded time.Time
	open      map[string]int // connections open now, by org
}

// New makes a Proxy.
func New(cfg Config) *Proxy {
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.MaxConnsPerOrg <= 0 {
		cfg.MaxConnsPerOrg = 64
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.OrgOf == nil {
		cfg.OrgOf = func(*http.Request) string { return "" }
	}
	p := &Proxy{cfg: cfg, dialer: net.Dialer{Timeout: cfg.DialTimeout}, open: make(map[string]int)}
	p.conns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hermes_egress_connections_total",
		Help: "Connections org units asked the egress proxy for, by result (allowed, refused: not a public address on 80 or 443 nor an allowed one; failed: allowed, but it did not connect; limited: the org had UNIT_EGRESS_CONNS open already).",
	}, []string{"result"})
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(p.conns)
	}
	p.transport = &http.Transport{
		Proxy:                 nil, // never another proxy: the address checked is the one dialled
		DialContext:           p.dial,
		MaxIdleConns:          64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 2 * time.Minute,
		DisableCompression:    true, // the client's Accept-Encoding goes through as it is
	}
	return p
}

// Refused says why a destination is not reachable.
type Refused struct {
	Host   string
	Addr   netip.Addr
	Reason string
}

func (r *Refused) Error() string {
	if r.Addr.IsValid() && r.Host != r.Addr.String() {
		return fmt.Sprintf("egress to %s (%s) refused: %s", r.Host, r.Addr, r.Reason)
	}
	return fmt.Sprintf("egress to %s refused: %s", r.Host, r.Reason)
}

// specialRanges are addresses that are neither loopback, private nor link-local by
// netip's tests and still not the public internet.
var specialRanges = func() []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8",       // this network
		"100.64.0.0/10",   // shared address space (carrier-grade NAT)
		"192.0.0.0/24",    // IETF protocol assignments
		"192.0.2.0/24",    // documentation
		"198.18.0.0/15",   // benchmarking
		"198.51.100.0/24", // documentation
		"203.0.113.0/24",  // documentation
		"240.0.0.0/4",     // reserved, and the broadcast address
		"64:ff9b::/96",    // NAT64: an IPv4 address of any kind behind it
		"64:ff9b:1::/48",  // local NAT64
		"100::/64",        // discard
		"2001:db8::/32",   // documentation
		"2002::/16",       // 6to4: an IPv4 address of any kind behind it
	} {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}()

// classify says why addr is not public, or "" when it is.
func classify(addr netip.Addr) string {
	addr = addr.Unmap()
	switch {
	case addr.IsLoopback():
		return "a loopback address"
	case addr.IsPrivate():
		return "a private address"
	case addr.IsLinkLocalUnicast():
		return "a link-local address (cloud metadata lives there)"
	case addr.IsUnspecified():
		return "the unspecified address"
	case addr.IsMulticast() || addr.IsLinkLocalMulticast() || addr.IsInterfaceLocalMulticast():
		return "a multicast address"
	}
	for _, p := range specialRanges {
		if p.Contains(addr) {
			return "a reserved address (" + p.String() + ")"
		}
	}
	return ""
}

// ownAddrs are the host's interface addresses, looked at again every minute.
func (p *Proxy) ownAddrs() []netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.ownLoaded) < time.Minute {
		return p.own
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		p.cfg.Log.Warn("egress: the host's addresses", "err", err)
		return p.own
	}
	var own []netip.Addr
	for _, a := range addrs {
		if pfx, err := netip.ParsePrefix(a.String()); err == nil {
			own = append(own, pfx.Addr().Unmap())
		}
	}
	p.own, p.ownLoaded = own, time.Now()
	return own
}

// check is nil when addr:port may be reached.
func (p *Proxy) check(host string, addr netip.Addr, port uint16) error {
	addr = addr.Unmap()
	for _, a := range p.cfg.Allow {
		if a.Contains(addr) {
			return nil
		}
	}
	if why := classify(addr); why != "" {
		return &Refused{Host: host, Addr: addr, Reason: why}
	}
	for _, own := range p.ownAddrs() {
		if own == addr {
			return &Refused{Host: host, Addr: addr, Reason: "an address of the host itself"}
		}
	}
	for _, allowed := range Ports {
		if port == allowed {
			return nil
		}
	}
	return &Refused{Host: host, Addr: addr, Reason: "port " + strconv.Itoa(int(port)) + " is not 80 or 443"}
}

// Vet resolves hostport and returns the first of its addresses that may be reached, or
// why none may.
func (p *Proxy) Vet(ctx context.Context, hostport string) (netip.AddrPort, error) {
	host, portText, err := net.SplitHostPort(hostport)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("egress: %q is not host:port", hostport)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		return netip.AddrPort{}, fmt.Errorf("egress: %q has no port", hostport)
	}
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")); err == nil {
		if ip.Zone() != "" {
			return netip.AddrPort{}, &Refused{Host: host, Reason: "an address with a zone"}
		}
		addrs = []netip.Addr{ip}
	} else {
		if addrs, err = p.cfg.Resolver.LookupNetIP(ctx, "ip", host); err != nil {
			return netip.AddrPort{}, fmt.Errorf("egress: resolve %s: %w", host, err)
		}
	}
	var first error
	for _, a := range addrs {
		err := p.check(host, a, uint16(port))
		if err == nil {
			return netip.AddrPortFrom(a.Unmap(), uint16(port)), nil
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		first = fmt.Errorf("egress: %s has no address", host)
	}
	return netip.AddrPort{}, first
}

// dial connects to addr (host:port) once it is vetted: the address checked is the one
// dialled.
func (p *Proxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	to, err := p.Vet(ctx, addr)
	if err != nil {
		return nil, err
	}
	return p.dialer.DialContext(ctx, "tcp", to.String())
}

// ServeHTTP serves CONNECT and absolute-form http:// requests; anything else is 400. An
// org with MaxConnsPerOrg open already is refused with 429.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	org := p.cfg.OrgOf(r)
	if !p.take(org) {
		p.conns.WithLabelValues("limited").Inc()
		p.cfg.Log.Warn("egress refused: too many connections", "org", org, "destination", r.Host, "max", p.cfg.MaxConnsPerOrg)
		http.Error(w, fmt.Sprintf("egress: this org has %d connections open, the most it may (UNIT_EGRESS_CONNS)", p.cfg.MaxConnsPerOrg), http.StatusTooManyRequests)
		return
	}
	defer p.give(org)
	switch {
	case r.Method == http.MethodConnect:
		p.connect(w, r)
	case r.URL.IsAbs() && r.URL.Scheme == "http" && r.URL.Host != "":
		p.forward(w, r)
	default:
		http.Error(w, "this is the unit's egress proxy: CONNECT host:443, or send an absolute http:// URL", http.StatusBadRequest)
	}
}

// take counts a connection of org's in, unless it has MaxConnsPerOrg open already.
func (p *Proxy) take(org string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open[org] >= p.cfg.MaxConnsPerOrg {
		return false
	}
	p.open[org]++
	return true
}

// give counts a connection of org's out.
func (p *Proxy) give(org string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open[org]--; p.open[org] <= 0 {
		delete(p.open, org)
	}
}

// refuse answers a destination that may not be reached (403) or did not connect (502),
// and says so in the log.
func (p *Proxy) refuse(w http.ResponseWriter, r *http.Request, dest string, err error) {
	var refused *Refused
	if errors.As(err, &refused) {
		p.conns.WithLabelValues("refused").Inc()
		p.cfg.Log.Warn("egress refused", "org", p.cfg.OrgOf(r), "destination", dest, "reason", err.Error())
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	p.conns.WithLabelValues("failed").Inc()
	p.cfg.Log.Info("egress failed", "org", p.cfg.OrgOf(r), "destination", dest, "err", err.Error())
	http.Error(w, "egress to "+dest+" failed: "+err.Error(), http.StatusBadGateway)
}

func (p *Proxy) connect(w http.ResponseWriter, r *http.Request) {
	dest := r.Host
	if !strings.Contains(dest, ":") {
		dest += ":443"
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.DialTimeout)
	up, err := p.dial(ctx, "tcp", dest)
	cancel()
	if err != nil {
		p.refuse(w, r, dest, err)
		return
	}
	defer up.Close()
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "egress: the connection cannot be taken over", http.StatusInternalServerError)
		return
	}
	c, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	p.conns.WithLabelValues("allowed").Inc()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// What the client sent after its CONNECT (a TLS hello already) is in buf.
	unitnet.Join(c, buf, up)
}

// hopHeaders are a proxy's own, never passed on.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func (p *Proxy) forward(w http.ResponseWriter, r *http.Request) {
	out := r.Clone(r.Context())
	out.RequestURI = ""
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	dest := r.URL.Host
	if r.URL.Port() == "" {
		dest += ":80"
	}
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		p.refuse(w, r, dest, err)
		return
	}
	defer resp.Body.Close()
	p.conns.WithLabelValues("allowed").Inc()
	for _, h := range hopHeaders {
		resp.Header.Del(h)
	}
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// Close drops the idle connections of forwarded requests.
func (p *Proxy) Close() { p.transport.CloseIdleConnections() }
