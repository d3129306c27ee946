// Package unitnet is how an org's units, which are not on the host's network, reach the
// few host services they may use: through unix sockets in a folder of the org's own that the
// runtime mounts into them (the host side, Sockets), and, inside a unit, through a forwarder
// on the unit's own loopback for a client that needs TCP (Resolve).
//
// A service reached through a socket is named by a URL of the form unix:/path/to/name.sock.
package unitnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Dir is where a unit sees its org's sockets.
const Dir = "/run/hermes-host"

// DashboardDir is where a dashboard unit makes the socket it serves on.
const DashboardDir = "/run/hermes-dashboard"

// GatewayAddr is the loopback address inside a unit at which the gateway's socket is
// forwarded for the agent: Hermes reads its model endpoint from config.yaml, so the address
// is the same in every unit (each has its own loopback) and across runs.
const GatewayAddr = "127.0.0.1:7101"

// EgressAddr is the loopback address inside a unit at which the egress proxy's socket is
// forwarded: the agent's HTTPS_PROXY and HTTP_PROXY.
const EgressAddr = "127.0.0.1:7102"

type orgKey struct{}

// OrgOf is the org whose socket a request came in on (Sockets), or "".
func OrgOf(r *http.Request) string {
	org, _ := r.Context().Value(orgKey{}).(string)
	return org
}

// maxSocketPath is the longest path a unix socket can be bound or reached at on Linux;
// a longer one is reached through its folder's descriptor.
const maxSocketPath = 107

// SocketPath is the socket a unix: URL names.
func SocketPath(raw string) (string, bool) {
	p, ok := strings.CutPrefix(raw, "unix:")
	if !ok || !filepath.IsAbs(p) {
		return "", false
	}
	return filepath.Clean(p), true
}

// URL names the socket at path.
func URL(path string) string { return "unix:" + path }

// reachable is a path to the same socket as path that fits a socket address: path itself,
// or for a longer one its name under /proc/self/fd/N, N an O_PATH descriptor of its
// folder, which done closes.
func reachable(path string) (short string, done func(), err error) {
	if len(path) <= maxSocketPath {
		return path, func() {}, nil
	}
	if len(filepath.Base(path)) > maxSocketPath-32 {
		return "", nil, fmt.Errorf("socket name %s is too long", filepath.Base(path))
	}
	fd, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, &os.PathError{Op: "open", Path: filepath.Dir(path), Err: err}
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", fd, filepath.Base(path)), func() { unix.Close(fd) }, nil
}

// Dial connects to the socket at path, however long the path.
func Dial(ctx context.Context, path string) (net.Conn, error) {
	short, done, err := reachable(path)
	if err != nil {
		return nil, err
	}
	defer done()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", short)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", path, err)
	}
	return c, nil
}

// listener keeps the descriptor its long path goes through until it closes (which
// removes the socket through it).
type listener struct {
	net.Listener
	path string
	done func()

	once sync.Once
	err  error
}

func (l *listener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

// Close closes once: a second close must neither close a descriptor number reused since
// nor remove a socket made anew at the path.
func (l *listener) Close() error {
	l.once.Do(func() {
		l.err = l.Listener.Close()
		l.done()
	})
	return l.err
}

// Listen makes a socket at path, replacing one a dead process left there (a file that is
// not a socket is an error), readable and writable by all who can reach its folder.
func Listen(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen on %s: a file that is not a socket is there", path)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := Dial(ctx, path)
		cancel()
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("listen on %s: another process serves it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen on %s: remove the dead socket: %w", path, err)
		}
	}
	short, done, err := reachable(path)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", short)
	if err != nil {
		done()
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// The folder decides who reaches it: the org's own, mounted into its units only.
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		done()
		return nil, err
	}
	return &listener{Listener: ln, path: path, done: done}, nil
}

// Sockets serves host services to org units: for each org it is asked for, a folder under
// its root holding one socket per service.
type Sockets struct {
	root     string
	services map[string]http.Handler
	log      *slog.Logger

	mu     sync.Mutex
	orgs   map[string][]served
	closed bool
}

// served is one socket and its server.
type served struct {
	srv *http.Server
	ln  net.Listener
}

