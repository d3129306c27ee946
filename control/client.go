package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"hermeshost/subagent"
)

// maxResponse bounds what the client reads of one response (a job with MaxJobEvents large
// events is the biggest).
const maxResponse = 32 << 20

// Client calls the control API with one org's key.
type Client struct {
	base string
	key  string
	hc   *http.Client
}

// NewClient is a client of the API at baseURL (http or https, no credentials in it) that
// presents key; hc nil is http.DefaultClient. Neither the key nor anything derived from it
// ever appears in an error.
func NewClient(baseURL, key string, hc *http.Client) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, errors.New("control client: the base URL must be http(s)://host[:port][/path], without credentials, query or fragment")
	}
	if !strings.HasPrefix(key, keyPrefix) || strings.ContainsFunc(key, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return nil, errors.New("control client: the key is not a control key (hck_<org>_...)")
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{base: strings.TrimSuffix(u.String(), "/"), key: key, hc: hc}, nil
}

// APIError is an answer of the API other than success.
type APIError struct {
	Op      string // jobs, job, acquire, refresh, release, holder, leases, or a subagent call
	Status  int
	Code    string // the API's error code (CodeHeld, CodeLost, ...)
	Message string
	// HeldBy is, when Code is CodeHeld, the holding in the way (its Holder, Epoch and
	// ExpiresAt; Key is the caller's).
	HeldBy *Lease
}

func (e *APIError) Error() string {
	return fmt.Sprintf("control %s: %d %s: %s", e.Op, e.Status, e.Code, e.Message)
}

