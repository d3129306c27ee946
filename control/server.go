package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/lease"
	"hermeshost/mirror"
	"hermeshost/service"
	"hermeshost/subagent"
)

// Limits of the API.
const (
	// MaxBody is the largest request body accepted.
	MaxBody = 64 << 10
	// DefaultMaxWait bounds wait_ms of a lease acquire or a mailbox drain when Config.MaxWait
	// is zero.
	DefaultMaxWait = 30 * time.Second
	// DefaultJobsLimit and MaxJobsLimit bound GET /v1/jobs?limit=.
	DefaultJobsLimit = 50
	MaxJobsLimit     = 200
	// MaxJobEvents is how many of a job's newest events GET /v1/jobs/{id} returns.
	MaxJobEvents = 500
)

// Config is what the server needs. DB, Leases, Subagents and Secret are required.
type Config struct {
	// DB holds the job mirror (mirror_jobs, mirror_job_events).
	DB *pgxpool.Pool
	// Mirror reads the job mirror; when nil the server makes one on DB, which Close closes.
	Mirror *mirror.Store
	// Leases is the lease table the org's leases live in.
	Leases *lease.Store
	// Subagents holds the subagent handles and mailboxes.
	Subagents *subagent.Store
	// Secret derives the per-org keys (see Key).
	Secret service.Secret
	// Log receives 5xx causes and refused keys (never a key itself); discarded when nil.
	Log *slog.Logger
	// Registerer receives hermes_control_requests_total (no metrics when nil).
	Registerer prometheus.Registerer
	// MaxWait caps wait_ms of a lease acquire and of a mailbox drain (DefaultMaxWait when zero).
	MaxWait time.Duration
}

// Server is the control API over one database.
type Server struct {
	cfg       Config
	mirror    *mirror.Store
	ownMirror bool // made by NewServer, closed by Close
	requests  *prometheus.CounterVec
	handler   http.Handler
}

// NewServer checks cfg and builds the route table.
func NewServer(cfg Config) (*Server, error) {
	switch {
	case cfg.DB == nil:
		return nil, errors.New("control server: no database")
	case cfg.Leases == nil:
		return nil, errors.New("control server: no lease store")
	case cfg.Subagents == nil:
		return nil, errors.New("control server: no subagent store")
	case cfg.Secret == "":
		return nil, errors.New("control server: the control secret is empty")
	case cfg.MaxWait < 0:
		return nil, fmt.Errorf("control server: max wait %s is negative", cfg.MaxWait)
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg: cfg, mirror: cfg.Mirror, ownMirror: cfg.Mirror == nil,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hermes_control_requests_total", Help: "Control API requests, by route pattern and status code.",
		}, []string{"route", "code"}),
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(s.requests); err != nil {
			return nil, fmt.Errorf("control server: register metrics: %w", err)
		}
	}
	if s.ownMirror {
		s.mirror = mirror.New(cfg.DB, mirror.Options{Log: cfg.Log})
	}
	s.handler = s.routes()
	return s, nil
}

// Close stops the notification listener of the mirror the server made, if a waiting
// GET /v1/jobs/events started one.
func (s *Server) Close() {
	if s.ownMirror {
		s.mirror.Close()
	}
}

// Handler serves the API under /v1/.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) routes() http.Handler {
	r := chi.NewRouter()
	r.Use(s.count, s.recoverer)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		service.WriteError(w, http.StatusNotFound, CodeNotFound, "no such route")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		service.WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed here")
	})
	// Group middleware runs after routing, so refused requests are counted by route too.
	r.Group(func(r chi.Router) {
		r.Use(s.authenticate)
		r.Get("/v1/jobs", s.jobsList)
		r.Get("/v1/jobs/events", s.jobEvents)
		r.Get("/v1/jobs/{id}", s.jobShow)
		r.Post("/v1/leases/acquire", s.leaseAcquire)
		r.Post("/v1/leases/refresh", s.leaseRefresh)
		r.Post("/v1/leases/release", s.leaseRelease)
		r.Post("/v1/leases/force-release", s.leaseForceRelease)
		r.Get("/v1/leases", s.leaseList)
		r.Get("/v1/leases/changes", s.leaseChanges)
		r.Get("/v1/leases/{key}", s.leaseShow)
		r.Get("/v1/leases/{key}/events", s.leaseEvents)
		r.Post("/v1/subagents", s.subagentStart)
		r.Get("/v1/subagents", s.subagentList)
		r.Get("/v1/subagents/{id}", s.subagentShow)
		r.Post("/v1/subagents/{id}/stop", s.subagentStop)
		r.Post("/v1/subagents/{id}/messages", s.subagentSend)
		r.Post("/v1/subagents/{id}/cancel", s.subagentCancel)
		r.Get("/v1/subagents/{id}/mailbox", s.subagentMailbox)
		r.Post("/v1/subagents/{id}/mailbox/ack", s.subagentAck)
	})
	return r
}

