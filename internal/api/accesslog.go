package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/store"
)

// The access log and the API error counters see every REST request once,
// here, after the mux has matched it: the route is the mux's pattern
// ("POST /sandboxes/{id}/pause"), never the raw path or its query, and what
// identifies the caller is its key's name, never the key. Nothing of the
// headers or the body is written, so no key, access token, traffic token or
// secret value a request carries can reach the log. Sandbox traffic (the
// edge) is not logged here: the audit log records it.

// reqInfo is what the handlers learn about a request that its log line
// says: who made it (requireKey) and which sandbox it made (create).
type reqInfo struct {
	keyName   string
	sandboxID string
}

type reqInfoCtx struct{}

// noteKey records the key that authenticated r, by name.
func noteKey(r *http.Request, k store.APIKey) {
	if in, _ := r.Context().Value(reqInfoCtx{}).(*reqInfo); in != nil {
		in.keyName = k.Name
	}
}

// noteSandbox records the sandbox a request made.
func noteSandbox(r *http.Request, id string) {
	if in, _ := r.Context().Value(reqInfoCtx{}).(*reqInfo); in != nil {
		in.sandboxID = id
	}
}

// sandboxIDRe is the shape of a sandbox ID (sandbox.newID): a path value of
// another shape is not logged, whatever it holds.
var sandboxIDRe = regexp.MustCompile(`^[a-z0-9]{20}$`)

// statusWriter remembers the status and size of an answer.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// newRequestID is 16 random hex digits. A client's own X-Request-Id is not
// taken: it could carry anything into the log.
func newRequestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// serveAPI serves a REST request through the mux, then counts it if it
// failed and writes its access log line.
func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id := newRequestID()
	w.Header().Set("X-Request-Id", id)
	in := &reqInfo{}
	r = r.WithContext(context.WithValue(r.Context(), reqInfoCtx{}, in))
	sw := &statusWriter{ResponseWriter: w}
	jw := &jsonStatusWriter{ResponseWriter: sw}
	s.mux.ServeHTTP(jw, r)
	jw.finish() // before sw.status is read: a rewritten error is written here

	route := r.Pattern // set by the mux on r itself
	if route == "" {
		route = "unmatched"
	}
	status := sw.status
	switch {
	case status == 0 && r.Header.Get("Upgrade") != "":
		status = http.StatusSwitchingProtocols // hijacked by a WebSocket
	case status == 0:
		status = http.StatusOK
	}
	if status >= 400 {
		s.cfg.Metrics.APIError(route, status)
	}
	if s.cfg.AccessLog == nil {
		return
	}
	sandboxID := in.sandboxID
	if v := r.PathValue("id"); sandboxID == "" && sandboxIDRe.MatchString(v) && isSandboxRoute(route) {
		sandboxID = v
	}
	remote, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		remote = r.RemoteAddr
	}
	s.cfg.AccessLog.LogAttrs(r.Context(), slog.LevelInfo, "request",
		slog.String("request_id", id),
		slog.String("method", r.Method),
		slog.String("route", route),
		slog.Int("status", status),
		slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
		slog.Int64("bytes", sw.bytes),
		slog.String("key", in.keyName),
		slog.String("sandbox_id", sandboxID),
		slog.String("remote", remote),
	)
}

// isSandboxRoute reports a route whose {id} is a sandbox's.
func isSandboxRoute(route string) bool {
	_, path, _ := strings.Cut(route, " ")
	return strings.HasPrefix(path, "/sandboxes/{id}") || strings.HasPrefix(path, "/v2/sandboxes/{id}")
}
