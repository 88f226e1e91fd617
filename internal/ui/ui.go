// Package ui embeds cella's web console: a small vanilla-JS app (sources in
// ui/ at the repository root, bundled with esbuild by `make build` into
// dist/) that the daemon serves at /ui/. The built files are committed so
// that `go build ./...` works in a fresh checkout without npm; `make build`
// rebuilds them when ui/ changes.
//
// The assets are public: the app asks for an API key and sends it on every
// API call (X-API-Key; the PTY WebSocket takes it as a subprotocol).
package ui

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed dist
var dist embed.FS

// Handler serves the console under prefix (e.g. "/ui/").
func Handler(prefix string) http.Handler {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // dist is embedded at build time
	}
	files := http.StripPrefix(prefix, http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// The files carry no modification time; make browsers revalidate
		// so a new daemon's console is picked up.
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		// xterm.js writes <style> elements, hence 'unsafe-inline' for styles.
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self' ws: wss:; img-src 'self' data: blob:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		files.ServeHTTP(w, r)
	})
}