// stop closes the listener itself, at once: a server whose Serve has not begun yet does
// not know it, and would close it (removing the socket at its path) whenever Serve did
// begin, by then perhaps a socket Ensure made anew there.
func (v served) stop() {
	v.ln.Close()
	v.srv.Close()
}

// Proxy is a handler passing every request on to base (an http(s) URL), streaming answers
// as they come: a unit's requests to a service on another address.
func Proxy(base string) (http.Handler, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("unit proxy: %q is not an http(s) URL", base)
	}
	return FullDuplex(&httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = u.Host
			// Nothing a unit says about where it comes from is passed on.
			pr.Out.Header.Del("Forwarded")
			for k := range pr.Out.Header {
				if strings.HasPrefix(k, "X-Forwarded-") {
					pr.Out.Header.Del(k)
				}
			}
		},
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(slog.Default().Handler(), slog.LevelWarn),
	}), nil
}

// FullDuplex serves a reverse proxy with the request's body readable while the answer is
// written (HTTP/1 full duplex). Without it, the server consumes and closes whatever body is
// left when the answer's header goes out, while the proxy's transport may still be reading
// that body to send it on: a read on the closed body fails the transport's write, which
// drops its upstream connection in the middle of the answer (seen as a model stream cut a
// moment after it began), or the two readers split the body between them.
//
// The transport may also go on reading (or closing, which reads the rest) after the proxy
// has answered and returned, when the server reads the connection again for the next
// request: net/http panics on two readers ("invalid concurrent Body.Read call"). So the
// body is handed to the proxy behind a guard that refuses reads once the handler has
// returned, and a read still in flight then is ended (the connection's read deadline set to
// now) and waited for, and the body is closed before the handler returns.
func FullDuplex(rp http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		if r.Body == nil || r.Body == http.NoBody {
			rp.ServeHTTP(w, r)
			return
		}
		g := &guardedBody{body: r.Body}
		g.idle = sync.NewCond(&g.mu)
		r.Body = g
		defer func() {
			g.mu.Lock()
			g.done = true
			if g.reading > 0 {
				// The transport's read waits for the client: end it now.
				_ = rc.SetReadDeadline(time.Now())
				for g.reading > 0 {
					g.idle.Wait()
				}
			}
			g.mu.Unlock()
			// The server itself would close (drain) the body after the handler, and the
			// drain reaching its end starts the server's read of the next request after
			// it stopped such reads, so its own next read panics (go.dev/issue/68560):
			// drained here, the read it starts is stopped in time. The answer goes out first:
			// the client may send the rest of its body only once it has it.
			_ = rc.Flush()
			_ = g.body.Close()
		}()
		rp.ServeHTTP(w, r)
	})
}

// guardedBody is a request body that the proxy's transport reads through until its handler
// returns (done), and never after. Close does not touch the body: the server closes it
// itself once the handler has returned.
type guardedBody struct {
	body    io.ReadCloser
	mu      sync.Mutex
	idle    *sync.Cond
	reading int
	done    bool
}

var errHandlerReturned = errors.New("unitnet: the request is over")

func (g *guardedBody) Read(p []byte) (int, error) {
	g.mu.Lock()
	if g.done {
		g.mu.Unlock()
		return 0, errHandlerReturned
	}
	g.reading++
	g.mu.Unlock()
	n, err := g.body.Read(p)
	g.mu.Lock()
	g.reading--
	if g.reading == 0 {
		g.idle.Broadcast()
	}
	g.mu.Unlock()
	return n, err
}

func (g *guardedBody) Close() error { return nil }

// NewSockets serves services (by name: the socket is <name>.sock) in <root>/<org>/.
func NewSockets(root string, services map[string]http.Handler, log *slog.Logger) (*Sockets, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	for name := range services {
		if name == "" || len(name) > 32 || strings.ContainsAny(name, "/.") {
			return nil, fmt.Errorf("unit sockets: bad service name %q", name)
		}
	}
	if log == nil {
		log = slog.Default()
	}
	return &Sockets{root: root, services: services, log: log, orgs: map[string][]served{}}, nil
}

// Dir is org's folder of sockets on the host.
func (s *Sockets) Dir(org string) string { return filepath.Join(s.root, org) }

// Services are the names served.
func (s *Sockets) Services() []string {
	names := make([]string, 0, len(s.services))
	for name := range s.services {
		names = append(names, name)
	}
	return names
}

