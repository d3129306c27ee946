package control

import (
	"encoding/json"
	"time"
)

// Job is one row of the job mirror, as the API shows it.
type Job struct {
	ID        string          `json:"job_id"`
	Type      string          `json:"type"`
	Status    string          `json:"status"`
	Attempt   int             `json:"attempt"`
	Error     string          `json:"error,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// JobsPage is one page of GET /v1/jobs; NextCursor is empty on the last page.
type JobsPage struct {
	Jobs       []Job  `json:"jobs"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// JobEvent is one row of a job's mirrored history.
type JobEvent struct {
	ID      int64           `json:"id"`
	Attempt int             `json:"attempt"`
	Kind    string          `json:"kind"`
	Data    json.RawMessage `json:"data"`
	At      time.Time       `json:"at"`
}

// JobDetail is GET /v1/jobs/{id}: the job and its newest MaxJobEvents events, oldest first;
// Truncated says older ones were left out.
type JobDetail struct {
	Job       Job        `json:"job"`
	Events    []JobEvent `json:"events"`
	Truncated bool       `json:"truncated"`
}

// Lease is one holding of a lease as the API shows it: Key in the caller's form
// (session:<id>, never the stored session:<org>.<id>).
type Lease struct {
	Key        string    `json:"key"`
	Holder     string    `json:"holder"`
	Epoch      int64     `json:"epoch"`
	AcquiredAt time.Time `json:"acquired_at,omitzero"`
	ExpiresAt  time.Time `json:"expires_at,omitzero"`
	// Secret is the holding's, in an acquire's answer only: refresh and release send it
	// back. Nothing that lists or shows leases carries it.
	Secret string `json:"secret,omitempty"`
}

// LeaseInfo is GET /v1/leases/{key}: the key's last holding, and whether it is held now
// (an expired holding nobody has swept yet still names its holder). A released key has an
// empty Holder and no times; its Epoch is the last one granted.
type LeaseInfo struct {
	Lease
	Held bool `json:"held"`
}

// errorBody is every error response: {error, message}, and on a held lease the holding in
// the way.
type errorBody struct {
	Code    string `json:"error"`
	Message string `json:"message"`
	Holder  string `json:"holder,omitempty"`
	Epoch   int64  `json:"epoch,omitempty"`
	// ExpiresAt is when the holding in the way ends.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// Error codes of the API.
const (
	CodeUnauthorized = "unauthorized"
	CodeForbidden    = "forbidden"
	CodeNotFound     = "not_found"
	CodeInvalid      = "invalid"
	CodeHeld         = "held"
	CodeLost         = "lost"
	CodeNotHolder    = "not_holder"
)
