package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"hermeshost/internal/unitnet"
)

// Ops is what every server process carries: its logger, health and metrics.
type Ops struct {
	Log      *slog.Logger
	Health   *Health
	Registry *prometheus.Registry
	http     *HTTPMetrics
}

// NewOps makes a fresh health and registry for one server.
func NewOps(log *slog.Logger) *Ops {
	reg := NewRegistry()
	return &Ops{Log: log, Health: NewHealth(), Registry: reg, http: NewHTTPMetrics(reg)}
}

// Router is a chi router with panic recovery, request metrics, /healthz and /metrics;
// the server adds its own routes to it.
func (o *Ops) Router() chi.Router {
	r := chi.NewRouter()
	r.Use(o.recoverer, o.http.Middleware)
	r.Method(http.MethodGet, "/healthz", o.Health)
	r.Method(http.MethodGet, "/metrics", MetricsHandler(o.Registry))
	return r
}

// recoverer turns a handler panic into a logged event and a plain 500, so no stack trace
// reaches a user.
func (o *Ops) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			o.Log.Error("handler panic", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v))
			WriteError(w, http.StatusInternalServerError, "internal", "internal error")
		}()
		next.ServeHTTP(w, r)
	})
}

// WriteError writes the JSON error shape every API of the host uses: {error, message}.
func WriteError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "message": message})
}

// timeouts bound every server's connections, so that a slow client cannot hold one: the
// request's headers and then its body must arrive in time, the answer be written in time,
// and an idle keep-alive connection is closed. A handler that answers for long (an event
// stream, a long-poll, a model's completion) lifts the read and write bounds for its
// request with LongAnswer, once it has read the body.
var timeouts = struct{ readHeader, read, write, idle time.Duration }{
	readHeader: 10 * time.Second, read: 30 * time.Second, write: 2 * time.Minute, idle: 2 * time.Minute,
}

// LongAnswer lifts the server's read and write timeouts for this request: for a handler
// that has read its body and answers for longer than the write timeout, or waits past the
// read timeout (which would otherwise end the request's context). Its own writes may still
// set deadlines of their own (an event stream does, per write).
func LongAnswer(w http.ResponseWriter) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
}

type shutdownKey struct{}

// ShuttingDown is closed when the server that took the request begins to shut down. A
// long-lived answer (an event stream) ends on it, so that draining waits only for the
// requests that end by themselves; nil (never ready) outside such a server.
func ShuttingDown(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(shutdownKey{}).(chan struct{})
	return ch
}

// Server is one HTTP listener that drains in-flight requests on shutdown.
type Server struct {
	name  string
	ln    net.Listener
	srv   *http.Server
	log   *slog.Logger
	grace time.Duration
}

// Listen binds addr (port 0 picks a free port; unix:/path makes a unix socket there) and
// logs the URL it got.
func Listen(name, addr string, h http.Handler, log *slog.Logger, grace time.Duration) (*Server, error) {
	var ln net.Listener
	var err error
	if path, ok := unitnet.SocketPath(addr); ok {
		ln, err = unitnet.Listen(path)
	} else {
		ln, err = net.Listen("tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: listen on %s: %w", name, addr, err)
	}
	down := make(chan struct{})
	s := &Server{
		name: name, ln: ln, log: log, grace: grace,
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: timeouts.readHeader,
			ReadTimeout:       timeouts.read,
			WriteTimeout:      timeouts.write,
			IdleTimeout:       timeouts.idle,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
			BaseContext: func(net.Listener) context.Context {
				return context.WithValue(context.Background(), shutdownKey{}, down)
			},
		},
	}
	s.srv.RegisterOnShutdown(func() { close(down) })
	log.Info("listening", "server", name, "url", s.URL())
	return s, nil
}

// URL is the server's base URL, with the port actually bound.
func (s *Server) URL() string {
	if u, ok := s.ln.Addr().(*net.UnixAddr); ok {
		return unitnet.URL(u.Name)
	}
	addr := s.ln.Addr().(*net.TCPAddr)
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, fmt.Sprint(addr.Port))
}

// Serve serves until ctx ends, then stops accepting, lets in-flight requests finish within
// the grace period and closes whatever is left.
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("%s: serve: %w", s.name, err)
	case <-ctx.Done():
	}
	s.log.Info("shutting down", "server", s.name, "grace", s.grace.String())
	sctx, cancel := context.WithTimeout(context.Background(), s.grace)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	<-errc
	if err != nil {
		_ = s.srv.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%s: requests still running after the %s grace period were cut", s.name, s.grace)
		}
		return fmt.Errorf("%s: shutdown: %w", s.name, err)
	}
	s.log.Info("stopped", "server", s.name)
	return nil
}

// SignalContext ends on SIGTERM or SIGINT: the start of a graceful shutdown.
func SignalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, syscall.SIGTERM, os.Interrupt)
}
