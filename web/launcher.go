// Package web assembles the operator UIs' servers around the handlers: the launcher
// (launcher*.go: login sessions, the login check, cross-origin protection) and an org's
// dashboard (dashboard.go: the launcher's assertion, the only thing it trusts). What both
// use, the security headers, static files and the error page on a panic, is common.go.
package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/alexedwards/scs/pgxstore"
	"github.com/alexedwards/scs/v2"
	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"hermeshost/assertion"
	"hermeshost/dashboards"
	"hermeshost/handlers"
	"hermeshost/operator"
	"hermeshost/service"
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
	// Now is the clock of the idle timeout (nil: time.Now).
	Now func() time.Time
	// RefreshSeconds is how often the index reloads its org table (5 when zero).
	RefreshSeconds int
	// Dashboards is where dashboards are asked for and found; DashboardSecret signs the
	// assertions the dashboards verify (DASHBOARD_SECRET, shared with the dispatcher).
	// Without both, an org's dashboard says it is not available from this launcher.
	Dashboards      *dashboards.Store
	DashboardSecret service.Secret
}

// Launcher is the launcher's HTTP handler. Close stops its session cleanup.
type Launcher struct {
	handler   http.Handler
	operators *operator.Store
	stop      chan struct{}
	done      chan struct{}
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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.RefreshSeconds == 0 {
		cfg.RefreshSeconds = 5
	}
	// pgxstore's own cleanup goroutine races its stop and logs outside slog; the launcher
	// runs its own.
	store := pgxstore.NewWithCleanupInterval(cfg.DB, 0)
	pages := handlers.Pages{Log: ops.Log}
	loginSessions := scs.New()
	loginSessions.Store = store
	loginSessions.Lifetime = cfg.SessionLifetime
	// The idle timeout is kept by requireOperator, which records a login session's use at
	// most once a minute: scs's own would write the session on every request (every htmx
	// refresh, every proxied dashboard request).
	loginSessions.Cookie.Name = "hermes_launcher"
	loginSessions.Cookie.HttpOnly = true
	loginSessions.Cookie.SameSite = http.SameSiteLaxMode
	loginSessions.Cookie.Secure = cfg.SecureCookie
	loginSessions.ErrorFunc = func(w http.ResponseWriter, r *http.Request, err error) {
		pages.Failed(w, r, fmt.Errorf("login session store: %w", err))
	}
	h := &handlers.Launcher{Pages: pages, Operators: cfg.Operators, LoginSessions: loginSessions, RefreshSeconds: cfg.RefreshSeconds}
	var signer *assertion.Signer
	unavailable := ""
	switch {
	case cfg.Dashboards == nil || cfg.DashboardSecret == "":
		unavailable = "Dashboards are not available from this launcher: it has no DASHBOARD_SECRET (the dispatcher needs the same one)."
		cfg.Dashboards = nil
	default:
		var err error
		if signer, err = assertion.NewSigner(cfg.DashboardSecret.Reveal(), nil); err != nil {
			return nil, fmt.Errorf("launcher: %w", err)
		}
	}
	proxy := newDashboardProxy(cfg.Dashboards, cfg.Operators, signer, pages, unavailable)

	r := ops.Router() // /healthz and /metrics come first; the launcher's routes are a group
	r.NotFound(notFound(pages))
	r.Group(func(r chi.Router) {
		r.Use(SecurityHeaders, Recoverer(pages))
		if cfg.SecureCookie {
			// Served over HTTPS (the cookie says so): browsers keep to HTTPS for a year.
			r.Use(strictTransport)
		}
		MountStatic(r, "")
		r.Get("/orgs/{org}/static/*", proxy.static)
		// Browsers ask for it on every site; there is none, and saying so is no error.
		r.Get("/favicon.ico", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
		r.Group(func(r chi.Router) {
			// Every unsafe method must come from this origin (Sec-Fetch-Site, else Origin).
			r.Use(http.NewCrossOriginProtection().Handler, loginSessions.LoadAndSave)
			r.Get("/login", h.LoginPage)
			r.Post("/login", h.Login)
			r.Post("/logout", h.Logout)
			r.Group(func(r chi.Router) {
				r.Use(requireOperator(loginSessions, cfg.Operators, pages, cfg.IdleTimeout, cfg.Now))
				r.Get("/", h.Index)
				r.Get("/orgs", h.Orgs)
				r.Post("/open/{org}", proxy.open)
				r.Get("/orgs/{org}", func(w http.ResponseWriter, r *http.Request) {
					handlers.Redirect(w, r, "/orgs/"+chi.URLParam(r, "org")+"/")
				})
				r.Handle("/orgs/{org}/*", proxy)
			})
		})
	})
	l := &Launcher{handler: r, operators: cfg.Operators, stop: make(chan struct{}), done: make(chan struct{})}
	go l.cleanup(cfg.DB, ops)
	return l, nil
}

// strictTransport sends HSTS, so a browser that has seen the launcher over HTTPS never
// sends its login cookie over plain HTTP.
func strictTransport(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Strict-Transport-Security", "max-age=31536000")
		next.ServeHTTP(w, r)
	})
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
		if err := l.operators.PruneThrottle(ctx); err != nil {
			ops.Log.Warn("launcher: forget old login tries", "err", err)
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

// loginSessionSeen is the login session's key for when it was last used (Unix seconds), and
// seenResolution how often that is written.
const (
	loginSessionSeen = "seen"
	seenResolution   = time.Minute
)

// requireOperator lets a request through only with a session of an operator who still
// exists and is enabled, asked on every request so that a disable or a removal ends their
// sessions at once. Others go to the login page (htmx requests are told to go there).
//
// A login session unused for idle ends too. Its use is recorded in the session at most every
// seenResolution, so most requests write nothing; the timeout is kept to within that.
func requireOperator(loginSessions *scs.SessionManager, ops *operator.Store, pages handlers.Pages, idle time.Duration, clock func() time.Time) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			name := loginSessions.GetString(r.Context(), handlers.LoginSessionOperator)
			now := clock()
			var seen time.Time
			if unix := loginSessions.GetInt64(r.Context(), loginSessionSeen); unix != 0 {
				seen = time.Unix(unix, 0)
			}
			if name != "" && !seen.IsZero() && now.Sub(seen) > idle {
				// Unused for too long: the login session ends here, as an expired one.
				if err := loginSessions.Destroy(r.Context()); err != nil {
					pages.Log.Error("launcher: end an idle login session", "err", err)
				}
				name = ""
			} else if name != "" && now.Sub(seen) >= seenResolution {
				loginSessions.Put(r.Context(), loginSessionSeen, now.Unix())
			}
			if name != "" {
				op, err := ops.Get(r.Context(), name)
				// A password set since the login (by the operator elsewhere, or an admin who
				// suspects a stolen one) ends every login session made with the old one.
				samePassword := loginSessions.GetInt64(r.Context(), handlers.LoginSessionPasswordAt) == op.PasswordAt.UnixNano()
				switch {
				case err == nil && !op.Disabled && samePassword:
					next.ServeHTTP(w, r.WithContext(handlers.WithOperator(r.Context(), op)))
					return
				case err != nil && !errors.Is(err, operator.ErrNotFound):
					pages.Failed(w, r, fmt.Errorf("read the login session's operator %s: %w", name, err))
					return
				}
				// Removed, disabled or given a new password since the login: the login
				// session ends here.
				if err := loginSessions.Destroy(r.Context()); err != nil {
					pages.Log.Error("launcher: end a login session", "err", err)
				}
			}
			if handlers.IsHTMX(r) {
				// htmx would swap the login page into the org table: it is told to go there.
				w.Header().Set("HX-Redirect", "/login")
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
		})
	}
}
