// Package sartiq is the Go client of the Sartiq agent-jobs API (BACKEND_API.md) and the
// API's wire types, which the reference backend (sartiq/backend) answers with too.
//
// A Client presents one credential: the bot token (the dispatcher: list, claim, re-claim)
// or one job token (a worker: its job's endpoints, reads in its org, presign, its write
// surface). A client made with NewUnix talks to the worker's local proxy over a unix
// socket and presents none: the proxy adds the job token. No token appears in an error.
//
// Retries: requests that are safe to repeat (reads, heartbeats, the idempotent start and
// proposal writes, presign) are retried with backoff on 5xx and network errors; never on
// 4xx. Requests that are not (claim, re-claim, events, complete, fail, release, upload)
// are retried only when the server never saw them: the connection could not even be made,
// or the server closed it idle as the request was given it. A claim whose response is
// lost may have succeeded with a token nobody holds: the caller logs it and moves on; no
// heartbeat comes, so after STALE_AFTER the job is stale and the normal recovery
// re-claims it (revoking the lost token).
package sartiq

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"hermeshost/service"
)

// Retry is how a Client repeats requests that failed on the way or with a 5xx.
type Retry struct {
	// Attempts is the total number of tries, at least 1.
	Attempts int
	// Base is the first backoff; each later one doubles, up to Max, with full jitter.
	Base, Max time.Duration
}

// DefaultRetry gives a request four tries over about two seconds.
var DefaultRetry = Retry{Attempts: 4, Base: 200 * time.Millisecond, Max: 2 * time.Second}

// maxResponseBytes bounds what the client reads of any answer.
const maxResponseBytes = 16 << 20

// Client calls the API with one credential.
type Client struct {
	base   *url.URL
	token  service.Secret
	http   *http.Client
	retry  Retry
	socket bool
}

// Option adjusts a Client.
type Option func(*Client)

// WithHTTPClient uses hc (its transport and timeout) instead of a default client.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.http = hc } }

// WithRetry replaces DefaultRetry.
func WithRetry(r Retry) Option { return func(c *Client) { c.retry = r } }

// New is a client of the API at baseURL (http or https) presenting token, which may be
// empty for the unauthenticated operations.
func New(baseURL, token string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("sartiq client: %q is not an absolute http or https URL", baseURL)
	}
	c := &Client{base: u, token: service.Secret(token), http: &http.Client{Timeout: 60 * time.Second}, retry: DefaultRetry}
	for _, o := range opts {
		o(c)
	}
	if c.retry.Attempts < 1 {
		c.retry.Attempts = 1
	}
	return c, nil
}

// NewUnix is a client of the worker's local proxy listening on the unix socket at path.
// It presents no token: the proxy adds the job token on the way.
func NewUnix(path string, opts ...Option) (*Client, error) {
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
	hc := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DialContext: dial}}
	c, err := New("http://sartiq-proxy", "", append([]Option{WithHTTPClient(hc)}, opts...)...)
	if err != nil {
		return nil, err
	}
	c.socket = true
	return c, nil
}

// BaseURL is where the client sends requests.
func (c *Client) BaseURL() string { return c.base.String() }

// APIError is an answer other than 2xx: the operation, the status and the server's
// {error, message}.
type APIError struct {
	Op      string
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	code := e.Code
	if code == "" {
		code = strings.ToLower(strings.ReplaceAll(http.StatusText(e.Status), " ", "_"))
	}
	return fmt.Sprintf("%s: %d %s: %s", e.Op, e.Status, code, msg)
}

func statusIs(err error, status int) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == status
}

// IsConflict: 409, e.g. the job was claimed by someone else, is not stale, or the token
// was revoked.
func IsConflict(err error) bool { return statusIs(err, http.StatusConflict) }

// IsNotFound: 404.
func IsNotFound(err error) bool { return statusIs(err, http.StatusNotFound) }

// IsForbidden: 403, the token may not do this.
func IsForbidden(err error) bool { return statusIs(err, http.StatusForbidden) }

// IsUnauthorized: 401, a missing, unknown or expired token.
func IsUnauthorized(err error) bool { return statusIs(err, http.StatusUnauthorized) }

// IsTokenRevoked: the job token was superseded or its job ended; the worker must stop.
func IsTokenRevoked(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == "token_revoked"
}

// IsTransient: the call may go through if made again: the server answered 5xx or 429, or
// did not answer (the connection failed or broke). A terminal call (complete, fail,
// release) may be made again after one: the first that lands revokes the job token, so
// none is applied twice; a repeat refused as token_revoked leaves open whether the first
// landed, which the job's event log says.
func IsTransient(err error) bool {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status >= 500 || ae.Status == http.StatusTooManyRequests
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ne net.Error // a *url.Error is one too
	return errors.As(err, &ne)
}

