package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"hermeshost/assertion"
	"hermeshost/dashboards"
	"hermeshost/handlers"
	"hermeshost/internal/unitnet"
	"hermeshost/operator"
	"hermeshost/orgid"
	"hermeshost/service"
	"hermeshost/static"
	"hermeshost/templates"
)

// dashboardProxy serves /orgs/{org}/... by proxying to that org's dashboard, after the
// login check: the grant is checked on every request, the operator's cookies and
// Authorization never leave the launcher, and the dashboard is told who is asking by a
// short-lived assertion only it can verify. A dashboard that is not running is asked for
// (the dispatcher owning the org starts it) and the operator sees it starting.
type dashboardProxy struct {
	dashboards *dashboards.Store
	operators  *operator.Store
	signer     *assertion.Signer
	pages      handlers.Pages
	log        *slog.Logger
	proxy      *httputil.ReverseProxy
	// unavailable, when set, says why this launcher opens no dashboards.
	unavailable string

	mu   sync.Mutex
	seen map[string]time.Time // when each org's use was last written
}

// seenEvery bounds how often a dashboard's use is written: the idle timeout is minutes.
const seenEvery = 30 * time.Second

// proxiedTypes are the responses a dashboard may send through the proxy. Its pages share
// the launcher's origin, so nothing that could run there as script or style comes from a
// dashboard: those are served by the launcher itself, from its own files.
var proxiedTypes = map[string]bool{"text/html": true, "text/event-stream": true, "application/json": true, "text/plain": true}

type targetKey struct{}

func newDashboardProxy(store *dashboards.Store, ops *operator.Store, signer *assertion.Signer, pages handlers.Pages, unavailable string) *dashboardProxy {
	p := &dashboardProxy{dashboards: store, operators: ops, signer: signer, pages: pages, log: pages.Log, unavailable: unavailable, seen: map[string]time.Time{}}
	dialer := &net.Dialer{Timeout: 2 * time.Second}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if t, ok := ctx.Value(targetKey{}).(proxyTarget); ok && t.socket != "" {
				ctx, cancel := context.WithTimeout(ctx, dialer.Timeout)
				defer cancel()
				return unitnet.Dial(ctx, t.socket)
			}
			return dialer.DialContext(ctx, network, addr)
		},
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
	}
	p.proxy = &httputil.ReverseProxy{
		Transport: transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(targetKey{}).(proxyTarget)
			pr.SetURL(t.url)
			// SetURL joins the paths; the dashboard serves under the same /orgs/<org> prefix.
			pr.Out.URL.Path, pr.Out.URL.RawPath = pr.In.URL.Path, pr.In.URL.RawPath
			pr.Out.Host = t.url.Host
			// What is the operator's stays here; only the assertion vouches for them.
			pr.Out.Header.Del("Cookie")
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("Proxy-Authorization")
			pr.Out.Header.Set(assertion.Header, t.assertion)
		},
		ModifyResponse: func(resp *http.Response) error {
			// A dashboard sets no cookie on the launcher's origin (it could replace the
			// operator's login), and its answers carry the launcher's own policy.
			resp.Header.Del("Set-Cookie")
			if ct := resp.Header.Get("Content-Type"); ct != "" && resp.StatusCode != http.StatusNoContent {
				mt, _, err := mime.ParseMediaType(ct)
				if err != nil || !proxiedTypes[mt] {
					return errBadType
				}
			}
			setSecurityHeaders(resp.Header, resp.Request.URL.Path)
			return nil
		},
		ErrorHandler: p.proxyError,
	}
	return p
}

var errBadType = errors.New("the dashboard answered with a content type the launcher does not pass on")

type proxyTarget struct {
	org       string
	url       *url.URL
	socket    string // the dashboard's unix socket, when it serves on one
	assertion string
}

// ServeHTTP is every /orgs/{org}/... request but the static files.
func (p *dashboardProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	org := chi.URLParam(r, "org")
	op := handlers.OperatorFrom(r.Context())
	if !p.allowed(w, r, op.Name, org) {
		return
	}
	if other := refererOrg(r); other != "" && other != org {
		// A page of one org's dashboard asking for another's: the operator may hold both
		// grants, but one dashboard's page never acts on another org.
		p.log.Warn("launcher: a dashboard page asked for another org's dashboard", "from", other, "to", org, "operator", op.Name)
		p.pages.Error(w, r, http.StatusForbidden, "A page of one organization's dashboard cannot reach another's.")
		return
	}
	view := templates.DashboardStateView{Operator: op.Name, Org: org}
	if p.dashboards == nil {
		view.Unavailable = p.unavailable
		p.state(w, r, http.StatusServiceUnavailable, view)
		return
	}
	d, err := p.dashboards.Get(r.Context(), org)
	if errors.Is(err, dashboards.ErrNotFound) || err == nil && d.State == dashboards.Stopped {
		d, err = p.dashboards.Request(r.Context(), org, op.Name)
	}
	if err != nil {
		p.failed(w, r, err)
		return
	}
	switch d.State {
	case dashboards.Running:
	case dashboards.Failed:
		view.Failed = d.Error
		p.state(w, r, http.StatusServiceUnavailable, view)
		return
	default:
		view.Starting = true
		p.state(w, r, http.StatusServiceUnavailable, view)
		return
	}
	var target *url.URL
	socket, isSocket := unitnet.SocketPath(d.URL)
	if isSocket {
		// A dashboard off the host's network serves on a socket; the host part names
		// the org, so that pooled connections are never another dashboard's.
		target = &url.URL{Scheme: "http", Host: "dashboard-" + org + ".unix"}
	} else if target, err = url.Parse(d.URL); err != nil || target.Scheme != "http" || target.Host == "" {
		p.failed(w, r, errors.New("the dashboard's recorded address is neither an http URL nor a unix socket"))
		return
	}
	tok, err := p.signer.Sign(op.Name, org)
	if err != nil {
		p.failed(w, r, err)
		return
	}
	p.markSeen(r.Context(), org)
	ctx := context.WithValue(r.Context(), targetKey{}, proxyTarget{org: org, url: target, socket: socket, assertion: tok})
	if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		// A stream lasts as long as the page: it ends when the launcher shuts down, so
		// that draining waits only for requests that end by themselves.
		service.LongAnswer(w)
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-service.ShuttingDown(ctx):
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	unitnet.FullDuplex(p.proxy).ServeHTTP(w, r.WithContext(ctx))
}

