package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// TestAccessLog: one JSON line per API request with the key's name, the
// route pattern, the status, the latency, the sandbox and the request ID —
// and none of the keys, tokens and secret values the requests carried, in
// headers, query strings or bodies, nor the raw path.
func TestAccessLog(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "access.log")
	env := daemontest.Start(t, runtime.Namespaces, daemontest.Options{AccessLog: logPath})
	a := apiT{env: env}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	k, err := env.Client.CreateKey(ctx, client.NewKey{Name: "logged", Secrets: []string{"*"}})
	if err != nil {
		t.Fatal(err)
	}
	const (
		secretValue = "sk-live-SECRETVALUE-5f1e"
		envValue    = "ENVVALUE-9a8b7c"
		fakeToken   = "TOKENVALUE-0c0ffee"
		pathSecret  = "PATHSECRET-1234"
	)
	secretsOf := []string{k.Key, env.APIKey, secretValue, envValue, fakeToken, pathSecret}

	type req struct {
		method, path string
		key          string
		body         any
		hdr          map[string]string
		wantStatus   int
		wantRoute    string
	}
	var sandboxID, accessToken string
	reqs := []req{
		{"POST", "/secrets", env.APIKey, map[string]any{"name": "LOGTEST", "value": secretValue}, nil, 201, "POST /secrets"},
		{"POST", "/v2/sandboxes", k.Key, map[string]any{"templateID": "base", "envVars": map[string]string{"E": envValue}, "secretEnvVars": map[string]string{"S": "LOGTEST"}}, nil, 201, "POST /v2/sandboxes"},
	}
	var ids []string
	check := func(r req) {
		t.Helper()
		hdr := map[string]string{}
		for k, v := range r.hdr {
			hdr[k] = v
		}
		var st int
		var h map[string][]string
		var b []byte
		if r.key == "bearer" {
			hdr["Authorization"] = "Bearer " + k.Key
			st, h, b = a.do(t, r.method, r.path, "", r.body, hdr)
		} else {
			st, h, b = a.do(t, r.method, r.path, r.key, r.body, hdr)
		}
		if st != r.wantStatus {
			t.Fatalf("%s %s: %d %s, want %d", r.method, r.path, st, b, r.wantStatus)
		}
		if r.path == "/v2/sandboxes" && r.method == "POST" {
			var sb client.Sandbox
			json.Unmarshal(b, &sb)
			sandboxID, accessToken = sb.SandboxID, sb.EnvdAccessToken
			secretsOf = append(secretsOf, accessToken)
		}
		id := strings.Join(h["X-Request-Id"], "")
		if id == "" {
			t.Fatalf("%s %s: no X-Request-Id", r.method, r.path)
		}
		ids = append(ids, id)
	}
	for _, r := range reqs {
		check(r)
	}
	defer env.Client.Kill(context.WithoutCancel(ctx), sandboxID)
	for _, r := range []req{
		{"GET", "/sandboxes/" + sandboxID, "bearer", nil, map[string]string{"X-Access-Token": accessToken, "E2b-Traffic-Access-Token": fakeToken}, 200, "GET /sandboxes/{id}"},
		{"GET", "/v2/sandboxes?nextToken=" + fakeToken + "&key=" + k.Key, k.Key, nil, nil, 400, "GET /v2/sandboxes"},
		{"POST", "/sandboxes/" + sandboxID + "/timeout", k.Key, map[string]any{"timeout": 300, "token": fakeToken}, nil, 204, "POST /sandboxes/{id}/timeout"},
		{"GET", "/sandboxes/" + pathSecret, k.Key, nil, nil, 404, "GET /sandboxes/{id}"},
		{"GET", "/nosuch/" + pathSecret + "?key=" + k.Key, k.Key, nil, nil, 404, "unmatched"},
		{"GET", "/keys/self", "", nil, map[string]string{"X-API-Key": fakeToken}, 401, "GET /keys/self"},
		{"POST", "/keys", env.APIKey, map[string]any{"name": "made-" + fakeToken[:5]}, nil, 201, "POST /keys"},
		{"DELETE", "/sandboxes/" + sandboxID, k.Key, nil, nil, 204, "DELETE /sandboxes/{id}"},
	} {
		reqs = append(reqs, r)
		check(r)
	}

	// The lines of our requests, by request ID.
	lines := map[string]map[string]any{}
	f, err := os.Open(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw, _ := os.ReadFile(logPath)
	for _, s := range secretsOf {
		if strings.Contains(string(raw), s) {
			t.Errorf("the access log holds %q", s)
		}
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not a JSON line: %q", sc.Text())
		}
		if id, _ := m["request_id"].(string); id != "" {
			if lines[id] != nil {
				t.Fatalf("two lines for request %s", id)
			}
			lines[id] = m
		}
	}
	for i, r := range reqs {
		m := lines[ids[i]]
		if m == nil {
			t.Fatalf("no line for %s %s (request %s)", r.method, r.path, ids[i])
		}
		wantKey := "logged"
		switch {
		case r.key == env.APIKey:
			wantKey = "admin"
		case r.key == "" || r.wantRoute == "unmatched": // no key was checked
			wantKey = ""
		}
		if m["route"] != r.wantRoute || m["status"] != float64(r.wantStatus) || m["key"] != wantKey || m["method"] != r.method {
			t.Errorf("%s %s: line %v; want route %q status %d key %q", r.method, r.path, m, r.wantRoute, r.wantStatus, wantKey)
		}
		if d, ok := m["duration_ms"].(float64); !ok || d < 0 {
			t.Errorf("%s %s: duration_ms %v", r.method, r.path, m["duration_ms"])
		}
		wantSB := ""
		if strings.HasPrefix(r.wantRoute, "POST /v2/sandboxes") || strings.Contains(r.path, "/sandboxes/"+sandboxID) {
			wantSB = sandboxID
		}
		if m["sandbox_id"] != wantSB {
			t.Errorf("%s %s: sandbox_id %v, want %q", r.method, r.path, m["sandbox_id"], wantSB)
		}
	}
}
