package api_test

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/cella-sandbox/cella/internal/api"
)

// TestUnitOpenAPIConformance holds the answers the API builds from
// apiwire's types to the OpenAPI document, strictly (no undocumented
// field), over the fakes: no root, no daemon. The routes whose answers
// carry a sandbox's state are held to it against a real daemon
// (TestOpenAPIConformance): the fakes' sandboxes have none.
func TestUnitOpenAPIConformance(t *testing.T) {
	h, admin, key := api.UnitServer(t)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := newContract(t, srv.URL)

	_, body := c.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "timeout": 60, "metadata": map[string]string{"a": "b"}}, 201)
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(body, &sb); err != nil || sb.SandboxID == "" {
		t.Fatalf("create: %s", body)
	}
	c.do(t, "POST", "/sandboxes", key, map[string]any{"templateID": "base"}, 201)
	c.do(t, "POST", "/v2/sandboxes", key, map[string]any{"timeout": -1}, 400)
	c.do(t, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", key, map[string]any{"timeout": 30}, 200)
	c.do(t, "POST", "/sandboxes/"+sb.SandboxID+"/connect", key, map[string]any{}, 200)
	c.do(t, "POST", "/sandboxes/"+sb.SandboxID+"/timeout", key, map[string]any{"timeout": 30}, 204)
	c.do(t, "POST", "/sandboxes/"+sb.SandboxID+"/refreshes", key, map[string]any{"duration": 30}, 204)
	c.do(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", key, map[string]any{}, 204)
	c.do(t, "GET", "/sandboxes/nosuch", key, nil, 404)
	c.do(t, "DELETE", "/sandboxes/"+sb.SandboxID, key, nil, 204)

	c.do(t, "GET", "/pools", key, nil, 200)
	c.do(t, "PUT", "/pools/base", admin, map[string]any{"size": 2}, 200)
	c.do(t, "PUT", "/pools/base", key, map[string]any{"size": 2}, 403)
	c.do(t, "POST", "/volumes", key, map[string]any{"name": "data", "sizeMB": 64}, 201)
	c.do(t, "GET", "/volumes", key, nil, 200)
	c.do(t, "GET", "/volumes/nosuch", key, nil, 404)
	c.do(t, "GET", "/templates", key, nil, 200)
	c.do(t, "GET", "/snapshots", key, nil, 200)
	c.do(t, "GET", "/keys/self", key, nil, 200)
	c.do(t, "POST", "/keys", admin, map[string]any{"name": "ci"}, 201)
	c.do(t, "GET", "/keys", admin, nil, 200)
}