func apiError(err error) *APIError {
	var e *APIError
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// IsHeld reports whether err is an acquire refused because someone else holds the key.
func IsHeld(err error) bool { e := apiError(err); return e != nil && e.Code == CodeHeld }

// IsLost reports whether err is a refresh or release refused because the holding is no
// longer the caller's: it expired and was taken, or was released by force. Work under the
// lease must stop.
func IsLost(err error) bool { e := apiError(err); return e != nil && e.Code == CodeLost }

// IsForbidden reports whether err is a key outside the caller's org (home:<other org>,
// org:<id>).
func IsForbidden(err error) bool {
	e := apiError(err)
	return e != nil && e.Status == http.StatusForbidden
}

// IsNotFound reports whether err is an unknown job or lease (or another org's: the API
// does not tell them apart).
func IsNotFound(err error) bool {
	e := apiError(err)
	return e != nil && e.Status == http.StatusNotFound
}

// Jobs is one page of the org's jobs, newest first; limit 0 is the server's default and
// cursor "" the first page.
func (c *Client) Jobs(ctx context.Context, limit int, cursor string) (JobsPage, error) {
	q := url.Values{}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	var page JobsPage
	err := c.do(ctx, "jobs", http.MethodGet, "/v1/jobs", q, nil, &page)
	return page, err
}

// Job is one of the org's jobs with its newest events (as many as the server shows).
func (c *Client) Job(ctx context.Context, id string) (JobDetail, error) { return c.job(ctx, id, nil) }

// JobNewest is Job with only its newest events (at most n, from 1 to MaxJobEvents): what a
// view of the job's state now needs (its newest progress and outcome), not its history.
func (c *Client) JobNewest(ctx context.Context, id string, n int) (JobDetail, error) {
	return c.job(ctx, id, url.Values{"events": {strconv.Itoa(n)}})
}

func (c *Client) job(ctx context.Context, id string, q url.Values) (JobDetail, error) {
	var d JobDetail
	if id == "" {
		return d, errors.New("control job: empty job id")
	}
	err := c.do(ctx, "job", http.MethodGet, "/v1/jobs/"+url.PathEscape(id), q, nil, &d)
	return d, err
}

// JobEvents is the org's job events with an id above after, oldest first (a page of at most
// MaxFeedEvents), waiting up to wait (rounded up to milliseconds; at most the server's
// maximum) while there are none. Pass the answer's Last as the next after to resume.
func (c *Client) JobEvents(ctx context.Context, after int64, wait time.Duration) (JobEventFeed, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if wait > 0 {
		q.Set("wait_ms", strconv.FormatInt(ceilMillis(wait), 10))
	}
	var feed JobEventFeed
	err := c.do(ctx, "job events", http.MethodGet, "/v1/jobs/events", q, nil, &feed)
	return feed, err
}

// LeaseChanges are the org's lease events after id after, waiting up to wait for one.
func (c *Client) LeaseChanges(ctx context.Context, after int64, wait time.Duration) (LeaseChanges, error) {
	q := url.Values{"after": {strconv.FormatInt(max(after, 0), 10)}}
	if wait > 0 {
		q.Set("wait_ms", strconv.FormatInt(ceilMillis(wait), 10))
	}
	var ch LeaseChanges
	err := c.do(ctx, "lease changes", http.MethodGet, "/v1/leases/changes", q, nil, &ch)
	return ch, err
}

// LeaseHead is the newest lease event id there is: a watcher of LeaseChanges starts after it.
func (c *Client) LeaseHead(ctx context.Context) (int64, error) {
	var ch LeaseChanges
	err := c.do(ctx, "lease changes", http.MethodGet, "/v1/leases/changes", nil, nil, &ch)
	return ch.Last, err
}

// Acquire takes key (home:<own org> or session:<id>) for holder for ttl. With wait 0 it
// tries once; otherwise it waits up to wait (at most the server's maximum) for the key to
// come free. A key still held is an error for which IsHeld is true. Durations are sent in
// whole milliseconds, rounded up.
func (c *Client) Acquire(ctx context.Context, key, holder string, ttl, wait time.Duration) (Lease, error) {
	var l Lease
	err := c.do(ctx, "acquire", http.MethodPost, "/v1/leases/acquire", nil,
		acquireRequest{Key: key, Holder: holder, TTLMS: ceilMillis(ttl), WaitMS: ceilMillis(wait)}, &l)
	if e := apiError(err); e != nil && e.HeldBy != nil {
		e.HeldBy.Key = key
	}
	return l, err
}

// Refresh extends l by ttl; IsLost when it is no longer the caller's.
func (c *Client) Refresh(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	var out Lease
	err := c.do(ctx, "refresh", http.MethodPost, "/v1/leases/refresh", nil,
		refreshRequest{Key: l.Key, Holder: l.Holder, Epoch: l.Epoch, Secret: l.Secret, TTLMS: ceilMillis(ttl)}, &out)
	if err != nil {
		return l, err
	}
	out.Secret = l.Secret // the server does not send it back
	return out, nil
}

// Release frees l. Releasing twice is not an error; IsLost when someone else has taken the
// key since.
func (c *Client) Release(ctx context.Context, l Lease) error {
	return c.do(ctx, "release", http.MethodPost, "/v1/leases/release", nil,
		releaseRequest{Key: l.Key, Holder: l.Holder, Epoch: l.Epoch, Secret: l.Secret}, nil)
}

// Holder says who holds key; IsNotFound when nobody ever took it.
func (c *Client) Holder(ctx context.Context, key string) (LeaseInfo, error) {
	var info LeaseInfo
	err := c.do(ctx, "holder", http.MethodGet, "/v1/leases/"+url.PathEscape(key), nil, nil, &info)
	return info, err
}

// LeaseQuery asks for the org's leases: Held keeps only those held now; Limit 0 is the
// server's default.
type LeaseQuery struct {
	Held  bool
	Limit int
}

// Leases lists the org's own home: and session: leases, held ones first, then the most
// recently changed.
func (c *Client) Leases(ctx context.Context, q LeaseQuery) (LeaseList, error) {
	v := url.Values{}
	if q.Held {
		v.Set("held", "true")
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	var l LeaseList
	err := c.do(ctx, "leases", http.MethodGet, "/v1/leases", v, nil, &l)
	return l, err
}

func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return d.Milliseconds()
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// do sends one request and decodes a success into out (nil: no body expected).
func (c *Client) do(ctx context.Context, op, method, path string, q url.Values, body, out any) error {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("control %s: %w", op, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("control %s: %w", op, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		// A transport error names the URL, never the header that carries the key.
		return fmt.Errorf("control %s: %w", op, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return fmt.Errorf("control %s: read the answer: %w", op, err)
	}
	if len(data) > maxResponse {
		return fmt.Errorf("control %s: the answer is larger than %d bytes", op, maxResponse)
	}
	if resp.StatusCode/100 != 2 {
		return c.errorFrom(op, resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("control %s: the answer is not the API's JSON: %w", op, err)
	}
	return nil
}

func (c *Client) errorFrom(op string, status int, data []byte) *APIError {
	e := &APIError{Op: op, Status: status}
	var b errorBody
	if json.Unmarshal(data, &b) == nil && b.Code != "" {
		e.Code, e.Message = b.Code, b.Message
		if b.Code == CodeHeld {
			e.HeldBy = &Lease{Holder: b.Holder, Epoch: b.Epoch, ExpiresAt: b.ExpiresAt}
		}
	} else {
		// Not the API talking (a proxy in between, say): keep a short excerpt.
		e.Code = strings.ToLower(strings.ReplaceAll(http.StatusText(status), " ", "_"))
		e.Message = strings.ToValidUTF8(string(data[:min(len(data), 200)]), "?")
	}
	// The server never echoes the key; make sure nothing else in between does either.
	e.Message = strings.ReplaceAll(e.Message, c.key, "[redacted]")
	return e
}

// IsEnded reports whether err is a subagent call refused because the subagent has ended.
func IsEnded(err error) bool { e := apiError(err); return e != nil && e.Code == CodeEnded }

// StartSubagent is the subagent_start hook: it records a running child of the org.
// Repeating it for the same child returns the existing handle.
func (c *Client) StartSubagent(ctx context.Context, st subagent.Start) (subagent.Handle, error) {
	var h subagent.Handle
	err := c.do(ctx, "start subagent", http.MethodPost, "/v1/subagents", nil, st, &h)
	return h, err
}

// StopSubagent is the subagent_stop hook: status is subagent.Done or subagent.Failed.
func (c *Client) StopSubagent(ctx context.Context, id, status, summary string) (subagent.Handle, error) {
	var h subagent.Handle
	err := c.do(ctx, "stop subagent", http.MethodPost, subagentPath(id, "/stop"), nil, stopRequest{Status: status, Summary: summary}, &h)
	return h, err
}

// Subagents lists the org's subagents, newest first (p as subagent.List takes it).
func (c *Client) Subagents(ctx context.Context, p subagent.ListParams) ([]subagent.Handle, error) {
	q := url.Values{}
	if p.Status != "" {
		q.Set("status", p.Status)
	}
	if p.JobID != "" {
		q.Set("job_id", p.JobID)
	}
	if p.Limit != 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	var l SubagentList
	err := c.do(ctx, "subagents", http.MethodGet, "/v1/subagents", q, nil, &l)
	return l.Subagents, err
}

// Subagent is one of the org's subagents with its newest messages.
func (c *Client) Subagent(ctx context.Context, id string) (SubagentDetail, error) {
	var d SubagentDetail
	err := c.do(ctx, "subagent", http.MethodGet, subagentPath(id, ""), nil, nil, &d)
	return d, err
}

// SendSubagent queues body from sender in a running subagent's mailbox.
func (c *Client) SendSubagent(ctx context.Context, id, sender, body string) (subagent.Message, error) {
	var m subagent.Message
	err := c.do(ctx, "send", http.MethodPost, subagentPath(id, "/messages"), nil, sendRequest{Sender: sender, Body: body}, &m)
	return m, err
}

// CancelSubagent asks a running subagent to stop, saying who asks and why.
func (c *Client) CancelSubagent(ctx context.Context, id, actor, reason string) (subagent.Handle, error) {
	var h subagent.Handle
	err := c.do(ctx, "cancel", http.MethodPost, subagentPath(id, "/cancel"), nil, cancelRequest{Actor: actor, Reason: reason}, &h)
	return h, err
}

// Mailbox is the child's side: its unacknowledged messages and whether it must stop,
// waiting up to wait (rounded up to milliseconds; at most the server's maximum) while there
// is neither.
func (c *Client) Mailbox(ctx context.Context, id string, wait time.Duration) (subagent.Mailbox, error) {
	q := url.Values{}
	if wait > 0 {
		q.Set("wait_ms", strconv.FormatInt(ceilMillis(wait), 10))
	}
	var box subagent.Mailbox
	err := c.do(ctx, "mailbox", http.MethodGet, subagentPath(id, "/mailbox"), q, nil, &box)
	return box, err
}

// Ack acknowledges messages the child has taken, so they are not handed out again.
func (c *Client) Ack(ctx context.Context, id string, ids []int64) (int, error) {
	var res AckResult
	err := c.do(ctx, "ack", http.MethodPost, subagentPath(id, "/mailbox/ack"), nil, ackRequest{IDs: ids}, &res)
	return res.Acked, err
}

func subagentPath(id, rest string) string { return "/v1/subagents/" + url.PathEscape(id) + rest }
