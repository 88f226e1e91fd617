package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/gatewayauth"
)

// TestUnitGatewayAssertion: on a cluster node (GatewayKey set) a request
// the gateway signed acts as the asserted key with no key of its own; an
// assertion under another key, a stale one or one moved to another path
// is a 401 (a key sent beside it does not rescue it); and a standalone
// daemon refuses every assertion, signed or not.
func TestUnitGatewayAssertion(t *testing.T) {
	u := newUnitAPI(t)
	u.sbs.add("sbxa", u.srv.principal(mustKey(t, u, unitKeyA)).Owner())
	key := []byte(strings.Repeat("k", 32))
	signed := func(path string, with []byte, at time.Time) *http.Request {
		r := httptest.NewRequest("GET", "http://127.0.0.1:3000"+path, nil)
		if err := gatewayauth.Sign(with, r, "ka", at); err != nil {
			t.Fatal(err)
		}
		return r
	}
	serve := func(r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		u.srv.ServeHTTP(w, r)
		return w
	}
	// Standalone: refused.
	if rec := serve(signed("/sandboxes/sbxa", key, time.Now())); rec.Code != http.StatusUnauthorized || !isJSONError(rec) {
		t.Errorf("a standalone daemon given an assertion: %d %s, want a JSON 401", rec.Code, rec.Body)
	}
	u.srv.cfg.GatewayKey = key
	if rec := serve(signed("/sandboxes/sbxa", key, time.Now())); rec.Code != http.StatusOK {
		t.Errorf("a signed assertion of team a's key: %d %s, want 200", rec.Code, rec.Body)
	}
	if rec := serve(signed("/keys/self", key, time.Now())); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"ka"`) {
		t.Errorf("GET /keys/self as the asserted key: %d %s", rec.Code, rec.Body)
	}
	moved := signed("/sandboxes/sbxa", key, time.Now())
	moved.URL.Path = "/sandboxes/sbxb"
	bad := map[string]*http.Request{
		"another key's MAC": signed("/sandboxes/sbxa", []byte(strings.Repeat("x", 32)), time.Now()),
		"stale":             signed("/sandboxes/sbxa", key, time.Now().Add(-gatewayauth.Skew-time.Minute)),
		"moved":             moved,
	}
	for name, r := range bad {
		r.Header.Set("X-API-Key", unitAdminKey)
		if rec := serve(r); rec.Code != http.StatusUnauthorized || !isJSONError(rec) {
			t.Errorf("%s (with the admin key beside it): %d %s, want a JSON 401", name, rec.Code, rec.Body)
		}
	}
}