// Ensure serves org's sockets unless they are served already, and returns their folder.
// The folder is made (0755: a unit's uid must reach the sockets, and only the org's units
// see it) and every socket in it is made anew, so that one a dead process left is replaced.
func (s *Sockets) Ensure(org string) (string, error) {
	dir := s.Dir(org)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", errors.New("unit sockets closed")
	}
	if servers, ok := s.orgs[org]; ok && s.alive(dir, servers) {
		return dir, nil
	} else if ok {
		for _, v := range servers {
			v.stop()
		}
		delete(s.orgs, org)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("unit sockets of %s: %w", org, err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", fmt.Errorf("unit sockets of %s: %w", org, err)
	}
	var servers []served
	for name, h := range s.services {
		ln, err := Listen(filepath.Join(dir, name+".sock"))
		if err != nil {
			for _, v := range servers {
				v.stop()
			}
			return "", fmt.Errorf("unit sockets of %s: %w", org, err)
		}
		srv := &http.Server{
			Handler:           h,
			BaseContext:       func(net.Listener) context.Context { return context.WithValue(context.Background(), orgKey{}, org) },
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Warn("unit socket stopped", "org", org, "service", name, "err", err)
			}
		}()
		servers = append(servers, served{srv: srv, ln: ln})
	}
	s.orgs[org] = servers
	s.log.Debug("unit sockets served", "org", org, "dir", dir)
	return dir, nil
}

// alive says whether every socket of the folder is still there (a restart of the unit's
// host folder, or an operator's cleanup, may have removed them).
func (s *Sockets) alive(dir string, servers []served) bool {
	if len(servers) != len(s.services) {
		return false
	}
	for name := range s.services {
		if fi, err := os.Lstat(filepath.Join(dir, name+".sock")); err != nil || fi.Mode()&os.ModeSocket == 0 {
			return false
		}
	}
	return true
}

// Close stops serving every socket; in-flight requests are cut.
func (s *Sockets) Close() error {
	s.mu.Lock()
	s.closed = true
	all := s.orgs
	s.orgs = map[string][]served{}
	s.mu.Unlock()
	for _, servers := range all {
		for _, v := range servers {
			v.stop()
		}
	}
	return nil
}

// forward listens on addr (a loopback address; port 0 picks one) and splices every
// connection to the socket at path, until ctx ends. It returns the http URL it serves.
func forward(ctx context.Context, addr, path string, log *slog.Logger) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("forward %s to %s: %w", addr, path, err)
	}
	if log == nil {
		log = slog.Default()
	}
	var wg sync.WaitGroup
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
					log.Warn("loopback forwarder stopped", "addr", addr, "err", err)
				}
				wg.Wait()
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				splice(ctx, c, path, log)
			}()
		}
	}()
	return "http://" + ln.Addr().String(), nil
}

func splice(ctx context.Context, c net.Conn, path string, log *slog.Logger) {
	defer c.Close()
	up, err := Dial(ctx, path)
	if err != nil {
		log.Warn("loopback forwarder: the host's socket does not answer", "socket", path, "err", err)
		return
	}
	defer up.Close()
	stop := context.AfterFunc(ctx, func() { c.Close(); up.Close() })
	defer stop()
	Join(c, c, up)
}

// Join copies what comes from the client (read from fromClient: c itself, or a reader
// holding what was read of c already) to up and up's answers to c, each direction closed
// for writing when its source ends, until both have ended.
func Join(c net.Conn, fromClient io.Reader, up net.Conn) {
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, fromClient); closeWrite(up); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
	<-done
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// Resolve gives a client in a unit an http(s) URL for raw: raw itself when it is one, or
// for a unix: URL the address of a forwarder on loopback (addr, or a free port when addr is
// empty) that lives until ctx ends.
func Resolve(ctx context.Context, raw, addr string, log *slog.Logger) (string, error) {
	path, ok := SocketPath(raw)
	if !ok {
		return raw, nil
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	return forward(ctx, addr, path, log)
}

// HTTPClient is an http.Client whose connections go to the socket at path, whatever host a
// request names: for the host's own requests to a unit serving on a socket.
func HTTPClient(path string, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return Dial(ctx, path)
		},
	}}
}
