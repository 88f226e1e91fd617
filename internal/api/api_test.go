package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/rootfs"
	"github.com/cella-sandbox/cella/internal/runtime"
)

type apiT struct {
	env *daemontest.Env
}

func (a apiT) do(t *testing.T, method, path, key string, body any, hdr map[string]string) (int, http.Header, []byte) {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, a.env.URL+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, data
}

// wantError checks a JSON error body {"code":status,"message":...}.
func (a apiT) wantError(t *testing.T, status int, gotStatus int, body []byte, contains string) {
	t.Helper()
	if gotStatus != status {
		t.Fatalf("status %d, want %d; body %s", gotStatus, status, body)
	}
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body is not JSON: %q", body)
	}
	if e.Code != status || e.Message == "" {
		t.Fatalf("error body %s: want code %d and a message", body, status)
	}
	if contains != "" && !strings.Contains(e.Message, contains) {
		t.Fatalf("error message %q does not mention %q", e.Message, contains)
	}
}

func sandboxDirs(t *testing.T, env *daemontest.Env) []string {
	entries, _ := os.ReadDir(filepath.Join(env.DataDir, "sandboxes"))
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func TestAPI(t *testing.T) {
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{Network: daemon.NetworkConfig{Allow: []string{"1.1.1.1/32", "*.test"}}})
	a := apiT{env: env}
	key := env.APIKey
	parent := t

	t.Run("HealthWithoutKey", func(t *testing.T) {
		if st, _, _ := a.do(t, "GET", "/health", "", nil, nil); st != http.StatusNoContent {
			t.Fatalf("GET /health: %d", st)
		}
	})
	t.Run("Auth", func(t *testing.T) {
		st, _, body := a.do(t, "GET", "/v2/sandboxes", "", nil, nil)
		a.wantError(t, 401, st, body, "API key")
		st, _, body = a.do(t, "GET", "/v2/sandboxes", "e2b_00000000000000000000000000000000", nil, nil)
		a.wantError(t, 401, st, body, "invalid API key")
		st, _, body = a.do(t, "POST", "/sandboxes", "wrong", map[string]any{"templateID": "base"}, nil)
		a.wantError(t, 401, st, body, "")
	})
	t.Run("BadInputCreatesNothing", func(t *testing.T) {
		st, _, body := a.do(t, "POST", "/sandboxes", key, `{"templateID": "base", "timeout":`, nil)
		a.wantError(t, 400, st, body, "invalid JSON")
		st, _, body = a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "no-such-template"}, nil)
		a.wantError(t, 404, st, body, "no-such-template")
		st, _, body = a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "timeout": -5}, nil)
		a.wantError(t, 400, st, body, "timeout must be between 0 and 86400 seconds")
		st, _, body = a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "timeout": "soon"}, nil)
		a.wantError(t, 400, st, body, "timeout")
		st, _, body = a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "../../etc"}, nil)
		a.wantError(t, 400, st, body, "invalid template")
		st, _, body = a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "memoryMB": 1}, nil)
		a.wantError(t, 400, st, body, "memory")
		if d := sandboxDirs(t, env); len(d) != 0 {
			t.Fatalf("bad requests left sandbox dirs behind: %v", d)
		}
		st, _, body = a.do(t, "GET", "/v2/sandboxes", key, nil, nil)
		if st != 200 || strings.TrimSpace(string(body)) != "[]" {
			t.Fatalf("list after bad creates: %d %s", st, body)
		}
	})
	t.Run("UnknownRouteAndBadTemplateName", func(t *testing.T) {
		st, _, body := a.do(t, "GET", "/nope", key, nil, nil)
		a.wantError(t, 404, st, body, "")
		st, _, body = a.do(t, "POST", "/v3/templates", key, "{}", nil) // templatebuilds_test.go has the rest
		a.wantError(t, 400, st, body, "Invalid template name")
		st, _, body = a.do(t, "PATCH", "/sandboxes/abc", key, nil, nil)
		a.wantError(t, 405, st, body, "")
	})

	// One sandbox made the way e2b 2.50 does (v1), one the 2.51 way (v2).
	var v1, v2 struct {
		SandboxID       string  `json:"sandboxID"`
		TemplateID      string  `json:"templateID"`
		ClientID        string  `json:"clientID"`
		EnvdVersion     string  `json:"envdVersion"`
		EnvdAccessToken string  `json:"envdAccessToken"`
		Domain          string  `json:"domain"`
		Traffic         *string `json:"trafficAccessToken"`
	}
	t.Run("CreateV1", func(t *testing.T) {
		st, _, body := a.do(t, "POST", "/sandboxes", key, map[string]any{"templateID": "base", "timeout": 300, "secure": true, "allow_internet_access": true}, nil)
		if st != 201 {
			t.Fatalf("create v1: %d %s", st, body)
		}
		json.Unmarshal(body, &v1)
		if v1.SandboxID == "" || v1.EnvdVersion == "" || v1.EnvdAccessToken == "" || v1.Domain != "cella.test" || v1.ClientID == "" {
			t.Fatalf("create v1 body: %s", body)
		}
		parent.Cleanup(func() { env.Client.Kill(context.Background(), v1.SandboxID) })
	})
	t.Run("CreateV2", func(t *testing.T) {
		st, _, body := a.do(t, "POST", "/v2/sandboxes", key, map[string]any{
			"templateID": "base", "timeout": 120, "metadata": map[string]string{"user": "a b", "k&": "v=1"},
			"envVars": map[string]string{"FOO": "bar"}, "network": map[string]any{"allowOut": []string{"1.1.1.1"}, "denyOut": []string{"0.0.0.0/0"}},
			"autoPause": false, "someFutureField": 1,
		}, nil)
		if st != 201 {
			t.Fatalf("create v2: %d %s", st, body)
		}
		json.Unmarshal(body, &v2)
		parent.Cleanup(func() { env.Client.Kill(context.Background(), v2.SandboxID) })
	})
	t.Run("Detail", func(t *testing.T) {
		st, _, body := a.do(t, "GET", "/sandboxes/"+v2.SandboxID, key, nil, nil)
		if st != 200 {
			t.Fatalf("get: %d %s", st, body)
		}
		var d map[string]any
		json.Unmarshal(body, &d)
		for _, f := range []string{"sandboxID", "templateID", "metadata", "startedAt", "endAt", "state", "cpuCount", "memoryMB", "envdVersion", "network", "allowInternetAccess"} {
			if _, ok := d[f]; !ok {
				t.Fatalf("detail lacks %q: %s", f, body)
			}
		}
		if d["state"] != "running" || d["allowInternetAccess"] != true {
			t.Fatalf("detail: %s", body)
		}
		start, _ := time.Parse(time.RFC3339, d["startedAt"].(string))
		end, _ := time.Parse(time.RFC3339, d["endAt"].(string))
		if got := end.Sub(start); got < 119*time.Second || got > 121*time.Second {
			t.Fatalf("endAt-startedAt = %v, want 120s", got)
		}
		// E2B's fields echo the request; cella adds what is enforced.
		var net struct {
			AllowOut  []string `json:"allowOut"`
			DenyOut   []string `json:"denyOut"`
			Effective struct {
				AllowOut []string `json:"allowOut"`
			} `json:"effective"`
			Summary string `json:"summary"`
		}
		b, _ := json.Marshal(d["network"])
		json.Unmarshal(b, &net)
		if fmt.Sprint(net.AllowOut) != "[1.1.1.1]" || fmt.Sprint(net.DenyOut) != "[0.0.0.0/0]" ||
			fmt.Sprint(net.Effective.AllowOut) != "[1.1.1.1]" || !strings.Contains(net.Summary, "1.1.1.1") {
			t.Fatalf("detail does not report the requested and effective network: %s", b)
		}
		// An allowOut entry beyond the operator's ceiling is refused with
		// the ceiling and how to raise it, and creates nothing.
		st, _, body = a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "network": map[string]any{"allowOut": []string{"example.com"}}}, nil)
		a.wantError(t, 403, st, body, "outside this sandbox's egress ceiling (allowed: 1.1.1.1/32, *.test)")
		a.wantError(t, 403, st, body, "--egress-allow")
		st, _, body = a.do(t, "GET", "/sandboxes/doesnotexist", key, nil, nil)
		a.wantError(t, 404, st, body, "not found")
	})
	t.Run("EnvVarsReachCommands", func(t *testing.T) {
		sb, err := env.Client.Sandbox(context.Background(), v2.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		res, err := sb.Exec(context.Background(), "echo $FOO", client.ExecOptions{})
		if err != nil || res.Stdout != "bar\n" {
			t.Fatalf("envVars: %v %+v", err, res)
		}
	})
	t.Run("SecretEnvVars", func(t *testing.T) {
		// The weaker option, asked for by name: the value reaches the
		// environment, the record keeps only the name.
		value := "sv-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-x"
		if st, _, body := a.do(t, "POST", "/secrets", key, map[string]any{"name": "ENV_SECRET", "value": value}, nil); st != 201 {
			t.Fatalf("create secret: %d %s", st, body)
		}
		st, _, body := a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "secretEnvVars": map[string]string{"TOKEN": "ENV_SECRET"}}, nil)
		if st != 201 {
			t.Fatalf("create with secretEnvVars: %d %s", st, body)
		}
		var sbr struct{ SandboxID string }
		json.Unmarshal(body, &sbr)
		defer env.Client.Kill(context.Background(), sbr.SandboxID)
		sb, _ := env.Client.Sandbox(context.Background(), sbr.SandboxID)
		if res, err := sb.Exec(context.Background(), "echo $TOKEN", client.ExecOptions{}); err != nil || res.Stdout != value+"\n" {
			t.Fatalf("secret env: %v %+v", err, res)
		}
		if _, _, body := a.do(t, "GET", "/sandboxes/"+sbr.SandboxID, key, nil, nil); strings.Contains(string(body), value) {
			t.Fatalf("the detail shows the secret: %s", body)
		}
		// The value is on no file of the sandbox's on the host (its agent's
		// config, in the run dir or its host-only copy, the bundle), and a
		// cold boot on the kept files (pause without memory) gets it again.
		noValueOnDisk := func(t *testing.T) {
			t.Helper()
			dir := filepath.Join(env.DataDir, "sandboxes", sbr.SandboxID)
			checked := 0
			filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
				if err != nil {
					return nil
				}
				if d.IsDir() && p != dir && (d.Name() == rootfs.RootFSDir || d.Name() == rootfs.LayerDir) {
					return filepath.SkipDir // the sandbox's own files
				}
				if d.Type().IsRegular() {
					checked++
					if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(value)) {
						t.Fatalf("%s holds the secret's value", p)
					}
				}
				return nil
			})
			if checked == 0 {
				t.Fatalf("no file checked under %s", dir)
			}
		}
		noValueOnDisk(t)
		if err := env.Client.Pause(context.Background(), sbr.SandboxID, false); err != nil {
			t.Fatal(err)
		}
		noValueOnDisk(t)
		if _, err := env.Client.Connect(context.Background(), sbr.SandboxID); err != nil {
			t.Fatal(err)
		}
		noValueOnDisk(t)
		if res, err := sb.Exec(context.Background(), "echo $TOKEN", client.ExecOptions{}); err != nil || res.Stdout != value+"\n" {
			t.Fatalf("secret env after a cold boot: %v %+v", err, res)
		}
		st, _, body = a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "secretEnvVars": map[string]string{"TOKEN": "NO_SUCH"}}, nil)
		a.wantError(t, 400, st, body, "does not exist")
		other, err := env.Client.CreateKey(context.Background(), client.NewKey{Name: "no-secrets"})
		if err != nil {
			t.Fatal(err)
		}
		st, _, body = a.do(t, "POST", "/v2/sandboxes", other.Key, map[string]any{"templateID": "base", "secretEnvVars": map[string]string{"TOKEN": "ENV_SECRET"}}, nil)
		a.wantError(t, 403, st, body, "may not be used by this API key")
	})
	t.Run("List", func(t *testing.T) {
		st, _, body := a.do(t, "GET", "/sandboxes", key, nil, nil)
		if st != 200 || !strings.Contains(string(body), v1.SandboxID) || !strings.Contains(string(body), v2.SandboxID) {
			t.Fatalf("list v1: %d %s", st, body)
		}
		// E2B's triple-encoded metadata filter, exactly as the SDK sends it.
		q := "metadata=user%3Da%252520b%26k%252526%3Dv%25253D1&state=running,paused&limit=10"
		st, _, body = a.do(t, "GET", "/v2/sandboxes?"+q, key, nil, nil)
		var items []map[string]any
		json.Unmarshal(body, &items)
		if st != 200 || len(items) != 1 || items[0]["sandboxID"] != v2.SandboxID {
			t.Fatalf("metadata filter: %d %s", st, body)
		}
		st, _, body = a.do(t, "GET", "/v2/sandboxes?state=paused", key, nil, nil)
		if st != 200 || strings.TrimSpace(string(body)) != "[]" {
			t.Fatalf("state=paused: %d %s", st, body)
		}
		st, _, body = a.do(t, "GET", "/v2/sandboxes?state=bogus", key, nil, nil)
		a.wantError(t, 400, st, body, "state")
		st, _, body = a.do(t, "GET", "/v2/sandboxes?limit=0", key, nil, nil)
		a.wantError(t, 400, st, body, "limit")
		// Paging: one per page, every sandbox exactly once.
		seen := map[string]bool{}
		next := ""
		for i := 0; i < 5; i++ {
			p := "/v2/sandboxes?limit=1"
			if next != "" {
				p += "&nextToken=" + url.QueryEscape(next)
			}
			st, hdr, body := a.do(t, "GET", p, key, nil, nil)
			var page []map[string]any
			json.Unmarshal(body, &page)
			if st != 200 || len(page) > 1 {
				t.Fatalf("page: %d %s", st, body)
			}
			for _, it := range page {
				seen[it["sandboxID"].(string)] = true
			}
			next = hdr.Get("X-Next-Token")
			if next == "" {
				break
			}
		}
		if !seen[v1.SandboxID] || !seen[v2.SandboxID] || len(seen) != 2 {
			t.Fatalf("paging saw %v", seen)
		}
	})
	t.Run("ConnectAndRefresh", func(t *testing.T) {
		for _, p := range []string{"/sandboxes/" + v1.SandboxID + "/connect", "/v2/sandboxes/" + v1.SandboxID + "/connect"} {
			st, _, body := a.do(t, "POST", p, key, map[string]any{"timeout": 300}, nil)
			var got struct {
				SandboxID       string `json:"sandboxID"`
				EnvdAccessToken string `json:"envdAccessToken"`
			}
			json.Unmarshal(body, &got)
			if st != 200 || got.SandboxID != v1.SandboxID || got.EnvdAccessToken != v1.EnvdAccessToken {
				t.Fatalf("connect %s: %d %s", p, st, body)
			}
		}
		st, _, body := a.do(t, "POST", "/v2/sandboxes/missing/connect", key, "{}", nil)
		a.wantError(t, 404, st, body, "")
		if st, _, body := a.do(t, "POST", "/sandboxes/"+v1.SandboxID+"/refreshes", key, map[string]any{"duration": 30}, nil); st != 204 {
			t.Fatalf("refreshes: %d %s", st, body)
		}
	})
	t.Run("Proxy", func(t *testing.T) {
		hdr := func(id, port string) map[string]string {
			return map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": port, "X-Access-Token": v2.EnvdAccessToken}
		}
		if st, _, body := a.do(t, "GET", "/health", "", nil, hdr(v2.SandboxID, "49983")); st != 204 {
			t.Fatalf("envd health via headers: %d %s", st, body)
		}
		st, _, body := a.do(t, "GET", "/envs", "", nil, map[string]string{"E2b-Sandbox-Id": v2.SandboxID, "E2b-Sandbox-Port": "49983"})
		if st != 401 {
			t.Fatalf("envd without access token: want 401, got %d %s", st, body)
		}
		st, _, body = a.do(t, "GET", "/health", "", nil, map[string]string{"E2b-Sandbox-Id": v2.SandboxID})
		if st != 400 || !strings.Contains(string(body), "missing header") {
			t.Fatalf("one routing header: %d %s", st, body)
		}
		st, _, body = a.do(t, "GET", "/health", "", nil, hdr("unknownsandbox", "49983"))
		if st != 502 || !strings.Contains(string(body), `"code":502`) {
			t.Fatalf("unknown sandbox: %d %s", st, body)
		}
		// A server inside the sandbox, reached by Host and by headers.
		sb, _ := env.Client.Sandbox(context.Background(), v2.SandboxID)
		if _, err := sb.Exec(context.Background(), "mkdir -p /tmp/www && echo served-from-sandbox > /tmp/www/index.html && cd /tmp/www && nohup python3 -m http.server 8000 >/dev/null 2>&1 &", client.ExecOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			st, _, body = a.do(t, "GET", "/index.html", "", nil, map[string]string{"Host": fmt.Sprintf("8000-%s.cella.test", v2.SandboxID)})
			if st == 200 || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if st != 200 || string(body) != "served-from-sandbox\n" {
			t.Fatalf("port 8000 via Host: %d %s", st, body)
		}
		st, _, body = a.do(t, "GET", "/index.html", "", nil, hdr(v2.SandboxID, "8000"))
		if st != 200 || string(body) != "served-from-sandbox\n" {
			t.Fatalf("port 8000 via headers: %d %s", st, body)
		}
		st, _, body = a.do(t, "GET", "/", "", nil, hdr(v2.SandboxID, "8001"))
		if st != 502 {
			t.Fatalf("closed port: want 502, got %d %s", st, body)
		}
	})
	t.Run("PauseResume", func(t *testing.T) {
		id := v2.SandboxID
		health := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": v2.EnvdAccessToken}
		port8000 := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "8000"}
		st, _, body := a.do(t, "POST", "/sandboxes/missing/pause", key, "{}", nil)
		a.wantError(t, 404, st, body, "")
		if st, _, body := a.do(t, "POST", "/sandboxes/"+id+"/pause", key, "{}", nil); st != 204 {
			t.Fatalf("pause: %d %s", st, body)
		}
		st, _, body = a.do(t, "POST", "/sandboxes/"+id+"/pause", key, "{}", nil)
		a.wantError(t, 409, st, body, "already paused")
		var d struct {
			State     string `json:"state"`
			PauseMode string `json:"pauseMode"`
		}
		st, _, body = a.do(t, "GET", "/sandboxes/"+id, key, nil, nil)
		json.Unmarshal(body, &d)
		if st != 200 || d.State != "paused" || d.PauseMode != "checkpoint" {
			t.Fatalf("detail of a paused sandbox: %d %s", st, body)
		}
		listed := func(path string) map[string]string {
			st, _, body := a.do(t, "GET", path, key, nil, nil)
			var items []struct {
				SandboxID string `json:"sandboxID"`
				State     string `json:"state"`
			}
			if st != 200 || json.Unmarshal(body, &items) != nil {
				t.Fatalf("list %s: %d %s", path, st, body)
			}
			out := map[string]string{}
			for _, it := range items {
				out[it.SandboxID] = it.State
			}
			return out
		}
		if got := listed("/v2/sandboxes"); got[id] != "paused" {
			t.Fatalf("v2 list (running+paused by default): %v", got)
		}
		if got := listed("/v2/sandboxes?state=paused"); got[id] != "paused" || len(got) != 1 {
			t.Fatalf("v2 list state=paused: %v", got)
		}
		if got := listed("/sandboxes"); got[id] != "" {
			t.Fatalf("v1 list shows running sandboxes only: %v", got)
		}
		for _, h := range []map[string]string{health, port8000} {
			st, _, body := a.do(t, "GET", "/health", "", nil, h)
			if st != 502 || !strings.Contains(string(body), `"code":502`) || !strings.Contains(string(body), "paused") {
				t.Fatalf("sandbox URL while paused: want 502 JSON, got %d %s", st, body)
			}
		}
		st, _, body = a.do(t, "POST", "/sandboxes/"+v1.SandboxID+"/resume", key, "{}", nil)
		a.wantError(t, 409, st, body, "not paused")
		// connect resumes (201, same token), then answers 200.
		for i, want := range []int{201, 200} {
			st, _, body := a.do(t, "POST", "/v2/sandboxes/"+id+"/connect", key, "{}", nil)
			var got struct {
				SandboxID       string `json:"sandboxID"`
				EnvdAccessToken string `json:"envdAccessToken"`
			}
			json.Unmarshal(body, &got)
			if st != want || got.SandboxID != id || got.EnvdAccessToken != v2.EnvdAccessToken {
				t.Fatalf("connect #%d: want %d, got %d %s", i+1, want, st, body)
			}
		}
		// The server started before the pause still serves.
		st, _, body = a.do(t, "GET", "/index.html", "", nil, port8000)
		if st != 200 || string(body) != "served-from-sandbox\n" {
			t.Fatalf("port 8000 after resume: %d %s", st, body)
		}
		// Filesystem only: the deprecated /resume cold-boots it.
		if st, _, body := a.do(t, "POST", "/sandboxes/"+id+"/pause", key, map[string]any{"memory": false}, nil); st != 204 {
			t.Fatalf("pause memory=false: %d %s", st, body)
		}
		st, _, body = a.do(t, "GET", "/sandboxes/"+id, key, nil, nil)
		json.Unmarshal(body, &d)
		if d.State != "paused" || d.PauseMode != "stopped" {
			t.Fatalf("detail after pause memory=false: %s", body)
		}
		st, _, body = a.do(t, "POST", "/sandboxes/"+id+"/resume", key, map[string]any{"timeout": 120}, nil)
		if st != 201 || !strings.Contains(string(body), v2.EnvdAccessToken) {
			t.Fatalf("resume: %d %s", st, body)
		}
		if st, _, body := a.do(t, "GET", "/health", "", nil, health); st != 204 {
			t.Fatalf("envd after cold resume: %d %s", st, body)
		}
		if st, _, _ := a.do(t, "GET", "/index.html", "", nil, port8000); st != 502 {
			t.Fatalf("port 8000 after a cold boot: want 502 (no server), got %d", st)
		}
	})
	t.Run("AutoPauseAutoResume", func(t *testing.T) {
		st, _, body := a.do(t, "POST", "/v2/sandboxes", key, map[string]any{
			"templateID": "base", "timeout": 2, "autoPause": true, "autoResume": map[string]any{"enabled": true},
		}, nil)
		var sb struct {
			SandboxID       string `json:"sandboxID"`
			EnvdAccessToken string `json:"envdAccessToken"`
		}
		json.Unmarshal(body, &sb)
		if st != 201 {
			t.Fatalf("create: %d %s", st, body)
		}
		defer env.Client.Kill(context.Background(), sb.SandboxID)
		var d struct {
			State     string         `json:"state"`
			Lifecycle map[string]any `json:"lifecycle"`
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, _, body = a.do(t, "GET", "/sandboxes/"+sb.SandboxID, key, nil, nil)
			json.Unmarshal(body, &d)
			if d.State != "running" || time.Now().After(deadline) {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if d.State != "paused" || d.Lifecycle["onTimeout"] != "pause" || d.Lifecycle["autoResume"] != true {
			t.Fatalf("autoPause sandbox after its timeout: %s", body)
		}
		h := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": sb.EnvdAccessToken}
		if st, _, body := a.do(t, "GET", "/health", "", nil, h); st != 204 {
			t.Fatalf("first request to an autoResume sandbox: want 204, got %d %s", st, body)
		}
		_, _, body = a.do(t, "GET", "/sandboxes/"+sb.SandboxID, key, nil, nil)
		json.Unmarshal(body, &d)
		if d.State != "running" {
			t.Fatalf("after auto-resume: %s", body)
		}
	})
	t.Run("SetTimeoutExpires", func(t *testing.T) {
		st, _, body := a.do(t, "POST", "/sandboxes/"+v1.SandboxID+"/timeout", key, map[string]any{"timeout": -1}, nil)
		a.wantError(t, 400, st, body, "timeout must be between 0 and 86400 seconds")
		st, _, body = a.do(t, "POST", "/sandboxes/"+v1.SandboxID+"/timeout", key, "{bad", nil)
		a.wantError(t, 400, st, body, "")
		set := time.Now()
		if st, _, body := a.do(t, "POST", "/sandboxes/"+v1.SandboxID+"/timeout", key, map[string]any{"timeout": 2}, nil); st != 204 {
			t.Fatalf("timeout: %d %s", st, body)
		}
		// The reaper removes it some time after its 2 s: poll for that
		// rather than guess how long a loaded machine takes, but it must
		// not go before the 2 s are up.
		deadline := time.Now().Add(60 * time.Second)
		for {
			st, _, body = a.do(t, "GET", "/sandboxes/"+v1.SandboxID, key, nil, nil)
			if st == 404 {
				if el := time.Since(set); el < 2*time.Second {
					t.Fatalf("the sandbox was gone %v after a 2 s timeout was set", el)
				}
				break
			}
			if st != 200 || time.Now().After(deadline) {
				t.Fatalf("sandbox %v after a 2 s timeout: %d %s", time.Since(set), st, body)
			}
			time.Sleep(250 * time.Millisecond)
		}
		a.wantError(t, 404, st, body, "")
		st, _, _ = a.do(t, "GET", "/health", "", nil, map[string]string{"E2b-Sandbox-Id": v1.SandboxID, "E2b-Sandbox-Port": "49983"})
		if st != 502 {
			t.Fatalf("expired sandbox URL: want 502, got %d", st)
		}
		st, _, body = a.do(t, "POST", "/sandboxes/"+v1.SandboxID+"/timeout", key, map[string]any{"timeout": 5}, nil)
		a.wantError(t, 404, st, body, "")
	})
	t.Run("Kill", func(t *testing.T) {
		if st, _, body := a.do(t, "DELETE", "/sandboxes/"+v2.SandboxID, key, nil, nil); st != 204 {
			t.Fatalf("delete: %d %s", st, body)
		}
		st, _, body := a.do(t, "DELETE", "/sandboxes/"+v2.SandboxID, key, nil, nil)
		a.wantError(t, 404, st, body, "")
		// DELETE removes the sandbox before it answers; the expired v1 is
		// the reaper's, whose kill runs in the background after the
		// sandbox already answers 404: its directory goes soon after.
		if d := sandboxDirs(t, env); slices.Contains(d, v2.SandboxID) {
			t.Fatalf("sandbox dir of %s left after its kill: %v", v2.SandboxID, d)
		}
		for deadline := time.Now().Add(30 * time.Second); len(sandboxDirs(t, env)) != 0; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("sandbox dirs left 30 s after the kills: %v", sandboxDirs(t, env))
			}
		}
	})
}
