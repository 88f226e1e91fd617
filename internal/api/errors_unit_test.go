package api

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/cella-sandbox/cella/internal/errdefs"
)

// wantJSONError fails unless rec is an error answer with status in E2B's
// JSON shape: {code: status, message}.
func wantJSONError(t *testing.T, what string, rec *httptest.ResponseRecorder, status int, msg string) {
	t.Helper()
	var body errorBody
	ct := rec.Header().Get("Content-Type")
	if rec.Code != status || !strings.HasPrefix(ct, "application/json") ||
		json.Unmarshal(rec.Body.Bytes(), &body) != nil || body.Code != status || body.Message == "" {
		t.Errorf("%s: %d %q %s, want a %d JSON {code, message}", what, rec.Code, ct, rec.Body, status)
		return
	}
	if msg != "" && !strings.Contains(body.Message, msg) {
		t.Errorf("%s: message %q, want it to contain %q", what, body.Message, msg)
	}
	if rec.Header().Get("X-Content-Type-Options") != "" {
		t.Errorf("%s: text/plain's nosniff header leaked into the JSON answer", what)
	}
}

// TestUnitTextErrorsBecomeJSON: the mux's own 404/405 and an http.Error of
// any handler behind it (a library's: MCP's, the console's file server)
// reach the client as the JSON error shape, with the handler's text kept.
func TestUnitTextErrorsBecomeJSON(t *testing.T) {
	s := New(Config{})
	s.mux.Handle("GET /test-plain-error", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "the library's own words", http.StatusTeapot)
	}))
	s.mux.Handle("GET /test-plain-ok", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("fine"))
	}))
	for _, c := range []struct {
		method, path string
		status       int
		msg          string
	}{
		{"GET", "/no/such/route", 404, "no such route"},
		{"DELETE", "/health", 405, "allowed: GET, HEAD"},
		{"GET", "/test-plain-error", 418, "the library's own words"},
		{"GET", "/ui/no-such-asset.js", 404, ""},
	} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, nil))
		wantJSONError(t, c.method+" "+c.path, rec, c.status, c.msg)
	}
	// A text/plain success is not touched.
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/test-plain-ok", nil))
	if rec.Code != 200 || rec.Body.String() != "fine" {
		t.Errorf("text/plain 200: %d %q", rec.Code, rec.Body)
	}
}

// recordLevels is a slog handler keeping each record's level by message.
type recordLevels struct {
	mu     sync.Mutex
	levels []slog.Level
}

func (h *recordLevels) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordLevels) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.levels = append(h.levels, r.Level)
	return nil
}
func (h *recordLevels) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordLevels) WithGroup(string) slog.Handler      { return h }

// TestUnitWriteErrLogLevel: a 4xx or a 501 is the caller's and is logged at
// debug; only the daemon's own 5xx is an error in its log.
func TestUnitWriteErrLogLevel(t *testing.T) {
	for _, c := range []struct {
		err  error
		want slog.Level
	}{
		{errdefs.InvalidArgument("bad"), slog.LevelDebug},
		{errdefs.NotFound("gone"), slog.LevelDebug},
		{errdefs.NotImplemented("later"), slog.LevelDebug},
		{errdefs.Unavailable("shutting down"), slog.LevelError},
		{errdefs.Internal("broke"), slog.LevelError},
	} {
		h := &recordLevels{}
		s := New(Config{Log: slog.New(h)})
		rec := httptest.NewRecorder()
		s.writeErr(rec, httptest.NewRequest("GET", "/x", nil), c.err)
		if len(h.levels) != 1 || h.levels[0] != c.want {
			t.Errorf("%v (%d): logged at %v, want once at %v", c.err, rec.Code, h.levels, c.want)
		}
		wantJSONError(t, c.err.Error(), rec, errdefs.HTTPStatus(c.err), c.err.Error())
	}
}
