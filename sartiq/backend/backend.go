// Package backend is the reference Sartiq agent-jobs API: a chi server on its own
// goose-migrated schema that keeps the contract of BACKEND_API.md, so the host can be run
// and tested on one machine. It serves its own OpenAPI document at /openapi.json.
//
// Every API request passes one gate (handle, in auth.go): the bearer token is either the
// bot token or a job token, and a job token passes a default-deny allowlist keyed by its
// capability (allowlist.go), with the job and organization in the path bound to the token.
// Every write made with a job token is conditional, in the same SQL statement, on that
// token still being the job's live one, so a superseded token can change nothing.
package backend

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"hermeshost/migrations"
	"hermeshost/service"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations is the backend's goose set, in its own schema (and so its own version table).
var Migrations = migrations.Set{Name: "backend", FS: mustSub(migrationFiles, "migrations"), DefaultSchema: "sartiq_backend"}

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return sub
}

// Defaults for Config's zero values.
const (
	DefaultTokenTTL   = 10 * time.Minute
	DefaultStaleAfter = 45 * time.Second
	// uploadTTL is how long a presigned URL accepts its PUT.
	uploadTTL = 5 * time.Minute
	// MaxUploadBytes caps one artifact; the reference backend keeps artifacts in Postgres.
	MaxUploadBytes = 8 << 20
	// maxBodyBytes caps every JSON request body.
	maxBodyBytes = 1 << 20
)

// Config is what the backend is started with.
type Config struct {
	// BotToken is the one bot credential the backend accepts.
	BotToken service.Secret
	// StaleAfter: a CLAIMED or RUNNING job without a heartbeat (or claim) for this long may
	// be re-claimed.
	StaleAfter time.Duration
	// TokenTTL is a job token's lifetime from its claim or its last accepted heartbeat.
	TokenTTL time.Duration
	// PublicURL is the base of the URLs the backend hands out (manifests, uploads); empty
	// means the scheme and Host of the request being answered.
	PublicURL string
	// Now is the clock; nil means time.Now. Every time the backend stores comes from it,
	// which is how tests move time forward without sleeping.
	Now func() time.Time
}

// Handler serves the API; each operation is one method, in a file of its own.
type Handler struct {
	db      *pgxpool.Pool
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	doc     []byte
	// operations maps "METHOD pattern" to the operationId the route was registered with,
	// so the document can be checked against the router.
	operations map[string]string
}

// New builds the backend's router on ops' router (recovery, metrics, /healthz, /metrics)
// and registers a database probe on ops.Health.
func New(db *pgxpool.Pool, cfg Config, ops *service.Ops) (http.Handler, error) {
	h, err := newHandler(db, cfg, ops)
	if err != nil {
		return nil, err
	}
	r := ops.Router()
	h.routes(r)
	return r, nil
}

func newHandler(db *pgxpool.Pool, cfg Config, ops *service.Ops) (*Handler, error) {
	if cfg.BotToken == "" {
		return nil, fmt.Errorf("backend: no bot token configured")
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = DefaultStaleAfter
	}
	if cfg.TokenTTL <= 0 {
		cfg.TokenTTL = DefaultTokenTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	doc, err := documentJSON()
	if err != nil {
		return nil, err
	}
	ops.Health.Probe("database", func(ctx context.Context) error { return db.Ping(ctx) })
	return &Handler{
		db: db, cfg: cfg, log: ops.Log, metrics: newMetrics(ops.Registry), doc: doc,
		operations: map[string]string{},
	}, nil
}

// now is the clock at the database's precision, so what is stored compares equal to what
// was computed.
func (h *Handler) now() time.Time { return h.cfg.Now().UTC().Truncate(time.Microsecond) }

// routes is the route table, top to bottom. Ops routes (/healthz, /metrics) come from
// service.Ops.
func (h *Handler) routes(r chi.Router) {
	// /healthz and /metrics are service.Ops' routes; the document describes them too.
	h.operations["GET /healthz"] = "getHealth"
	h.operations["GET /metrics"] = "getMetrics"
	h.public(r, http.MethodGet, "/openapi.json", "getOpenAPIDocument", h.getOpenAPIDocument)
	h.public(r, http.MethodPut, "/uploads/{key}", "putUpload", h.putUpload)

	h.api(r, http.MethodGet, "/agent-jobs", "listAgentJobs", h.listAgentJobs)
	h.api(r, http.MethodPost, "/agent-jobs/{id}/claim", "claimAgentJob", h.claimAgentJob)
	h.api(r, http.MethodPost, "/agent-jobs/{id}/reclaim", "reclaimAgentJob", h.reclaimAgentJob)
	h.api(r, http.MethodPost, "/agent-jobs/{id}/start", "startAgentJob", h.startAgentJob)
	h.api(r, http.MethodPost, "/agent-jobs/{id}/heartbeat", "heartbeatAgentJob", h.heartbeatAgentJob)
	h.api(r, http.MethodPost, "/agent-jobs/{id}/events", "addAgentJobEvent", h.addAgentJobEvent)
	h.api(r, http.MethodGet, "/agent-jobs/{id}/events", "listAgentJobEvents", h.listAgentJobEvents)
	h.api(r, http.MethodPost, "/agent-jobs/{id}/complete", "completeAgentJob", h.completeAgentJob)
	h.api(r, http.MethodPost, "/agent-jobs/{id}/fail", "failAgentJob", h.failAgentJob)
	h.api(r, http.MethodPost, "/agent-jobs/{id}/release", "releaseAgentJob", h.releaseAgentJob)
	h.api(r, http.MethodGet, "/manifests/{id}", "getAgentJobManifest", h.getAgentJobManifest)
	h.api(r, http.MethodPost, "/uploads/presign", "presignUpload", h.presignUpload)
	h.api(r, http.MethodGet, "/organizations/{org}/products", "listProducts", h.listProducts)
	h.api(r, http.MethodPost, "/organizations/{org}/product-proposals", "proposeProducts", h.proposeProducts)
	h.api(r, http.MethodPut, "/organizations/{org}/guidelines/{category}/proposal", "proposeGuidelines", h.proposeGuidelines)
}
