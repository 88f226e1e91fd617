package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/cella-sandbox/cella/internal/apiwire/spec"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/store"
)

// contract checks real exchanges with a running server against the OpenAPI
// document (internal/apiwire/openapi.yaml): each request must be one the
// document describes (its route, parameters and body), and each answer must
// have a status the operation declares and conform to the schema declared
// for it — strictly: an object may hold no field the document does not name
// (the document itself lets clients ignore unknown fields; this test holds
// the server to every field it writes being documented).
type contract struct {
	base            string
	lenient, strict routers.Router
}

func newContract(t *testing.T, base string) *contract {
	t.Helper()
	router := func(strict bool) routers.Router {
		doc, err := spec.Load()
		if err != nil {
			t.Fatal(err)
		}
		doc.Servers = openapi3.Servers{{URL: base}}
		if strict {
			closeObjects(doc)
		}
		r, err := gorillamux.NewRouter(doc)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	return &contract{base: base, lenient: router(false), strict: router(true)}
}

// closeObjects gives every object schema with properties that does not say
// otherwise additionalProperties: false.
func closeObjects(doc *openapi3.T) {
	seen := map[*openapi3.Schema]bool{}
	var walk func(*openapi3.SchemaRef)
	walk = func(ref *openapi3.SchemaRef) {
		if ref == nil || ref.Value == nil || seen[ref.Value] {
			return
		}
		s := ref.Value
		seen[s] = true
		if len(s.Properties) > 0 && s.AdditionalProperties.Has == nil && s.AdditionalProperties.Schema == nil {
			closed := false
			s.AdditionalProperties.Has = &closed
		}
		for _, p := range s.Properties {
			walk(p)
		}
		walk(s.Items)
		walk(s.AdditionalProperties.Schema)
		for _, refs := range []openapi3.SchemaRefs{s.AllOf, s.AnyOf, s.OneOf} {
			for _, r := range refs {
				walk(r)
			}
		}
	}
	for _, r := range doc.Components.Schemas {
		walk(r)
	}
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			for _, resp := range op.Responses.Map() {
				for _, mt := range resp.Value.Content {
					walk(mt.Schema)
				}
			}
		}
	}
}

// do sends one request and checks both sides of it against the document;
// it fails the test unless the answer's status is want.
func (c *contract) do(t *testing.T, method, path, key string, body any, want int) (http.Header, []byte) {
	t.Helper()
	var data []byte
	switch b := body.(type) {
	case nil:
	case string:
		data = []byte(b)
	default:
		data, _ = json.Marshal(b)
	}
	newReq := func() *http.Request {
		req, err := http.NewRequest(method, c.base+path, bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		if data != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		return req
	}
	ctx := context.Background()

	req := newReq()
	route, params, err := c.lenient.FindRoute(req)
	if err != nil {
		t.Fatalf("%s %s is not a route of the OpenAPI document: %v", method, path, err)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}}
	// A request the server refuses as bad may be one the document refuses
	// too; any other must be one it describes.
	if err := openapi3filter.ValidateRequest(ctx, in); err != nil && want != http.StatusBadRequest {
		t.Fatalf("%s %s %s: the request does not conform to the document: %v", method, path, data, err)
	}

	resp, err := http.DefaultClient.Do(newReq())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: status %d, want %d; body %s", method, path, resp.StatusCode, want, got)
	}
	if route.Operation.Responses.Status(want) == nil {
		t.Fatalf("%s %s answers %d, which the document does not declare for %s", method, path, want, route.Operation.OperationID)
	}

	req = newReq()
	sroute, sparams, err := c.strict.FindRoute(req)
	if err != nil {
		t.Fatal(err)
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: sparams, Route: sroute},
		Status:                 resp.StatusCode, Header: resp.Header, Body: io.NopCloser(bytes.NewReader(got)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		t.Fatalf("%s %s: the %d answer does not conform to the document's %s: %v\nbody: %s", method, path, resp.StatusCode, route.Operation.OperationID, err, got)
	}
	return resp.Header, got
}

