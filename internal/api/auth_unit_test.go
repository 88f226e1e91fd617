package api

import (
	"net/http"
	"strings"
	"testing"
)

// TestUnitAdminOnly: the routes only the admin key may use answer any
// other key 403 naming what it may not do, and the admin passes.
func TestUnitAdminOnly(t *testing.T) {
	u := newUnitAPI(t)
	routes := []struct{ method, path, body, what string }{
		{"GET", "/metrics", "", "read the daemon's metrics"},
		{"POST", "/keys", `{"name":"n"}`, "manage API keys"},
		{"GET", "/keys", "", "manage API keys"},
		{"DELETE", "/keys/kb", "", "manage API keys"},
		{"PUT", "/pools/base", `{"size":1}`, "size warm pools"},
		{"POST", "/secrets", `{"name":"S","value":"v"}`, "manage secrets"},
		{"GET", "/secrets", "", "manage secrets"},
		{"GET", "/secrets/S", "", "manage secrets"},
		{"POST", "/secrets/S", `{"value":"v"}`, "manage secrets"},
		{"DELETE", "/secrets/S", "", "manage secrets"},
	}
	for _, c := range routes {
		rec := u.doJSON(c.method, c.path, unitKeyA, c.body)
		if rec.Code != http.StatusForbidden || !isJSONError(rec) || !strings.Contains(rec.Body.String(), "may "+c.what) {
			t.Errorf("team key %s %s: %d %s, want a JSON 403 naming %q", c.method, c.path, rec.Code, rec.Body, c.what)
		}
	}
	// The key the team key tried to delete is still there.
	if rec := u.doJSON("GET", "/keys/self", unitKeyB, ""); rec.Code != http.StatusOK {
		t.Errorf("team b's key after a team key's DELETE /keys/kb: %d %s", rec.Code, rec.Body)
	}
	for _, c := range routes {
		if rec := u.doJSON(c.method, c.path, unitAdminKey, c.body); rec.Code == http.StatusForbidden || rec.Code == http.StatusUnauthorized {
			t.Errorf("admin key %s %s: %d %s", c.method, c.path, rec.Code, rec.Body)
		}
	}
}

// TestUnitTenancy: a team key sees and acts on its team's sandboxes only;
// another team's answers 404 exactly as a sandbox that does not exist (its
// existence is not revealed), on every route that names a sandbox, and the
// core is never asked to act on it. The admin sees both.
func TestUnitTenancy(t *testing.T) {
	u := newUnitAPI(t)
	u.sbs.add("sbxa", u.srv.principal(mustKey(t, u, unitKeyA)).Owner())
	u.sbs.add("sbxb", u.srv.principal(mustKey(t, u, unitKeyB)).Owner())
	for _, p := range u.srv.mux.patterns {
		if !strings.Contains(p, "/sandboxes/{id}") {
			continue
		}
		method, path := routeReq(p)
		foreign := u.doJSON(method, strings.Replace(path, "nosuch", "sbxb", 1), unitKeyA, "{}")
		missing := u.doJSON(method, strings.Replace(path, "nosuch", "sbxz", 1), unitKeyA, "{}")
		// 501: a service the fakes do not configure answers so for both.
		if foreign.Code != missing.Code || foreign.Code != http.StatusNotFound && foreign.Code != http.StatusBadRequest && foreign.Code != http.StatusNotImplemented {
			t.Errorf("%s of another team's sandbox: %d %s; of a missing one: %d", p, foreign.Code, foreign.Body, missing.Code)
		}
		if foreign.Code == http.StatusNotFound && strings.Replace(foreign.Body.String(), "sbxb", "sbxz", 1) != missing.Body.String() {
			t.Errorf("%s: another team's sandbox answers %s, a missing one %s", p, foreign.Body, missing.Body)
		}
	}
	for _, c := range u.sbs.calls {
		if strings.HasSuffix(c, " sbxb") {
			t.Errorf("team a's key made the core act on team b's sandbox: %s", c)
		}
	}
	rec := u.doJSON("GET", "/sandboxes/sbxa", unitKeyA, "")
	if rec.Code != http.StatusOK {
		t.Errorf("own sandbox: %d %s", rec.Code, rec.Body)
	}
	if rec := u.doJSON("GET", "/sandboxes/sbxb", unitAdminKey, ""); rec.Code != http.StatusOK {
		t.Errorf("admin, team b's sandbox: %d %s", rec.Code, rec.Body)
	}
	if rec := u.doJSON("DELETE", "/sandboxes/sbxa", unitKeyB, ""); rec.Code != http.StatusNotFound {
		t.Errorf("team b kills team a's sandbox: %d %s", rec.Code, rec.Body)
	}
	if rec := u.doJSON("DELETE", "/sandboxes/sbxa", unitKeyA, ""); rec.Code != http.StatusNoContent {
		t.Errorf("team a kills its sandbox: %d %s", rec.Code, rec.Body)
	}
}
