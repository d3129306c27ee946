package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"hermeshost/internal/unitnet"
	"hermeshost/service"
)

// TokenProxy serves the Sartiq API on a unix socket inside the job workspace and adds the
// job token to every request, so the agent's `sartiq` reaches the API while the token is
// never in the agent's environment, arguments or files. The backend's allowlist still
// decides what the token may do; the proxy only carries it.
type TokenProxy struct {
	*socketServer
}

// Accepted is one write the backend accepted through the proxy, as the worker's checkpoint
// records it.
type Accepted struct {
	Operation string // proposeGuidelines or proposeProducts
	Category  string // proposeGuidelines only
}

var guidelinesPath = regexp.MustCompile(`^/organizations/[a-z0-9][a-z0-9-]{0,62}/guidelines/([a-z0-9][a-z0-9-]{0,62})/proposal$`)
var productsPath = regexp.MustCompile(`^/organizations/[a-z0-9][a-z0-9-]{0,62}/product-proposals$`)

// StartTokenProxy listens on socket (created 0600; an old socket file is replaced) and
// forwards to api. accepted, if set, hears of every write surface call the backend
// answered with 2xx.
func StartTokenProxy(socket string, api *url.URL, token service.Secret, log *slog.Logger, accepted func(Accepted)) (*TokenProxy, error) {
	base := strings.TrimSuffix(api.Path, "/")
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(api)
			pr.Out.Header.Del("Cookie")
			pr.Out.Header.Set("Authorization", "Bearer "+token.Reveal())
		},
		ModifyResponse: func(resp *http.Response) error {
			if accepted == nil || resp.StatusCode < 200 || resp.StatusCode > 299 {
				return nil
			}
			// The request as it went out: below the API's base path (SARTIQ_API_URL may be
			// https://host/api), which the surface paths do not include.
			req := resp.Request
			path, ok := strings.CutPrefix(req.URL.Path, base)
			if !ok {
				return nil
			}
			switch {
			case req.Method == http.MethodPut && guidelinesPath.MatchString(path):
				accepted(Accepted{Operation: "proposeGuidelines", Category: guidelinesPath.FindStringSubmatch(path)[1]})
			case req.Method == http.MethodPost && productsPath.MatchString(path):
				accepted(Accepted{Operation: "proposeProducts"})
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Warn("token proxy: backend unreachable", "path", r.URL.Path, "err", err)
			service.WriteError(w, http.StatusBadGateway, "backend_unreachable", "the Sartiq API could not be reached")
		},
	}
	srv, err := serveSocket(socket, "token proxy", unitnet.FullDuplex(rp))
	if err != nil {
		return nil, err
	}
	// Its Path is the agent's SARTIQ_PROXY_SOCKET; once Close has removed the socket, after
	// the agent is done, nothing can use the token through it.
	return &TokenProxy{srv}, nil
}

// socketServer is an HTTP server on a unix socket of the worker's, for the agent.
type socketServer struct {
	path string
	srv  *http.Server
	done chan struct{}
}

// serveSocket serves h on socket (0600; an old socket file is replaced). A request's body
// must arrive within 30 s and an idle connection is closed after 2 minutes; no write
// timeout: a hook's mailbox drain may wait (the control API bounds it).
func serveSocket(socket, what string, h http.Handler) (*socketServer, error) {
	ln, err := listenSocket(socket, what)
	if err != nil {
		return nil, err
	}
	s := &socketServer{path: socket, done: make(chan struct{}), srv: &http.Server{
		Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
	}}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// Path is the socket's path.
func (s *socketServer) Path() string { return s.path }

// Close stops the server and removes the socket.
func (s *socketServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	<-s.done
	_ = os.Remove(s.path)
	return err
}

// listenSocket listens on a unix socket only its owner may use (0600), replacing an old
// socket file left there; what names the listener in errors.
func listenSocket(socket, what string) (net.Listener, error) {
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: clear %s: %w", what, socket, err)
	}
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("%s: listen on %s: %w", what, socket, err)
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return ln, nil
}