// TestOpenAPIConformanceLight: the routes that need no sandbox, on a server
// with a real store, secrets and audit log but no sandbox manager.
func TestOpenAPIConformanceLight(t *testing.T) {
	e := startLight(t, true, true)
	c := newContract(t, e.env.URL)
	admin := e.adminKey

	c.do(t, "GET", "/health", "", nil, 204)
	c.do(t, "GET", "/openapi.json", "", nil, 200)
	c.do(t, "GET", "/ui/", "", nil, 200)
	c.do(t, "GET", "/keys", "", nil, 401)
	c.do(t, "GET", "/keys", "e2b_00000000000000000000000000000000", nil, 401)
	c.do(t, "GET", "/keys", e.userKey, nil, 403)
	c.do(t, "POST", "/v3/templates", admin, "{}", 501)

	c.do(t, "GET", "/keys/self", e.userKey, nil, 200)
	_, body := c.do(t, "POST", "/keys", admin, map[string]any{"name": "ci", "team": "ci-team", "secrets": []string{"GH_TOKEN"}, "mcpMaxCalls": 5}, 201)
	var k struct {
		ID string `json:"id"`
	}
	json.Unmarshal(body, &k)
	c.do(t, "POST", "/keys", admin, map[string]any{"name": "bad name"}, 400)
	c.do(t, "GET", "/keys", admin, nil, 200)
	c.do(t, "DELETE", "/keys/"+k.ID, admin, nil, 204)
	c.do(t, "DELETE", "/keys/"+k.ID, admin, nil, 404)
	c.do(t, "DELETE", "/keys/"+store.AdminKeyID, admin, nil, 409)

	_, body = c.do(t, "POST", "/secrets", admin, map[string]any{"name": "GH_TOKEN", "value": "t0k", "metadata": map[string]string{"owner": "ci"}}, 201)
	var sec struct {
		SecretID string `json:"secretID"`
	}
	json.Unmarshal(body, &sec)
	c.do(t, "POST", "/secrets", admin, map[string]any{"name": "GH_TOKEN", "value": "again"}, 409)
	c.do(t, "POST", "/secrets", admin, map[string]any{"name": "OTHER", "value": "x"}, 201)
	h, _ := c.do(t, "GET", "/secrets?limit=1", admin, nil, 200)
	if h.Get("X-Next-Token") == "" {
		t.Fatal("a first page of one of two secrets has no X-Next-Token")
	}
	c.do(t, "GET", "/secrets?limit=1&nextToken="+url.QueryEscape(h.Get("X-Next-Token")), admin, nil, 200)
	c.do(t, "GET", "/secrets/"+sec.SecretID, admin, nil, 200)
	c.do(t, "POST", "/secrets/GH_TOKEN", admin, map[string]any{"value": "t1k", "metadata": map[string]string{}}, 200)
	c.do(t, "GET", "/secrets/"+sec.SecretID, e.userKey, nil, 403)
	c.do(t, "DELETE", "/secrets/GH_TOKEN", admin, nil, 204)
	c.do(t, "GET", "/secrets/GH_TOKEN", admin, nil, 404)

	c.do(t, "GET", "/sandboxes/nosuchsandbox/logs", admin, nil, 404)
	c.do(t, "GET", "/v2/sandboxes/nosuchsandbox/logs?direction=backward", admin, nil, 404)
	c.do(t, "GET", "/v2/sandboxes/nosuchsandbox/logs?kind=nosuchkind", admin, nil, 400)
}

