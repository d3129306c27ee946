package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"hermeshost/service"
)

// Config is what a gateway Server needs.
type Config struct {
	// UpstreamURL is the OpenAI-compatible base URL, such as https://api.example.com/v1.
	// The gateway calls nothing else: only this base plus /models, /chat/completions or
	// /embeddings, whatever a request's path, Host header or request line says.
	UpstreamURL string
	// Login authenticates upstream with the one OAuth login; APIKey with a static key.
	// With neither, no Authorization goes upstream (the demo upstream needs none).
	Login  *Login
	APIKey service.Secret
	// Secret derives the per-org keys (OrgKey); HostKey is the host's own internal key.
	Secret  service.Secret
	HostKey service.Secret
	// Per caller: requests per second, burst, and requests in flight at once.
	OrgRPS         float64
	OrgBurst       int
	OrgConcurrency int
	// MaxRequestBytes bounds a request body.
	MaxRequestBytes int64
	Ops             *service.Ops
	// HTTP is the upstream client; nil means one with a connection pool sized for many
	// orgs. Redirects are never followed, whichever client is given.
	HTTP *http.Client
	// Now is the clock of the rate limits; nil means time.Now.
	Now func() time.Time
}

// Server is the gateway's HTTP side: key checks, per-org limits and the forwarding of
// the three OpenAI endpoints to the one upstream.
type Server struct {
	upstream *url.URL
	auth     upstreamAuth
	keys     keyring
	limits   *orgLimits
	maxBody  int64
	ops      *service.Ops
	client   *http.Client
	metrics  *proxyMetrics
	now      func() time.Time
}

// upstreamAuth supplies the upstream's Authorization.
type upstreamAuth interface {
	token(ctx context.Context) (string, error)
	// rejected is told that the upstream refused token with 401, and answers the one
	// token to retry with, or retry=false when nothing new can be had.
	rejected(ctx context.Context, token string) (next string, retry bool, err error)
}

type staticKey service.Secret

func (k staticKey) token(context.Context) (string, error) { return service.Secret(k).Reveal(), nil }
func (k staticKey) rejected(context.Context, string) (string, bool, error) {
	return "", false, nil
}

// New checks cfg and builds a Server.
func New(cfg Config) (*Server, error) {
	u, err := url.Parse(cfg.UpstreamURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("gateway: upstream %q is not an absolute http(s) base URL without query or user info", redactURL(cfg.UpstreamURL))
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	if cfg.Login != nil && cfg.APIKey != "" {
		return nil, errors.New("gateway: configure the upstream with either the OAuth login or an API key, not both")
	}
	if cfg.Secret == "" && cfg.HostKey == "" {
		return nil, errors.New("gateway: neither a gateway secret nor a host key is set, so no key could ever be accepted")
	}
	if cfg.Ops == nil {
		return nil, errors.New("gateway: no service.Ops")
	}
	if cfg.OrgRPS <= 0 || cfg.OrgBurst < 1 || cfg.OrgConcurrency < 1 || cfg.MaxRequestBytes < 1 {
		return nil, errors.New("gateway: rate, burst, concurrency and body limits must all be positive")
	}
	s := &Server{
		upstream: u,
		keys:     keyring{secret: cfg.Secret.Reveal(), internal: cfg.HostKey.Reveal()},
		limits:   newOrgLimits(cfg.OrgRPS, cfg.OrgBurst, cfg.OrgConcurrency),
		maxBody:  cfg.MaxRequestBytes,
		ops:      cfg.Ops,
		metrics:  newProxyMetrics(cfg.Ops.Registry),
		now:      cfg.Now,
	}
	switch {
	case cfg.Login != nil:
		s.auth = cfg.Login
		cfg.Ops.Health.Probe("auth_file", cfg.Login.CheckFile)
	case cfg.APIKey != "":
		s.auth = staticKey(cfg.APIKey)
	}
	if s.now == nil {
		s.now = time.Now
	}
	client := http.Client{Transport: upstreamTransport()}
	if cfg.HTTP != nil {
		client = *cfg.HTTP
	}
	// A redirect could point anywhere; the gateway only ever calls its upstream.
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	s.client = &client
	return s, nil
}

// upstreamTransport keeps enough idle connections for many orgs' concurrent requests and
// bounds the wait for response headers (a stream's body may then run as long as it needs).
func upstreamTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 256
	t.MaxIdleConnsPerHost = 128
	t.ResponseHeaderTimeout = 10 * time.Minute
	return t
}

// Handler is the gateway's route table: the ops routes and the three OpenAI endpoints.
func (s *Server) Handler() http.Handler {
	r := s.ops.Router()
	r.Get("/v1/models", s.forward("models", "/models"))
	r.Post("/v1/chat/completions", s.forward("chat_completions", "/chat/completions"))
	r.Post("/v1/embeddings", s.forward("embeddings", "/embeddings"))
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeOpenAIError(w, http.StatusNotFound, "invalid_request_error", "not_found",
			"the gateway serves only GET /v1/models, POST /v1/chat/completions and POST /v1/embeddings")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeOpenAIError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
			"the gateway serves only GET /v1/models, POST /v1/chat/completions and POST /v1/embeddings")
	})
	return r
}

// The only request headers that go upstream; everything else (the client's Authorization,
// cookies, hop-by-hop headers, client fingerprints) stays here.
var forwardedRequestHeaders = []string{"Accept"}

