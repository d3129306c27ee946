// Package static is the operator UIs' stylesheet and scripts, embedded in the binary and
// served under /static/. htmx and its SSE extension come from npm (package-lock.json pins them)
// and are copied into vendor/ by `make build`; they are never committed.
package static

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed *
var files embed.FS

// Handler serves the stylesheet and scripts (and nothing else of this folder) with a long
// cache lifetime for the vendored files, whose names change with their version.
func Handler() http.Handler {
	fsys := http.FS(files)
	fileServer := http.FileServer(fsys)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := path.Clean("/" + r.URL.Path)
		switch path.Ext(p) {
		case ".css", ".js":
		default:
			http.NotFound(w, r)
			return
		}
		if strings.HasPrefix(p, "/vendor/") {
			w.Header().Set("Cache-Control", "public, max-age=86400")
		} else {
			w.Header().Set("Cache-Control", "no-cache")
		}
		w.Header().Set("X-Content-Type-Options", "nosniff")
		r.URL.Path = p
		fileServer.ServeHTTP(w, r)
	})
}

// HasHTMX reports whether htmx was copied in at build time.
func HasHTMX() bool {
	st, err := fs.Stat(files, "vendor/htmx.min.js")
	return err == nil && st.Size() > 0
}
