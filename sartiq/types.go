package sartiq

import (
	"encoding/json"
	"time"
)

// Job statuses (BACKEND_API.md): QUEUED -> CLAIMED -> RUNNING -> COMPLETED | FAILED, and
// CLAIMED|RUNNING -> QUEUED on release or re-claim.
const (
	StatusQueued    = "QUEUED"
	StatusClaimed   = "CLAIMED"
	StatusRunning   = "RUNNING"
	StatusCompleted = "COMPLETED"
	StatusFailed    = "FAILED"
)

// Job types, which are also the capabilities a job token is bound to.
const (
	TypeProductIngest        = "product_ingest"
	TypeGuidelinesExtraction = "guidelines_extraction"
)

// Event kinds the backend writes itself; a worker cannot add events of these kinds, so the
// attempt count read from the log cannot be forged.
const (
	EventClaim     = "claim"
	EventReclaim   = "reclaim"
	EventStart     = "start"
	EventHeartbeat = "heartbeat"
	EventProgress  = "progress"
	EventComplete  = "complete"
	EventFail      = "fail"
	EventRelease   = "release"
	EventProposal  = "proposal"
)

// EventCrash is written by the dispatcher, with the job token, when a run ended without an
// outcome (its worker or container died, its exec stream broke) and it ends the attempt at
// once; the attempt counts as crashed. Unlike the kinds above a job token may write it, so
// the worker side could add one too, which brings only its own job nearer its attempt cap,
// no more than the fail its token may call anyway.
const EventCrash = "crash"

// Job is one agent job as the backend reports it.
type Job struct {
	ID              string          `json:"id"`
	Type            string          `json:"type"`
	OrganizationID  string          `json:"organization_id"`
	Status          string          `json:"status"`
	Attempt         int             `json:"attempt"`
	Manifest        string          `json:"manifest"`
	CreatedAt       time.Time       `json:"created_at"`
	ClaimedAt       *time.Time      `json:"claimed_at"`
	LastHeartbeatAt *time.Time      `json:"last_heartbeat_at"`
	FinishedAt      *time.Time      `json:"finished_at"`
	Stale           bool            `json:"stale"`
	Progress        json.RawMessage `json:"progress"`
	Result          json.RawMessage `json:"result"`
	Error           *string         `json:"error"`
}