// refererOrg is the org whose dashboard page made the request, from Referer (sent in full
// for same-origin requests under the launcher's Referrer-Policy), or "".
func refererOrg(r *http.Request) string {
	ref := r.Header.Get("Referer")
	if ref == "" {
		return ""
	}
	u, err := url.Parse(ref)
	if err != nil || u.Host != r.Host {
		return ""
	}
	rest, ok := strings.CutPrefix(u.Path, "/orgs/")
	if !ok {
		return ""
	}
	org, _, _ := strings.Cut(rest, "/")
	return org
}

// proxyError answers a request the dashboard did not: one that cannot be reached any more
// is asked for again (its owner starts it anew) and the operator sees it starting.
func (p *dashboardProxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	t := r.Context().Value(targetKey{}).(proxyTarget)
	if errors.Is(err, errBadType) {
		p.log.Warn("launcher: dropped a dashboard answer", "org", t.org, "path", r.URL.Path, "err", err)
		p.pages.Error(w, r, http.StatusBadGateway, "The dashboard's answer was not passed on; the reason is in the launcher's log.")
		return
	}
	if r.Context().Err() != nil {
		return // the operator went away
	}
	p.log.Warn("launcher: dashboard unreachable; asking for it again", "org", t.org, "url", t.url.String(), "err", err)
	if uerr := p.dashboards.Unreachable(context.WithoutCancel(r.Context()), t.org, t.url.String()); uerr != nil {
		p.failed(w, r, uerr)
		return
	}
	op := handlers.OperatorFrom(r.Context())
	p.state(w, r, http.StatusServiceUnavailable, templates.DashboardStateView{Operator: op.Name, Org: t.org, Starting: true})
}

func (p *dashboardProxy) markSeen(ctx context.Context, org string) {
	now := time.Now()
	p.mu.Lock()
	due := now.Sub(p.seen[org]) >= seenEvery
	if due {
		p.seen[org] = now
	}
	p.mu.Unlock()
	if due {
		if err := p.dashboards.Seen(ctx, org); err != nil {
			p.log.Warn("launcher: record a dashboard's use", "org", org, "err", err)
		}
	}
}

// state shows the dashboard's state; an htmx request reloads the page instead, so that a
// fragment is never replaced by a whole page.
func (p *dashboardProxy) state(w http.ResponseWriter, r *http.Request, status int, v templates.DashboardStateView) {
	w.Header().Set("Retry-After", "1")
	if r.Header.Get("HX-Request") == "true" {
		w.Header().Set("HX-Refresh", "true")
		w.WriteHeader(status)
		return
	}
	p.pages.Render(w, r, status, templates.DashboardState(v))
}

func (p *dashboardProxy) failed(w http.ResponseWriter, r *http.Request, err error) {
	p.pages.Failed(w, r, fmt.Errorf("dashboard of %s: %w", chi.URLParam(r, "org"), err))
}

// allowed checks the org id and the operator's grant; a refusal has been answered.
func (p *dashboardProxy) allowed(w http.ResponseWriter, r *http.Request, name, org string) bool {
	if !orgid.Valid(org) {
		p.pages.NotFound(w, r, "There is no organization of that name.")
		return false
	}
	ok, err := p.operators.Allowed(r.Context(), name, org)
	switch {
	case err != nil:
		p.failed(w, r, err)
		return false
	case !ok:
		p.pages.Error(w, r, http.StatusForbidden, "You have no grant for this organization; an administrator grants it with hermes-host operator grant.")
		return false
	}
	return true
}

// open is POST /open/{org}: try a failed dashboard again.
func (p *dashboardProxy) open(w http.ResponseWriter, r *http.Request) {
	org := chi.URLParam(r, "org")
	op := handlers.OperatorFrom(r.Context())
	if !p.allowed(w, r, op.Name, org) {
		return
	}
	if p.dashboards != nil {
		if _, err := p.dashboards.Request(r.Context(), org, op.Name); err != nil {
			p.failed(w, r, err)
			return
		}
	}
	handlers.Redirect(w, r, "/orgs/"+org+"/")
}

// static serves /orgs/{org}/static/*: a dashboard's scripts and styles come from the
// launcher's own files, never through the proxy.
func (p *dashboardProxy) static(w http.ResponseWriter, r *http.Request) {
	r2 := r.Clone(r.Context())
	r2.URL.Path = "/" + chi.URLParam(r, "*")
	r2.URL.RawPath = ""
	static.Handler().ServeHTTP(w, r2)
}
