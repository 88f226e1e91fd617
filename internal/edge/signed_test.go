package edge

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/cella-sandbox/cella/internal/agentapi"
)

// TestSignedURLRouting: a signed file URL made against E2B_SANDBOX_URL
// (no sandbox ID, no routing headers) reaches the sandbox whose token made
// the signature, whichever of several; a signature no sandbox makes, a
// signature for another operation, or a tampered path is not sandbox
// traffic (the API's 404, here the teapot).
func TestSignedURLRouting(t *testing.T) {
	backends := map[string]*httptest.Server{}
	sbs := testRouter{}
	for _, id := range []string{"alpha", "beta", "gamma"} {
		backends[id] = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "inside %s %s %s", id, r.Method, r.URL.RequestURI())
		}))
		defer backends[id].Close()
		sbs[id] = &testSandbox{id: id, envd: "token-" + id, backend: backends[id]}
	}
	sbs["open"] = &testSandbox{id: "open", backend: backends["alpha"]} // no token: never matched
	p := New(Config{Router: sbs, Domain: "cella.test"})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !p.Handle(w, r) {
			w.WriteHeader(http.StatusTeapot)
		}
	})
	signed := func(path, op, user, token string, exp int64) string {
		q := url.Values{"path": {path}, "signature": {agentapi.Signature(path, op, user, token, exp)}}
		if user != "" {
			q.Set("username", user)
		}
		if exp != 0 {
			q.Set("signature_expiration", fmt.Sprint(exp))
		}
		return "/files?" + q.Encode()
	}
	cases := []struct {
		name, method, target string
		host                 string
		want                 int
		inside               string
	}{
		{"read for beta", "GET", signed("/home/user/a.txt", "read", "user", "token-beta", 0), "127.0.0.1:3000", 200, "inside beta GET"},
		{"write for gamma, with expiry", "POST", signed("/tmp/x", "write", "", "token-gamma", 4102444800), "localhost:3000", 200, "inside gamma POST"},
		{"sandbox.<domain>", "GET", signed("/a", "read", "", "token-alpha", 0), "sandbox.cella.test", 200, "inside alpha GET"},
		{"a read signature used to write", "POST", signed("/a", "read", "", "token-alpha", 0), "127.0.0.1:3000", http.StatusTeapot, ""},
		{"no sandbox's token", "GET", signed("/a", "read", "", "token-other", 0), "127.0.0.1:3000", http.StatusTeapot, ""},
		{"the path changed", "GET", strings.Replace(signed("/a", "read", "", "token-alpha", 0), "path=%2Fa", "path=%2Fetc%2Fshadow", 1), "127.0.0.1:3000", http.StatusTeapot, ""},
		{"an empty token's signature", "GET", signed("/a", "read", "", "", 0), "127.0.0.1:3000", http.StatusTeapot, ""},
		{"another route", "GET", strings.Replace(signed("/a", "read", "", "token-alpha", 0), "/files", "/sandboxes", 1), "127.0.0.1:3000", http.StatusTeapot, ""},
		{"a named host is not generic", "GET", signed("/a", "read", "", "token-alpha", 0), "example.org", http.StatusTeapot, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(c.method, c.target, nil)
			r.Host = c.host
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != c.want || !strings.HasPrefix(w.Body.String(), c.inside) {
				t.Fatalf("%s %s: %d %q, want %d %q", c.method, c.target, w.Code, w.Body.String(), c.want, c.inside)
			}
		})
	}
}