// TestOpenAPIConformance: the sandbox routes on a real daemon (the
// namespaces runtime: the shapes do not depend on the runtime), with
// sandboxes in each state the answers describe.
func TestOpenAPIConformance(t *testing.T) {
	env := daemontest.Start(t, runtime.Namespaces, daemontest.Options{Network: daemon.NetworkConfig{Allow: []string{"*.test"}}})
	c := newContract(t, env.URL)
	key := env.APIKey
	kill := func(id string) { t.Cleanup(func() { env.Client.Kill(context.Background(), id) }) }
	var sbx struct {
		SandboxID          string  `json:"sandboxID"`
		TrafficAccessToken *string `json:"trafficAccessToken"`
	}

	// The v1 create as e2b 2.50 sends it, the v2 one with every kind of field.
	_, body := c.do(t, "POST", "/sandboxes", key, map[string]any{"templateID": "base", "timeout": 300, "secure": true, "allow_internet_access": true}, 201)
	json.Unmarshal(body, &sbx)
	v1 := sbx.SandboxID
	kill(v1)
	_, body = c.do(t, "POST", "/v2/sandboxes", key, map[string]any{
		"templateID": "base", "timeout": 600, "metadata": map[string]string{"app": "openapi"}, "envVars": map[string]string{"FOO": "bar"},
		"network": map[string]any{
			"allowOut": []string{"api.test"}, "denyOut": []string{"0.0.0.0/0"}, "allowPublicTraffic": false,
			"rules": map[string]any{"api.test": []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"Authorization": "Bearer literal"}}}}},
		},
		"autoPause": true, "autoResume": map[string]bool{"enabled": true},
		"lifecycle": map[string]any{"autoStop": "1h", "autoArchiveDays": 7},
		"cpuCount":  0.5, "memoryMB": 256, "diskSizeMB": 512, "pidsLimit": 128, "outputLimitMB": 5,
	}, 201)
	sbx.TrafficAccessToken = nil
	json.Unmarshal(body, &sbx)
	v2 := sbx.SandboxID
	kill(v2)
	if sbx.TrafficAccessToken == nil {
		t.Fatalf("allowPublicTraffic false gave no trafficAccessToken: %s", body)
	}
	c.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "no-such-template"}, 404)
	c.do(t, "POST", "/v2/sandboxes", key, map[string]any{"timeout": -1}, 400)
	c.do(t, "POST", "/v2/sandboxes", key, map[string]any{"network": map[string]any{"allowOut": []string{"example.com"}, "denyOut": []string{"0.0.0.0/0"}}}, 403)

	c.do(t, "GET", "/sandboxes/"+v2, key, nil, 200)
	c.do(t, "GET", "/sandboxes", key, nil, 200)
	c.do(t, "GET", "/sandboxes?metadata="+url.QueryEscape("app=openapi"), key, nil, 200)
	h, _ := c.do(t, "GET", "/v2/sandboxes?state=running,paused&limit=1&order=asc", key, nil, 200)
	if h.Get("X-Next-Token") == "" {
		t.Fatal("a first page of one of two sandboxes has no X-Next-Token")
	}
	c.do(t, "GET", "/v2/sandboxes?limit=1&order=asc&nextToken="+url.QueryEscape(h.Get("X-Next-Token")), key, nil, 200)
	c.do(t, "GET", "/v2/sandboxes?state=sleeping", key, nil, 400)

	c.do(t, "POST", "/sandboxes/"+v2+"/timeout", key, map[string]any{"timeout": 900}, 204)
	c.do(t, "POST", "/sandboxes/"+v2+"/timeout", key, "{}", 400)
	c.do(t, "POST", "/sandboxes/"+v2+"/refreshes", key, map[string]any{"duration": 60}, 204)
	c.do(t, "PUT", "/sandboxes/"+v2+"/network", key, map[string]any{"allowOut": []string{"api.test", "*.pkg.test"}, "denyOut": []string{"0.0.0.0/0"}}, 204)
	c.do(t, "PUT", "/sandboxes/"+v2+"/network", key, map[string]any{"allowOut": []string{"example.com"}, "denyOut": []string{"0.0.0.0/0"}}, 403)

	c.do(t, "GET", "/sandboxes/"+v2+"/metrics", key, nil, 200)
	c.do(t, "GET", fmt.Sprintf("/sandboxes/%s/metrics?start=%d&end=%d", v2, time.Now().Add(-time.Hour).Unix(), time.Now().Unix()), key, nil, 200)
	c.do(t, "GET", "/sandboxes/"+v2+"/metrics?start=20&end=10", key, nil, 400)
	c.do(t, "GET", "/sandboxes/metrics?sandbox_ids="+v1+","+v2+",nosuchsandbox", key, nil, 200)
	c.do(t, "GET", "/sandboxes/metrics", key, nil, 400)

	// Processes: a wait that matches, one that times out, one whose
	// process ends first; the logs of both processes.
	sb, err := env.Client.Sandbox(context.Background(), v2)
	if err != nil {
		t.Fatal(err)
	}
	running := startBG(t, sb, "echo ready; echo oops >&2; sleep 600")
	ended := startBG(t, sb, "echo done; exit 3")
	c.do(t, "POST", "/sandboxes/"+v2+"/wait", key, map[string]any{"log": "^ready$", "pid": running, "timeout": 30}, 200)
	c.do(t, "POST", "/sandboxes/"+v2+"/wait", key, map[string]any{"port": 1, "timeout": "200ms"}, 408)
	c.do(t, "POST", "/sandboxes/"+v2+"/wait", key, map[string]any{"log": "never", "pid": ended, "timeout": "30s"}, 409)
	c.do(t, "POST", "/sandboxes/"+v2+"/wait", key, map[string]any{"log": "x"}, 400)
	c.do(t, "GET", fmt.Sprintf("/sandboxes/%s/processes/%d/logs", v2, running), key, nil, 200)
	c.do(t, "GET", fmt.Sprintf("/sandboxes/%s/processes/%d/logs?stream=stderr", v2, ended), key, nil, 200)
	c.do(t, "GET", fmt.Sprintf("/sandboxes/%s/processes/%d/logs?format=text", v2, running), key, nil, 200)
	c.do(t, "GET", fmt.Sprintf("/sandboxes/%s/processes/%d/logs", v2, 999999), key, nil, 404)

	// The audit log, once it holds a process's end (the agent reports it).
	deadline := time.Now().Add(time.Minute)
	for {
		_, body := c.do(t, "GET", "/v2/sandboxes/"+v2+"/logs?kind=process.exit", key, nil, 200)
		if strings.Contains(string(body), `"kind":"process.exit"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no process.exit entry in the audit log after a minute: %s", body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.do(t, "GET", "/sandboxes/"+v2+"/logs", key, nil, 200)
	c.do(t, "GET", "/v2/sandboxes/"+v2+"/logs?direction=backward&limit=5", key, nil, 200)
	c.do(t, "GET", "/sandboxes/"+v2+"/logs?direction=backward", key, nil, 400)

	// Snapshots and forks.
	_, body = c.do(t, "POST", "/sandboxes/"+v1+"/snapshots", key, map[string]any{"name": "openapi-snap"}, 201)
	var snap struct {
		SnapshotID string `json:"snapshotID"`
	}
	json.Unmarshal(body, &snap)
	c.do(t, "GET", "/snapshots", key, nil, 200)
	c.do(t, "GET", "/snapshots?sandboxID="+v1+"&limit=1", key, nil, 200)
	c.do(t, "GET", "/snapshots?limit=0", key, nil, 400)
	_, body = c.do(t, "POST", "/sandboxes/"+v1+"/fork", key, map[string]any{"count": 1, "timeout": 120}, 201)
	var forks []struct {
		Sandbox *struct {
			SandboxID string `json:"sandboxID"`
		} `json:"sandbox"`
	}
	json.Unmarshal(body, &forks)
	for _, f := range forks {
		if f.Sandbox != nil {
			kill(f.Sandbox.SandboxID)
		}
	}
	c.do(t, "POST", "/sandboxes/"+v1+"/fork", key, map[string]any{"count": 33}, 400)
	c.do(t, "DELETE", "/templates/"+snap.SnapshotID, key, nil, 204)
	c.do(t, "DELETE", "/templates/"+snap.SnapshotID, key, nil, 404)
	c.do(t, "DELETE", "/templates/base", key, nil, 409) // v1 runs on it
	c.do(t, "GET", "/templates", key, nil, 200)
	c.do(t, "GET", "/pools", key, nil, 200)

	// Pause, the paused detail, a second pause, connect (resumes), connect
	// again (running), the deprecated resume of a running sandbox.
	c.do(t, "POST", "/sandboxes/"+v1+"/pause", key, "{}", 204)
	c.do(t, "GET", "/sandboxes/"+v1, key, nil, 200)
	c.do(t, "POST", "/sandboxes/"+v1+"/pause", key, nil, 409)
	c.do(t, "POST", "/sandboxes/"+v1+"/snapshots", key, nil, 409)
	c.do(t, "POST", "/v2/sandboxes/"+v1+"/connect", key, "{}", 201)
	c.do(t, "POST", "/sandboxes/"+v1+"/connect", key, map[string]any{"timeout": 300}, 200)
	c.do(t, "POST", "/sandboxes/"+v1+"/resume", key, map[string]any{"timeout": 300}, 409)

	// Volumes.
	c.do(t, "POST", "/volumes", key, map[string]any{"name": "openapi-vol", "size": "16M"}, 201)
	t.Cleanup(func() { env.Client.DeleteVolume(context.Background(), "openapi-vol") }) // if the test stops before its DELETE
	c.do(t, "POST", "/volumes", key, map[string]any{"name": "openapi-vol", "sizeMB": 16}, 409)
	c.do(t, "POST", "/volumes", key, map[string]any{"name": "x", "sizeMB": 16, "size": "16M"}, 400)
	c.do(t, "GET", "/volumes", key, nil, 200)
	c.do(t, "GET", "/volumes/openapi-vol", key, nil, 200)
	c.do(t, "DELETE", "/volumes/openapi-vol", key, nil, 204)
	c.do(t, "GET", "/volumes/openapi-vol", key, nil, 404)

	// Kill, and what is left of a killed sandbox.
	c.do(t, "DELETE", "/sandboxes/"+v2, key, nil, 204)
	c.do(t, "GET", "/sandboxes/"+v2, key, nil, 404)
	c.do(t, "DELETE", "/sandboxes/"+v2, key, nil, 404)
	c.do(t, "POST", "/sandboxes/"+v2+"/pause", key, nil, 404)
	c.do(t, "GET", "/sandboxes/"+v2+"/logs", key, nil, 200)
	c.do(t, "GET", "/metrics", key, nil, 200)
}