// The only upstream response headers that reach the client.
var forwardedResponseHeaders = []string{"Content-Type", "Cache-Control", "Retry-After", "X-Request-Id"}

// forward serves one endpoint by sending the request to the fixed upstreamPath.
func (s *Server) forward(endpoint, upstreamPath string) http.HandlerFunc {
	target := s.upstream.JoinPath(upstreamPath).String()
	return func(w http.ResponseWriter, r *http.Request) {
		outcome, caller := s.serve(w, r, endpoint, target)
		s.metrics.requests.WithLabelValues(caller, endpoint, outcome).Inc()
	}
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, endpoint, target string) (outcome, caller string) {
	caller, err := s.keys.caller(r.Header.Get("Authorization"))
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="hermes-host gateway"`)
		writeOpenAIError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key",
			"a valid gateway key is required as Authorization: Bearer <key>")
		return outcomeUnauthorized, unauthenticated
	}
	release, refused := s.limits.admit(caller, s.now())
	if refused != nil {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds(refused.retryAfter)))
		code := "rate_limit_exceeded"
		if refused.outcome == outcomeBusy {
			code = "concurrency_limit_exceeded"
		}
		writeOpenAIError(w, http.StatusTooManyRequests, "rate_limit_error", code, refused.message)
		return refused.outcome, caller
	}
	defer release()

	var body []byte
	if r.Method == http.MethodPost {
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			writeOpenAIError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
				fmt.Sprintf("the request body is larger than the gateway's limit of %d bytes", s.maxBody))
			return outcomeTooLarge, caller
		case err != nil:
			return outcomeClientGone, caller
		}
	}

	// The body is read; a model may take minutes to answer, streamed or not.
	service.LongAnswer(w)
	resp, outcome := s.roundTrip(w, r, endpoint, target, body)
	if resp == nil {
		return outcome, caller
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized && s.auth != nil {
		// Passed through, a 401 would tell the client its gateway key is wrong; it is the
		// gateway's own upstream credential that was refused, even after a refresh.
		s.ops.Log.Error("gateway: the upstream refused the gateway's credential", "endpoint", endpoint, "org", caller)
		writeOpenAIError(w, http.StatusBadGateway, "upstream_error", "upstream_unauthorized",
			"the upstream refused the gateway's credential; its /healthz and logs say more")
		return outcomeUpstreamUnauthorized, caller
	}
	for _, h := range forwardedResponseHeaders {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		err = copyFlushing(w, resp.Body)
	} else {
		_, err = io.Copy(w, resp.Body)
	}
	switch {
	case err != nil && r.Context().Err() != nil:
		return outcomeClientGone, caller
	case err != nil:
		s.ops.Log.Warn("gateway: upstream response cut off", "endpoint", endpoint, "org", caller, "err", err)
		return outcomeUpstreamUnreachable, caller
	case resp.StatusCode >= 400:
		return outcomeUpstreamStatus, caller
	}
	return outcomeOK, caller
}

// roundTrip sends the request upstream, refreshing the login and retrying once if the
// upstream refuses the access token. On failure it has answered the client itself and
// returns a nil response.
func (s *Server) roundTrip(w http.ResponseWriter, r *http.Request, endpoint, target string, body []byte) (*http.Response, string) {
	ctx := r.Context()
	token := ""
	if s.auth != nil {
		var err error
		if token, err = s.auth.token(ctx); err != nil {
			return nil, s.loginFailed(ctx, w, endpoint, err)
		}
	}
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, r.Method, target, bytes.NewReader(body))
		if err != nil {
			writeOpenAIError(w, http.StatusInternalServerError, "server_error", "internal", "could not build the upstream request")
			return nil, outcomeUpstreamUnreachable
		}
		for _, h := range forwardedRequestHeaders {
			if v := r.Header.Get(h); v != "" {
				req.Header.Set(h, v)
			}
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("User-Agent", "hermes-host-gateway")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		start := time.Now()
		resp, err := s.client.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, outcomeClientGone
			}
			s.ops.Log.Warn("gateway: upstream unreachable", "endpoint", endpoint, "err", err)
			writeOpenAIError(w, http.StatusBadGateway, "upstream_error", "upstream_unreachable", "the gateway could not reach its upstream")
			return nil, outcomeUpstreamUnreachable
		}
		s.metrics.upstream.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
		if resp.StatusCode != http.StatusUnauthorized || s.auth == nil || attempt > 0 {
			return resp, ""
		}
		next, retry, err := s.auth.rejected(ctx, token)
		if err != nil {
			resp.Body.Close()
			return nil, s.loginFailed(ctx, w, endpoint, err)
		}
		if !retry {
			return resp, ""
		}
		resp.Body.Close()
		token = next
	}
}

func (s *Server) loginFailed(ctx context.Context, w http.ResponseWriter, endpoint string, err error) string {
	if ctx.Err() != nil {
		return outcomeClientGone
	}
	s.ops.Log.Error("gateway: no usable upstream login", "endpoint", endpoint, "err", err)
	writeOpenAIError(w, http.StatusBadGateway, "upstream_error", "upstream_login_failed",
		"the gateway's upstream login is unusable; its /healthz says why")
	return outcomeLoginFailed
}

// copyFlushing passes a server-sent event stream through as it arrives: each read from
// upstream is written and flushed at once, so no chunk waits for the next.
func copyFlushing(w http.ResponseWriter, body io.Reader) error {
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if ferr := rc.Flush(); ferr != nil {
				return ferr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