// repeat says when a request may be sent again.
type repeat bool

const (
	// idempotent requests are retried on 5xx and network errors.
	idempotent repeat = true
	// once requests are retried only when they were never sent (closedBeforeSent too).
	once repeat = false
)

// request is one API call.
type request struct {
	op     string
	method string
	path   string // below the base URL, already escaped
	query  url.Values
	body   []byte
	ctype  string
	repeat repeat
	// target, when set, is an absolute URL that is not the API's: sent without a token.
	target string
}

// send performs r with retries and returns the 2xx body.
func (c *Client) send(ctx context.Context, r request) ([]byte, error) {
	var lastErr error
	for attempt := range c.retry.Attempts {
		if attempt > 0 {
			if err := c.backoff(ctx, attempt); err != nil {
				return nil, fmt.Errorf("%s: %w (after %v)", r.op, err, lastErr)
			}
		}
		body, retry, err := c.try(ctx, r)
		if err == nil {
			return body, nil
		}
		lastErr = err
		if !retry || ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

func (c *Client) backoff(ctx context.Context, attempt int) error {
	d := c.retry.Base << (attempt - 1)
	if d > c.retry.Max || d <= 0 {
		d = c.retry.Max
	}
	if d > 0 {
		d = time.Duration(rand.Int64N(int64(d))) + 1
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// try sends r once; retry says whether another try is allowed.
func (c *Client) try(ctx context.Context, r request) (body []byte, retry bool, err error) {
	target := r.target
	if target == "" {
		u := *c.base
		plain, err := url.PathUnescape(r.path)
		if err != nil {
			return nil, false, fmt.Errorf("%s: bad path %q", r.op, r.path)
		}
		u.Path = c.base.Path + plain
		u.RawPath = c.base.EscapedPath() + r.path
		u.RawQuery = r.query.Encode()
		target = u.String()
	}
	var rd io.Reader
	if r.body != nil {
		rd = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, target, rd)
	if err != nil {
		return nil, false, fmt.Errorf("%s: build request: %w", r.op, err)
	}
	if r.body != nil {
		req.Header.Set("Content-Type", r.ctype)
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" && r.target == "" {
		req.Header.Set("Authorization", "Bearer "+c.token.Reveal())
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var op *net.OpError
		neverSent := errors.As(err, &op) && op.Op == "dial" || closedBeforeSent(err)
		return nil, bool(r.repeat) || neverSent, fmt.Errorf("%s: %w", r.op, err)
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return nil, bool(r.repeat), fmt.Errorf("%s: read response: %w", r.op, err)
	}
	if resp.StatusCode/100 == 2 {
		return body, false, nil
	}
	ae := &APIError{Op: r.op, Status: resp.StatusCode}
	var eb ErrorBody
	if json.Unmarshal(body, &eb) == nil {
		ae.Code, ae.Message = eb.Error, eb.Message
	}
	return nil, bool(r.repeat) && resp.StatusCode >= 500, ae
}

// closedBeforeSent: net/http's errServerClosedIdle, unexported, so matched by text. The
// transport saw the server close a kept-alive connection with no request on it, as ours
// was being handed it, and closed it before ours could go out: the server never saw ours,
// but net/http retries it itself only when idempotent.
func closedBeforeSent(err error) bool {
	var ue *url.Error
	return errors.As(err, &ue) && ue.Err != nil && ue.Err.Error() == "http: server closed idle connection"
}

// call sends a JSON request and decodes a JSON answer into out (when non-nil).
func (c *Client) call(ctx context.Context, op, method, path string, rep repeat, in, out any) error {
	r := request{op: op, method: method, path: path, repeat: rep}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s: encode request: %w", op, err)
		}
		r.body, r.ctype = b, "application/json"
	}
	return c.decode(ctx, r, out)
}

func (c *Client) decode(ctx context.Context, r request, out any) error {
	body, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%s: decode response: %w", r.op, err)
	}
	return nil
}

// Call sends any operation as given, for callers that build requests themselves (the
// sartiq CLI, from the OpenAPI document): path is below the base URL and already escaped,
// body is JSON or nil. GET and PUT requests are treated as idempotent, others are not.
func (c *Client) Call(ctx context.Context, op, method, path string, query url.Values, body []byte) ([]byte, error) {
	r := request{op: op, method: method, path: path, query: query, repeat: method == http.MethodGet || method == http.MethodPut}
	if body != nil {
		r.body, r.ctype = body, "application/json"
	}
	return c.send(ctx, r)
}
