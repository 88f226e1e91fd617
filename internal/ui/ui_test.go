package ui

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHandlerServesTheConsole(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("GET /ui/", Handler("/ui/"))
	for _, c := range []struct{ path, ctype, body string }{
		{"/ui/", "text/html", `<div id="app"`},
		{"/ui/app.js", "text/javascript", ""},
		{"/ui/app.css", "text/css", ""},
	} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", c.path, nil))
		if rec.Code != 200 {
			t.Fatalf("GET %s: %d %s", c.path, rec.Code, rec.Body)
		}
		if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, c.ctype) {
			t.Errorf("GET %s: Content-Type %q, want %s", c.path, ct, c.ctype)
		}
		if !strings.Contains(rec.Body.String(), c.body) {
			t.Errorf("GET %s: body lacks %q", c.path, c.body)
		}
		if rec.Header().Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: no Content-Security-Policy", c.path)
		}
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/ui", nil))
	if (rec.Code != http.StatusMovedPermanently && rec.Code != http.StatusTemporaryRedirect) || rec.Header().Get("Location") != "/ui/" {
		t.Errorf("GET /ui: %d Location %q, want a redirect to /ui/", rec.Code, rec.Header().Get("Location"))
	}
}
