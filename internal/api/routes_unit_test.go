package api

import (
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// publicRoutes need no API key: public ones, and those that carry a
// credential of their own (a volume's content token, a template file's
// upload link), checked by their handlers.
var publicRoutes = map[string]bool{"GET /health": true, "GET /openapi.json": true, "GET /ui/": true,
	"PUT /templates/{templateID}/files/{hash}": true}

func isPublic(pattern string) bool {
	_, path, _ := strings.Cut(pattern, " ")
	return publicRoutes[pattern] || strings.HasPrefix(path, "/volumecontent/")
}

var wildcard = regexp.MustCompile(`\{[^}]+\}`)

// routeReq is a request for a registered pattern: its method (GET for a
// pattern without one) and its path with every wildcard filled in.
func routeReq(pattern string) (method, path string) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		method, path = http.MethodGet, pattern
	}
	return method, wildcard.ReplaceAllString(path, "nosuch")
}

// TestUnitRoutesNeedKey: every route but the public ones answers 401 in
// the JSON shape without a key, with a wrong key, and never reaches its
// handler (no call reaches the core).
func TestUnitRoutesNeedKey(t *testing.T) {
	u := newUnitAPI(t)
	u.sbs.add("nosuch", u.srv.principal(mustKey(t, u, unitKeyA)).Owner())
	for _, p := range u.srv.mux.patterns {
		if isPublic(p) {
			continue
		}
		method, path := routeReq(p)
		for key, msg := range map[string]string{"": "missing API key", "e2b_wrong": "invalid API key"} {
			rec := u.doJSON(method, path, key, "{}")
			if rec.Code != http.StatusUnauthorized || !isJSONError(rec) || !strings.Contains(rec.Body.String(), msg) {
				t.Errorf("%s key %q: %d %q %s, want a 401 JSON %q", p, key, rec.Code, rec.Header().Get("Content-Type"), rec.Body, msg)
			}
		}
	}
	if len(u.sbs.calls) != 0 || len(u.sbs.created) != 0 {
		t.Errorf("requests without a valid key reached the core: %v, %d creates", u.sbs.calls, len(u.sbs.created))
	}
	// The bearer form is a key too.
	r := u.doJSON("GET", "/v2/sandboxes", "", "")
	if r.Code != http.StatusUnauthorized {
		t.Fatalf("no key: %d", r.Code)
	}
	rec := u.do2("GET", "/v2/sandboxes", map[string]string{"Authorization": "Bearer " + unitKeyA})
	if rec.Code != http.StatusOK {
		t.Errorf("bearer key: %d %s", rec.Code, rec.Body)
	}
}

// TestUnitRoutesErrorsAreJSON walks every registered route with bad input
// (malformed JSON, a sandbox that does not exist, a foreign sandbox) as
// the admin and as a team key: whatever it answers, an error is the JSON
// shape, and bad input is never a 5xx but a feature this daemon lacks
// (501).
func TestUnitRoutesErrorsAreJSON(t *testing.T) {
	u := newUnitAPI(t)
	u.sbs.add("foreign", u.srv.principal(mustKey(t, u, unitKeyB)).Owner())
	for _, p := range u.srv.mux.patterns {
		method, path := routeReq(p)
		for _, key := range []string{unitAdminKey, unitKeyA} {
			for _, c := range []struct{ path, body string }{
				{path, "{"},
				{path, `{"timeout": "soon", "count": -1, "size": "x"}`},
				{strings.ReplaceAll(path, "nosuch", "foreign"), "{}"},
			} {
				rec := u.doJSON(method, c.path, key, c.body)
				if rec.Code < 400 {
					continue
				}
				if !isJSONError(rec) {
					t.Errorf("%s %s %s: %d %q %s, want the JSON error shape", method, c.path, c.body, rec.Code, rec.Header().Get("Content-Type"), rec.Body)
				}
				if rec.Code >= 500 && rec.Code != http.StatusNotImplemented && rec.Code != http.StatusBadGateway {
					t.Errorf("%s %s %s: %d %s, bad input is not the daemon's failure", method, c.path, c.body, rec.Code, rec.Body)
				}
			}
		}
	}
}

// TestUnitRouteMethods: each registered path answers a method it does not
// serve with a JSON 405 naming the ones it does, and an unknown path with
// a JSON 404.
func TestUnitRouteMethods(t *testing.T) {
	u := newUnitAPI(t)
	methods := map[string][]string{} // path → methods of every pattern it matches
	for _, p := range u.srv.mux.patterns {
		if !strings.Contains(p, " ") {
			continue // every method
		}
		_, path := routeReq(p)
		for _, q := range u.srv.mux.patterns {
			if m, pat, ok := strings.Cut(q, " "); ok && patternMatches(pat, path) && !slices.Contains(methods[path], m) {
				methods[path] = append(methods[path], m)
			}
		}
	}
	for path, ms := range methods {
		i := slices.IndexFunc([]string{http.MethodPatch, http.MethodPut, http.MethodDelete, http.MethodPost}, func(m string) bool { return !slices.Contains(ms, m) })
		if i < 0 {
			t.Fatalf("%s serves every method tried", path)
		}
		wrong := []string{http.MethodPatch, http.MethodPut, http.MethodDelete, http.MethodPost}[i]
		rec := u.doJSON(wrong, path, unitAdminKey, "")
		if rec.Code != http.StatusMethodNotAllowed || !isJSONError(rec) {
			t.Errorf("%s %s: %d %s, want a JSON 405", wrong, path, rec.Code, rec.Body)
			continue
		}
		for _, m := range ms {
			if !strings.Contains(rec.Header().Get("Allow"), m) || !strings.Contains(rec.Body.String(), m) {
				t.Errorf("%s %s: Allow %q, body %s, want them to name %s", wrong, path, rec.Header().Get("Allow"), rec.Body, m)
			}
		}
	}
	for _, path := range []string{"/nope", "/sandboxes/x/y/z", "/v9/sandboxes"} {
		if rec := u.doJSON("GET", path, unitAdminKey, ""); rec.Code != http.StatusNotFound || !isJSONError(rec) || !strings.Contains(rec.Body.String(), "no such route") {
			t.Errorf("GET %s: %d %s, want a JSON 404", path, rec.Code, rec.Body)
		}
	}
}

// patternMatches reports whether a ServeMux pattern's path (no method)
// matches path: a wildcard segment matches any one segment, {x...} and a
// trailing slash the rest.
func patternMatches(pattern, path string) bool {
	ps, xs := strings.Split(pattern, "/"), strings.Split(path, "/")
	for i, seg := range ps {
		switch {
		case strings.HasSuffix(seg, "...}") || (seg == "" && i == len(ps)-1 && i > 0):
			return len(xs) >= i
		case i >= len(xs):
			return false
		case strings.HasPrefix(seg, "{"):
		case seg != xs[i]:
			return false
		}
	}
	return len(ps) == len(xs)
}
