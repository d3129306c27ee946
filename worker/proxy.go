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
	"time"

	"hermeshost/service"
)

// TokenProxy serves the Sartiq API on a unix socket inside the job workspace and adds the
// job token to every request, so the agent's `sartiq` reaches the API while the token is
// never in the agent's environment, arguments or files. The backend's allowlist still
// decides what the token may do; the proxy only carries it.
type TokenProxy struct {
	path string
	ln   net.Listener
	srv  *http.Server
	done chan struct{}
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
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("token proxy: clear %s: %w", socket, err)
	}
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("token proxy: listen on %s: %w", socket, err)
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("token proxy: %w", err)
	}
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
			req := resp.Request
			switch {
			case req.Method == http.MethodPut && guidelinesPath.MatchString(req.URL.Path):
				accepted(Accepted{Operation: "proposeGuidelines", Category: guidelinesPath.FindStringSubmatch(req.URL.Path)[1]})
			case req.Method == http.MethodPost && productsPath.MatchString(req.URL.Path):
				accepted(Accepted{Operation: "proposeProducts"})
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Warn("token proxy: backend unreachable", "path", r.URL.Path, "err", err)
			service.WriteError(w, http.StatusBadGateway, "backend_unreachable", "the Sartiq API could not be reached")
		},
	}
	p := &TokenProxy{path: socket, ln: ln, done: make(chan struct{}),
		srv: &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		defer close(p.done)
		_ = p.srv.Serve(ln)
	}()
	return p, nil
}

// Path is the socket's path, for the agent's SARTIQ_PROXY_SOCKET.
func (p *TokenProxy) Path() string { return p.path }

// Close stops the proxy and removes the socket: once the agent is done, nothing can use
// the token through it.
func (p *TokenProxy) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := p.srv.Shutdown(ctx)
	<-p.done
	_ = os.Remove(p.path)
	return err
}
