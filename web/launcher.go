// Package web assembles the operator UIs' servers: the chi router, sessions, the login
// check, cross-origin protection, security headers and static files, around the handlers.
package web

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/alexedwards/scs/pgxstore"
	"github.com/alexedwards/scs/v2"
	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"hermeshost/handlers"
	"hermeshost/operator"
	"hermeshost/service"
	"hermeshost/static"
)

// LauncherConfig is what the launcher needs. It holds Postgres (operators, grants,
// sessions) and nothing else: no Docker socket, no bot credential.
type LauncherConfig struct {
	DB        *pgxpool.Pool
	Operators *operator.Store
	// SecureCookie marks the session cookie Secure (HTTPS only); off only for local runs
	// over plain HTTP.
	SecureCookie bool
	// SessionLifetime ends a session however busy (12h when zero); IdleTimeout ends one
	// unused that long (1h when zero).
	SessionLifetime time.Duration
	IdleTimeout     time.Duration
	// RefreshSeconds is how often the index reloads its org table (5 when zero).
	RefreshSeconds int
}

// Launcher is the launcher's HTTP handler. Close stops its session cleanup.
type Launcher struct {
	handler http.Handler
	stop    chan struct{}
	done    chan struct{}
}

// NewLauncher builds the launcher on ops' router (/healthz and /metrics beside it).
func NewLauncher(ops *service.Ops, cfg LauncherConfig) (*Launcher, error) {
	switch {
	case cfg.DB == nil:
		return nil, errors.New("launcher: no database")
	case cfg.Operators == nil:
		return nil, errors.New("launcher: no operator store")
	}
	if cfg.SessionLifetime == 0 {
		cfg.SessionLifetime = 12 * time.Hour
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = time.Hour
	}
	if cfg.RefreshSeconds == 0 {
		cfg.RefreshSeconds = 5
	}
	// pgxstore's own cleanup goroutine races its stop and logs outside slog; the launcher
	// runs its own.
	store := pgxstore.NewWithCleanupInterval(cfg.DB, 0)
	sessions := scs.New()
	sessions.Store = store
	sessions.Lifetime = cfg.SessionLifetime
	sessions.IdleTimeout = cfg.IdleTimeout
	sessions.Cookie.Name = "hermes_launcher"
	sessions.Cookie.HttpOnly = true
	sessions.Cookie.SameSite = http.SameSiteLaxMode
	sessions.Cookie.Secure = cfg.SecureCookie
	sessions.ErrorFunc = func(w http.ResponseWriter, r *http.Request, err error) {
		ops.Log.Error("launcher session store failed", "path", r.URL.Path, "err", err)
		http.Error(w, "Something went wrong on the host; the error is in its log.", http.StatusInternalServerError)
	}
	h := &handlers.Launcher{Operators: cfg.Operators, Sessions: sessions, Log: ops.Log, RefreshSeconds: cfg.RefreshSeconds}

	r := ops.Router() // /healthz and /metrics come first; the launcher's routes are a group
	r.Group(func(r chi.Router) {
		r.Use(securityHeaders)
		r.Handle("/static/*", http.StripPrefix("/static", static.Handler()))
		// Browsers ask for it on every site; there is none, and saying so is no error.
		r.Get("/favicon.ico", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
		r.Group(func(r chi.Router) {
			// Every unsafe method must come from this origin (Sec-Fetch-Site, else Origin).
			r.Use(http.NewCrossOriginProtection().Handler, sessions.LoadAndSave)
			r.Get("/login", h.LoginPage)
			r.Post("/login", h.Login)
			r.Post("/logout", h.Logout)
			r.Group(func(r chi.Router) {
				r.Use(requireOperator(sessions, cfg.Operators, ops))
				r.Get("/", h.Index)
				r.Get("/orgs", h.Orgs)
			})
		})
	})
	l := &Launcher{handler: r, stop: make(chan struct{}), done: make(chan struct{})}
	go l.cleanup(cfg.DB, ops)
	return l, nil
}

// sessionCleanup is how often expired sessions are deleted (a session past its expiry is
// refused anyway; this only keeps the table small).
const sessionCleanup = 10 * time.Minute

func (l *Launcher) cleanup(db *pgxpool.Pool, ops *service.Ops) {
	defer close(l.done)
	t := time.NewTicker(sessionCleanup)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := db.Exec(ctx, `DELETE FROM sessions WHERE expiry < now()`); err != nil {
			ops.Log.Warn("launcher: delete expired sessions", "err", err)
		}
		cancel()
	}
}

// Handler serves the launcher.
func (l *Launcher) Handler() http.Handler { return l.handler }

// Close stops the expired-session cleanup.
func (l *Launcher) Close() {
	close(l.stop)
	<-l.done
}

// securityHeaders keeps the pages to this origin's own scripts and styles, out of frames,
// and out of caches.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		if !strings.HasPrefix(r.URL.Path, "/static/") {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

// requireOperator lets a request through only with a session of an operator who still
// exists and is enabled, asked on every request so that a disable or a removal ends their
// sessions at once. Others go to the login page (htmx requests are told to go there).
func requireOperator(sessions *scs.SessionManager, ops *operator.Store, svc *service.Ops) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			name := sessions.GetString(r.Context(), handlers.SessionOperator)
			if name != "" {
				op, err := ops.Get(r.Context(), name)
				switch {
				case err == nil && !op.Disabled:
					next.ServeHTTP(w, r.WithContext(handlers.WithOperator(r.Context(), op)))
					return
				case err != nil && !errors.Is(err, operator.ErrNotFound):
					svc.Log.Error("launcher: read the session's operator", "operator", name, "err", err)
					http.Error(w, "Something went wrong on the host; the error is in its log.", http.StatusInternalServerError)
					return
				}
				// Removed or disabled since the login: the session ends here.
				if err := sessions.Destroy(r.Context()); err != nil {
					svc.Log.Error("launcher: end a session", "err", err)
				}
			}
			login := "/login?next=" + url.QueryEscape(r.URL.RequestURI())
			if r.Header.Get("HX-Request") == "true" {
				w.Header().Set("HX-Redirect", "/login")
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, login, http.StatusSeeOther)
		})
	}
}
