package sartiq

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

func jobPath(id, action string) string { return "/agent-jobs/" + url.PathEscape(id) + "/" + action }

func orgPath(org string) string { return "/organizations/" + url.PathEscape(org) }

// ListJobs reads one page of jobs (listAgentJobs); pass NextCursor back for the next one.
func (c *Client) ListJobs(ctx context.Context, p ListJobsParams) (*JobPage, error) {
	q := url.Values{}
	for k, v := range map[string]string{"status": p.Status, "type": p.Type, "organization_id": p.OrganizationID, "cursor": p.Cursor} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	var page JobPage
	err := c.decode(ctx, request{op: "listAgentJobs", method: http.MethodGet, path: "/agent-jobs", query: q, repeat: idempotent}, &page)
	return &page, err
}

// Claim claims a QUEUED job (claimAgentJob); IsConflict when another claimant won.
func (c *Client) Claim(ctx context.Context, id string) (*Claim, error) {
	var cl Claim
	err := c.call(ctx, "claimAgentJob", http.MethodPost, jobPath(id, "claim"), once, nil, &cl)
	return &cl, err
}

// Reclaim re-claims a stale job (reclaimAgentJob); IsConflict while it still heartbeats.
func (c *Client) Reclaim(ctx context.Context, id string) (*Claim, error) {
	var cl Claim
	err := c.call(ctx, "reclaimAgentJob", http.MethodPost, jobPath(id, "reclaim"), once, nil, &cl)
	return &cl, err
}

// Start moves the job to RUNNING (startAgentJob); repeating it is harmless.
func (c *Client) Start(ctx context.Context, id string) (*Job, error) {
	var r JobResponse
	err := c.call(ctx, "startAgentJob", http.MethodPost, jobPath(id, "start"), idempotent, nil, &r)
	return &r.Job, err
}

// Heartbeat reports life and, when progress is not nil, progress (heartbeatAgentJob). It
// answers the token's new expiry; IsTokenRevoked means stop working on the job.
func (c *Client) Heartbeat(ctx context.Context, id string, progress any) (*Heartbeat, error) {
	var in any
	if progress != nil {
		raw, err := json.Marshal(progress)
		if err != nil {
			return nil, fmt.Errorf("heartbeatAgentJob: encode progress: %w", err)
		}
		in = HeartbeatRequest{Progress: raw}
	}
	var hb Heartbeat
	err := c.call(ctx, "heartbeatAgentJob", http.MethodPost, jobPath(id, "heartbeat"), idempotent, in, &hb)
	return &hb, err
}

// AddEvent appends an event to the job's log (addAgentJobEvent).
func (c *Client) AddEvent(ctx context.Context, id string, e EventRequest) (*Event, error) {
	var out Event
	err := c.call(ctx, "addAgentJobEvent", http.MethodPost, jobPath(id, "events"), once, e, &out)
	return &out, err
}

// ListEvents reads the job's whole log, oldest first (listAgentJobEvents, every page).
func (c *Client) ListEvents(ctx context.Context, id string) ([]Event, error) {
	var all []Event
	cursor := ""
	for {
		q := url.Values{}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page EventPage
		if err := c.decode(ctx, request{op: "listAgentJobEvents", method: http.MethodGet, path: jobPath(id, "events"), query: q, repeat: idempotent}, &page); err != nil {
			return all, err
		}
		all = append(all, page.Events...)
		if page.NextCursor == "" {
			return all, nil
		}
		cursor = page.NextCursor
	}
}

// Complete completes a RUNNING job with its result (completeAgentJob).
func (c *Client) Complete(ctx context.Context, id string, result any) (*Job, error) {
	raw, err := json.Marshal(result)
	if err != nil {
		return nil, fmt.Errorf("completeAgentJob: encode result: %w", err)
	}
	var r JobResponse
	err = c.call(ctx, "completeAgentJob", http.MethodPost, jobPath(id, "complete"), once, CompleteRequest{Result: raw}, &r)
	return &r.Job, err
}