// JobPage is one page of listAgentJobs; NextCursor is empty on the last page.
type JobPage struct {
	Jobs       []Job  `json:"jobs"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// ListJobsParams filters listAgentJobs. Type defaults to product_ingest on the server, so
// a caller wanting every type asks once per type. Status may name several, comma-separated.
type ListJobsParams struct {
	Status         string
	Type           string
	OrganizationID string
	Limit          int
	Cursor         string
}

// Claim is what claim and re-claim answer: the job and the job token minted for this
// attempt. The token is a secret; print Job, never the Claim.
type Claim struct {
	Job            Job       `json:"job"`
	OrganizationID string    `json:"organization_id"`
	JobToken       string    `json:"job_token"`
	TokenExpiresAt time.Time `json:"token_expires_at"`
	ManifestURL    string    `json:"manifest_url"`
}

// HeartbeatRequest is heartbeatAgentJob's optional body.
type HeartbeatRequest struct {
	Progress json.RawMessage `json:"progress,omitempty"`
}

// Heartbeat is what an accepted heartbeat answers: the token's new expiry.
type Heartbeat struct {
	Job            Job       `json:"job"`
	TokenExpiresAt time.Time `json:"token_expires_at"`
}

// EventRequest is addAgentJobEvent's body.
type EventRequest struct {
	Kind    string          `json:"kind"`
	Message string          `json:"message,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// Event is one entry of a job's log.
type Event struct {
	ID      int64           `json:"id"`
	JobID   string          `json:"job_id"`
	Attempt int             `json:"attempt"`
	Kind    string          `json:"kind"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
	At      time.Time       `json:"at"`
}

// EventPage is one page of listAgentJobEvents, oldest first.
type EventPage struct {
	Events     []Event `json:"events"`
	NextCursor string  `json:"next_cursor,omitempty"`
}

// CompleteRequest is completeAgentJob's body.
type CompleteRequest struct {
	Result json.RawMessage `json:"result"`
}

// FailRequest is failAgentJob's body.
type FailRequest struct {
	Reason string `json:"reason"`
}

// ReleaseRequest is releaseAgentJob's optional body.
type ReleaseRequest struct {
	Reason string `json:"reason,omitempty"`
}

// JobResponse wraps a job for the endpoints that answer with one.
type JobResponse struct {
	Job Job `json:"job"`
}

// Product is one product of an organization's catalogue.
type Product struct {
	ID             string          `json:"id"`
	OrganizationID string          `json:"organization_id"`
	SKU            string          `json:"sku"`
	Name           string          `json:"name"`
	Description    string          `json:"description"`
	Attributes     json.RawMessage `json:"attributes"`
	CreatedAt      time.Time       `json:"created_at"`
}

// ProductList is listProducts' answer.
type ProductList struct {
	Products []Product `json:"products"`
}

// ProductInput is one product an agent proposes.
type ProductInput struct {
	SKU         string          `json:"sku"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Attributes  json.RawMessage `json:"attributes,omitempty"`
}

// ProductProposalsRequest is proposeProducts' body.
type ProductProposalsRequest struct {
	Products []ProductInput `json:"products"`
}

// ProductProposal is a stored proposal awaiting review. A job proposing the same SKU again
// replaces its own earlier proposal and bumps Revision.
type ProductProposal struct {
	ID             string    `json:"id"`
	OrganizationID string    `json:"organization_id"`
	JobID          string    `json:"job_id"`
	SKU            string    `json:"sku"`
	Name           string    `json:"name"`
	Status         string    `json:"status"`
	Revision       int       `json:"revision"`
	UpdatedAt      time.Time `json:"updated_at"`
}

// ProductProposals is proposeProducts' answer.
type ProductProposals struct {
	Proposals []ProductProposal `json:"proposals"`
}

// GuidelinesRequest is proposeGuidelines' body: one category's guidelines.
type GuidelinesRequest struct {
	Content string   `json:"content"`
	Sources []string `json:"sources,omitempty"`
}

// GuidelinesProposal is one category's stored proposal awaiting review. A job writing the
// same category again replaces its own earlier proposal and bumps Revision.
type GuidelinesProposal struct {
	ID             string    `json:"id"`
	OrganizationID string    `json:"organization_id"`
	JobID          string    `json:"job_id"`
	Category       string    `json:"category"`
	Status         string    `json:"status"`
	Revision       int       `json:"revision"`
	UpdatedAt      time.Time `json:"updated_at"`
}

// GuidelinesProposalResponse is proposeGuidelines' answer.
type GuidelinesProposalResponse struct {
	Proposal GuidelinesProposal `json:"proposal"`
}

// PresignRequest asks for a URL to put one artifact.
type PresignRequest struct {
	Filename    string `json:"filename"`
	ContentType string `json:"content_type"`
	Size        int64  `json:"size"`
}

// Presigned is a short-lived URL that accepts one PUT of at most MaxBytes. The URL is
// itself the credential: treat it as a secret until it expires.
type Presigned struct {
	URL       string            `json:"url"`
	Method    string            `json:"method"`
	Headers   map[string]string `json:"headers"`
	MaxBytes  int64             `json:"max_bytes"`
	ExpiresAt time.Time         `json:"expires_at"`
}

// Upload is what a PUT to a presigned URL answers.
type Upload struct {
	Filename string `json:"filename"`
	Size     int64  `json:"size"`
	SHA256   string `json:"sha256"`
}

// Manifest is the document a job names: what the worker is to work on.
type Manifest struct {
	JobID          string `json:"job_id"`
	Type           string `json:"type"`
	OrganizationID string `json:"organization_id"`
	Instructions   string `json:"instructions"`
	// Categories, for guidelines_extraction: every category the job must propose; a job is
	// complete when each has a proposal.
	Categories []string         `json:"categories,omitempty"`
	Sources    []ManifestSource `json:"sources"`
}

// ManifestSource is one input document, carried inline.
type ManifestSource struct {
	Name      string `json:"name"`
	MediaType string `json:"media_type"`
	Content   string `json:"content"`
}

// ErrorBody is every error's JSON shape.
type ErrorBody struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}