type orgKey struct{}

// orgOf is the org the request's key belongs to (set by authenticate).
func orgOf(r *http.Request) string { return r.Context().Value(orgKey{}).(string) }

// authenticate derives the org from the bearer key. Every refusal looks the same, and the
// key is neither echoed nor logged.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		org, ok := "", false
		if strings.EqualFold(scheme, "Bearer") {
			org, ok = keyOrg(s.cfg.Secret, strings.TrimSpace(token))
		}
		if !ok {
			s.cfg.Log.Warn("control key refused", "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path)
			w.Header().Set("WWW-Authenticate", `Bearer realm="hermes-control"`)
			service.WriteError(w, http.StatusUnauthorized, CodeUnauthorized, "missing or invalid control key")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), orgKey{}, org)))
	})
}

// recoverer turns a handler panic into a logged event and a plain 500.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.cfg.Log.Error("control handler panic", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v))
			service.WriteError(w, http.StatusInternalServerError, "internal", "internal error")
		}()
		next.ServeHTTP(w, r)
	})
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// count records each request under its route pattern (never the raw path, which would let
// a caller create unbounded series).
func (s *Server) count(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		route := "unmatched"
		if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
			route = rc.RoutePattern()
		}
		if rec.code == 0 {
			rec.code = http.StatusOK
		}
		s.requests.WithLabelValues(route, strconv.Itoa(rec.code)).Inc()
	})
}

// statusClientClosed is recorded for a request whose caller went away before the answer.
const statusClientClosed = 499

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func badRequest(w http.ResponseWriter, format string, a ...any) {
	service.WriteError(w, http.StatusBadRequest, CodeInvalid, fmt.Sprintf(format, a...))
}

func writeNotFound(w http.ResponseWriter, message string) {
	service.WriteError(w, http.StatusNotFound, CodeNotFound, message)
}

// internal logs the cause of a 5xx and tells the caller only that it happened.
func (s *Server) internal(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		// The caller went away: nothing to log, and the metric says so (nginx's 499).
		w.WriteHeader(statusClientClosed)
		return
	}
	s.cfg.Log.Error("control request failed", "method", r.Method, "path", r.URL.Path, "org", orgOf(r), "err", err)
	service.WriteError(w, http.StatusInternalServerError, "internal", "internal error")
}

// decodeBody reads one JSON object into v: application/json only, at most MaxBody bytes,
// no unknown fields, nothing after it. On failure it has answered and returns false.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		service.WriteError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "the body must be application/json")
		return false
	}
	tooLarge := func() bool {
		service.WriteError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("the body is larger than %d bytes", MaxBody))
		return false
	}
	if r.ContentLength > MaxBody {
		return tooLarge()
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBody))
	dec.DisallowUnknownFields()
	err = dec.Decode(v)
	if err == nil {
		if dec.Decode(&struct{}{}) != io.EOF {
			badRequest(w, "the body must be one JSON object with nothing after it")
			return false
		}
		return true
	}
	var maxErr *http.MaxBytesError
	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &maxErr):
		return tooLarge()
	case errors.Is(err, io.EOF):
		badRequest(w, "the body is empty; want a JSON object")
	case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF):
		badRequest(w, "the body is not well-formed JSON")
	case errors.As(err, &typeErr) && typeErr.Field != "":
		badRequest(w, "field %s must be %s, not %s", typeErr.Field, jsonKind(typeErr.Type.Kind().String()), typeErr.Value)
	case errors.As(err, &typeErr):
		badRequest(w, "the body must be a JSON object, not %s", typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		badRequest(w, "unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	default:
		badRequest(w, "the body is not a valid request")
	}
	return false
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "int", "int64":
		return "an integer"
	}
	return "a " + goKind
}