// Fail fails the job with a reason (failAgentJob).
func (c *Client) Fail(ctx context.Context, id, reason string) (*Job, error) {
	var r JobResponse
	err := c.call(ctx, "failAgentJob", http.MethodPost, jobPath(id, "fail"), once, FailRequest{Reason: reason}, &r)
	return &r.Job, err
}

// Release puts the job back in the queue (releaseAgentJob).
func (c *Client) Release(ctx context.Context, id, reason string) (*Job, error) {
	var r JobResponse
	err := c.call(ctx, "releaseAgentJob", http.MethodPost, jobPath(id, "release"), once, ReleaseRequest{Reason: reason}, &r)
	return &r.Job, err
}

// ProposeGuidelines writes one category's guidelines for review (proposeGuidelines);
// writing a category again replaces the job's earlier proposal.
func (c *Client) ProposeGuidelines(ctx context.Context, org, category string, g GuidelinesRequest) (*GuidelinesProposal, error) {
	var r GuidelinesProposalResponse
	err := c.call(ctx, "proposeGuidelines", http.MethodPut, orgPath(org)+"/guidelines/"+url.PathEscape(category)+"/proposal", idempotent, g, &r)
	return &r.Proposal, err
}

// ProposeProducts proposes products for review (proposeProducts); a SKU proposed again
// replaces the job's earlier proposal.
func (c *Client) ProposeProducts(ctx context.Context, org string, products []ProductInput) ([]ProductProposal, error) {
	var r ProductProposals
	err := c.call(ctx, "proposeProducts", http.MethodPost, orgPath(org)+"/product-proposals", idempotent, ProductProposalsRequest{Products: products}, &r)
	return r.Proposals, err
}

// ListProducts reads the organization's products (listProducts).
func (c *Client) ListProducts(ctx context.Context, org string) ([]Product, error) {
	var r ProductList
	err := c.call(ctx, "listProducts", http.MethodGet, orgPath(org)+"/products", idempotent, nil, &r)
	return r.Products, err
}

// Presign asks for a short-lived URL to put one artifact (presignUpload).
func (c *Client) Presign(ctx context.Context, p PresignRequest) (*Presigned, error) {
	var out Presigned
	err := c.call(ctx, "presignUpload", http.MethodPost, "/uploads/presign", idempotent, p, &out)
	return &out, err
}

// Upload puts data to a presigned URL (putUpload). The URL is the credential, so no token
// is sent with it.
func (c *Client) Upload(ctx context.Context, p *Presigned, data []byte) (*Upload, error) {
	r := request{op: "putUpload", method: p.Method, target: p.URL, body: data, ctype: p.Headers["Content-Type"], repeat: once}
	if c.socket {
		u, err := url.Parse(p.URL)
		if err != nil {
			return nil, fmt.Errorf("putUpload: bad presigned URL")
		}
		r.target, r.path = "", u.EscapedPath()
	}
	var out Upload
	err := c.decode(ctx, r, &out)
	return &out, err
}

// Manifest reads the manifest a job names (getAgentJobManifest for this API's own
// manifests). A manifest URL on the API's origin is fetched with the client's credential;
// one elsewhere (a presigned store) without it, so the token never leaves the API. Through
// the local proxy, only the URL's path is used.
func (c *Client) Manifest(ctx context.Context, manifestURL string) (*Manifest, error) {
	u, err := url.Parse(manifestURL)
	if err != nil {
		return nil, fmt.Errorf("getAgentJobManifest: manifest URL does not parse")
	}
	r := request{op: "getAgentJobManifest", method: http.MethodGet, repeat: idempotent}
	if c.socket || u.Host == "" || (u.Scheme == c.base.Scheme && u.Host == c.base.Host) {
		r.path, r.query = strings.TrimPrefix(u.EscapedPath(), c.base.EscapedPath()), u.Query()
	} else {
		r.target = manifestURL
	}
	var m Manifest
	err = c.decode(ctx, r, &m)
	return &m, err
}

// Document reads the API's OpenAPI document (getOpenAPIDocument).
func (c *Client) Document(ctx context.Context) ([]byte, error) {
	return c.send(ctx, request{op: "getOpenAPIDocument", method: http.MethodGet, path: "/openapi.json", repeat: idempotent})
}
