package web_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"hermeshost/handlers"
	"hermeshost/internal/testio"
	"hermeshost/web"
)

func TestAPanicIsTheErrorPageWithoutAStackTraceAndIsLogged(t *testing.T) {
	logs := &testio.Buffer{}
	pages := handlers.Pages{Log: slog.New(slog.NewJSONHandler(logs, nil)), Prefix: "/orgs/acme"}
	r := chi.NewRouter()
	r.Use(web.SecurityHeaders, web.Recoverer(pages))
	r.Get("/orgs/acme/boom", func(http.ResponseWriter, *http.Request) { panic("secret internal detail") })
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/orgs/acme/boom", nil))
	body := w.Body.String()
	if w.Code != http.StatusInternalServerError || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") ||
		!strings.Contains(body, `data-testid="error-message"`) || !strings.Contains(body, `href="/orgs/acme/static/app.css"`) {
		t.Fatalf("%d %s\n%s", w.Code, w.Header(), body)
	}
	if strings.Contains(body, "secret internal detail") || strings.Contains(body, "goroutine") {
		t.Fatalf("the page shows the panic:\n%s", body)
	}
	if l := logs.String(); !strings.Contains(l, "handler panic") || !strings.Contains(l, "secret internal detail") {
		t.Fatalf("the panic is not logged: %s", l)
	}
	if w.Header().Get("Cache-Control") != "no-store" || !strings.Contains(w.Header().Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Fatalf("headers: %v", w.Header())
	}
}

func TestRedirectTellsHtmxToLoadTheWholePage(t *testing.T) {
	w := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/x", nil)
	req.Header.Set("HX-Request", "true")
	handlers.Redirect(w, req, "/orgs/acme/")
	if w.Code != http.StatusNoContent || w.Header().Get("HX-Redirect") != "/orgs/acme/" || w.Header().Get("Location") != "" {
		t.Fatalf("htmx: %d %v", w.Code, w.Header())
	}
	w = httptest.NewRecorder()
	handlers.Redirect(w, httptest.NewRequest(http.MethodPost, "/x", nil), "/orgs/acme/")
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/orgs/acme/" || w.Header().Get("HX-Redirect") != "" {
		t.Fatalf("plain: %d %v", w.Code, w.Header())
	}
}

func TestStaticFilesKeepTheirOwnCacheLifetime(t *testing.T) {
	r := chi.NewRouter()
	r.Use(web.SecurityHeaders)
	web.MountStatic(r, "/orgs/acme")
	for path, want := range map[string]string{
		"/orgs/acme/static/app.css":            "no-cache",
		"/orgs/acme/static/vendor/htmx.min.js": "public, max-age=86400",
		"/orgs/acme/static/static.go":          "no-store",
	} {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if got := w.Header().Get("Cache-Control"); got != want {
			t.Errorf("%s: Cache-Control %q, want %q (%d)", path, got, want, w.Code)
		}
	}
}
