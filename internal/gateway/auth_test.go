package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/clustertest"
	"github.com/cella-sandbox/cella/internal/gatewayauth"
)

// TestGatewayAuth: the gateway authenticates every API request before it
// routes — a missing or bad key is E2B's 401 whatever the path names (a
// sandbox that exists, one that does not, a create, a route the gateway
// does not serve); keys made through the gateway live in the cluster's
// Secret and work on the gateway and on the nodes; another team's key sees
// a sandbox as 404 (read, kill, pause); a revoked key is refused at once;
// and a node refuses an assertion it did not get from a gateway (a forged
// header, with or without a key of its own), so a client cannot claim
// another key by talking to a node directly.
func TestGatewayAuth(t *testing.T) {
	const ns = "cella-gwauth"
	cp, _ := clustertest.StartIn(t, ns)
	node := cp.StartNode(t, clustertest.NodeOptions{Name: "node-a", Namespace: ns})
	gw := cp.StartGateway(t, "gw-1", ns)
	admin := node.AdminKey(t)

	alice := newKey(t, gw.URL, admin, "alice", "alpha")
	bob := newKey(t, gw.URL, admin, "bob", "beta")

	code, body := call(t, "POST", gw.URL+"/sandboxes", alice, `{"templateID":"base","timeout":300}`)
	if code != http.StatusCreated {
		t.Fatalf("alice's create through the gateway: %d %s", code, body)
	}
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal([]byte(body), &sb); err != nil || sb.SandboxID == "" {
		t.Fatalf("create answer %s: %v", body, err)
	}
	t.Cleanup(func() { call(t, "DELETE", node.URL+"/sandboxes/"+sb.SandboxID, admin, "") })

	for _, bad := range []string{"", "e2b_00000000000000000000000000000000"} {
		for _, r := range []struct{ method, path, body string }{
			{"GET", "/sandboxes/" + sb.SandboxID, ""},
			{"GET", "/sandboxes/nosuchsandbox0000000", ""},
			{"DELETE", "/sandboxes/" + sb.SandboxID, ""},
			{"POST", "/sandboxes", `{"templateID":"base"}`},
			{"GET", "/v2/sandboxes", ""},
			{"GET", "/keys", ""},
			{"GET", "/no/such/route", ""},
		} {
			code, body := call(t, r.method, gw.URL+r.path, bad, r.body)
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if code != http.StatusUnauthorized || json.Unmarshal([]byte(body), &e) != nil || e.Code != 401 || e.Message == "" {
				t.Errorf("%s %s with key %q: %d %s; want E2B's 401 {code, message}", r.method, r.path, bad, code, body)
			}
		}
	}

	// Tenancy through the gateway, and the same keys on the node itself.
	for _, c := range []struct {
		who, key string
		want     int
	}{{"alice", alice, 200}, {"bob", bob, 404}, {"admin", admin, 200}} {
		if code, body := call(t, "GET", gw.URL+"/sandboxes/"+sb.SandboxID, c.key, ""); code != c.want {
			t.Errorf("%s reads alice's sandbox through the gateway: %d %s, want %d", c.who, code, body, c.want)
		}
		if code, body := call(t, "GET", node.URL+"/sandboxes/"+sb.SandboxID, c.key, ""); code != c.want {
			t.Errorf("%s reads alice's sandbox on the node: %d %s, want %d", c.who, code, body, c.want)
		}
	}
	for _, r := range []struct{ method, path string }{{"DELETE", ""}, {"POST", "/pause"}, {"POST", "/timeout"}} {
		if code, body := call(t, r.method, gw.URL+"/sandboxes/"+sb.SandboxID+r.path, bob, `{"timeout":10}`); code != http.StatusNotFound {
			t.Errorf("bob's %s %s on alice's sandbox: %d %s, want 404", r.method, r.path, code, body)
		}
	}

	// Forged assertions straight to the node: refused, with or without a
	// key of the forger's own.
	now := strconv.FormatInt(time.Now().Unix(), 10)
	for _, key := range []string{"", bob} {
		req, _ := http.NewRequest("GET", node.URL+"/sandboxes/"+sb.SandboxID, nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		req.Header.Set(gatewayauth.HeaderKey, "admin")
		req.Header.Set(gatewayauth.HeaderTime, now)
		req.Header.Set(gatewayauth.HeaderMAC, strings.Repeat("0", 64))
		code, body := do(t, req)
		if code != http.StatusUnauthorized {
			t.Errorf("a forged assertion (key %q) on the node: %d %s, want 401", key, code, body)
		}
	}
	// Sent to the gateway, a client's assertion headers are dropped: bob
	// stays bob.
	req, _ := http.NewRequest("GET", gw.URL+"/sandboxes/"+sb.SandboxID, nil)
	req.Header.Set("X-API-Key", bob)
	req.Header.Set(gatewayauth.HeaderKey, "admin")
	if code, body := do(t, req); code != http.StatusNotFound {
		t.Errorf("bob claiming admin through the gateway: %d %s, want 404", code, body)
	}

	// Revoked through the gateway: refused by the gateway and the node.
	var self struct {
		ID string `json:"id"`
	}
	_, body = call(t, "GET", gw.URL+"/keys/self", alice, "")
	if err := json.Unmarshal([]byte(body), &self); err != nil || self.ID == "" {
		t.Fatalf("GET /keys/self: %s %v", body, err)
	}
	if code, body := call(t, "DELETE", gw.URL+"/keys/"+self.ID, admin, ""); code != http.StatusNoContent {
		t.Fatalf("revoke alice's key: %d %s", code, body)
	}
	for _, u := range []string{gw.URL, node.URL} {
		if code, _ := call(t, "GET", u+"/sandboxes/"+sb.SandboxID, alice, ""); code != http.StatusUnauthorized {
			t.Errorf("a revoked key at %s: %d, want 401", u, code)
		}
	}
}

// newKey makes an API key of team through the gateway.
func newKey(t *testing.T, gw, admin, name, team string) string {
	t.Helper()
	return newKeyWith(t, gw, admin, name, team, "")
}

func call(t *testing.T, method, url, key, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, url, bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
