package mcpserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	cellaclient "github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

func daemontestClient(url, key string) (*cellaclient.Client, error) {
	return cellaclient.New(cellaclient.Config{URL: url, APIKey: key})
}

// keyTransport sends the key with every request, and host as its Host
// header when set.
type keyTransport struct {
	key  string
	host string
	base http.RoundTripper
}

func (k keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-API-Key", k.key)
	if k.host != "" {
		r.Host = k.host
	}
	return k.base.RoundTrip(r)
}

func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (map[string]any, *mcp.CallToolResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var out map[string]any
	if res.StructuredContent != nil {
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, &out)
	}
	return out, res
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// exercise drives every tool through a real MCP client session.
func exercise(t *testing.T, cs *mcp.ClientSession) {
	ctx := context.Background()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"sandbox_create": true, "sandbox_exec": true, "sandbox_write_file": true, "sandbox_read_file": true,
		"sandbox_list_files": true, "sandbox_run_code": true, "sandbox_expose_port": true, "sandbox_kill": true, "sandbox_list": true}
	for _, tool := range tools.Tools {
		delete(want, tool.Name)
		if tool.Name == "sandbox_exec" && !strings.Contains(tool.Description, "Network egress: none: no egress is allowed") {
			t.Fatalf("sandbox_exec does not tell the agent its network policy: %q", tool.Description)
		}
	}
	if len(want) > 0 {
		t.Fatalf("tools missing: %v", want)
	}

	created, res := call(t, cs, "sandbox_create", map[string]any{"memory_mb": 256, "env": map[string]string{"GREETING": "hi"}})
	id, _ := created["sandbox_id"].(string)
	if res.IsError || id == "" {
		t.Fatalf("sandbox_create: %s", text(res))
	}
	defer call(t, cs, "sandbox_kill", map[string]any{"sandbox_id": id})

	out, res := call(t, cs, "sandbox_exec", map[string]any{"sandbox_id": id, "command": "echo $GREETING; echo oops >&2; exit 3"})
	if res.IsError || out["exit_code"] != float64(3) || out["stdout"] != "hi\n" || out["stderr"] != "oops\n" {
		t.Fatalf("sandbox_exec: %v %s", out, text(res))
	}
	if _, ok := out["sandbox_events"]; !ok {
		t.Fatalf("sandbox_exec result lacks sandbox_events: %v", out)
	}
	out, _ = call(t, cs, "sandbox_exec", map[string]any{"sandbox_id": id, "command": "sleep 30", "timeout_seconds": 1})
	if !strings.Contains(out["error"].(string), "timeout") {
		t.Fatalf("sandbox_exec timeout: %v", out)
	}
	// Seconds a duration cannot hold would wrap (to no timeout at all).
	if _, res = call(t, cs, "sandbox_exec", map[string]any{"sandbox_id": id, "command": "true", "timeout_seconds": 9223372037}); !res.IsError || !strings.Contains(text(res), "timeout_seconds must be between 0 and 86400") {
		t.Fatalf("sandbox_exec with an overflowing timeout: %s", text(res))
	}
	if _, res = call(t, cs, "sandbox_write_file", map[string]any{"sandbox_id": id, "path": "/home/user/dir/a.txt", "content": "hello mcp"}); res.IsError {
		t.Fatalf("write: %s", text(res))
	}
	out, _ = call(t, cs, "sandbox_read_file", map[string]any{"sandbox_id": id, "path": "/home/user/dir/a.txt"})
	if out["content"] != "hello mcp" {
		t.Fatalf("read: %v", out)
	}
	out, _ = call(t, cs, "sandbox_list_files", map[string]any{"sandbox_id": id, "path": "/home/user/dir"})
	if b, _ := json.Marshal(out); !strings.Contains(string(b), `"name":"a.txt"`) {
		t.Fatalf("list: %s", b)
	}
	out, _ = call(t, cs, "sandbox_expose_port", map[string]any{"sandbox_id": id, "port": 8000})
	if u, _ := out["url"].(string); !strings.HasPrefix(u, "http://8000-"+id+".") {
		t.Fatalf("expose: %v", out)
	}
	out, _ = call(t, cs, "sandbox_list", nil)
	if b, _ := json.Marshal(out); !strings.Contains(string(b), id) {
		t.Fatalf("list sandboxes: %s", b)
	}
	if _, res = call(t, cs, "sandbox_exec", map[string]any{"sandbox_id": "nosuchsandbox", "command": "true"}); !res.IsError || !strings.Contains(text(res), "not found") {
		t.Fatalf("unknown sandbox: %s", text(res))
	}
}

func TestMCP(t *testing.T) {
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{})
	cella, _ := daemontest.Binaries(t)
	client := mcp.NewClient(&mcp.Implementation{Name: "cella-test", Version: "1"}, nil)
	ctx := context.Background()

	t.Run("StreamableHTTP", func(t *testing.T) {
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
			Endpoint:   env.URL + "/mcp",
			HTTPClient: &http.Client{Transport: keyTransport{key: env.APIKey, base: http.DefaultTransport}},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		exercise(t, cs)
	})
	t.Run("HTTPIgnoresHostHeader", func(t *testing.T) {
		// The attack: an MCP session whose requests name another server in
		// Host. The daemon must not call that server with the caller's key
		// (it once built its client to itself from Host); its tools still
		// act on the real daemon.
		var mu sync.Mutex
		var got []string
		attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got = append(got, r.Method+" "+r.URL.Path+" key="+r.Header.Get("X-API-Key"))
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`[]`))
		}))
		defer attacker.Close()
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
			Endpoint:   env.URL + "/mcp",
			HTTPClient: &http.Client{Transport: keyTransport{key: env.APIKey, host: attacker.Listener.Addr().String(), base: http.DefaultTransport}},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		leaked := func() {
			t.Helper()
			mu.Lock()
			defer mu.Unlock()
			if len(got) > 0 {
				t.Fatalf("the daemon called the server named in Host, with the caller's key: %q", got)
			}
		}
		created, res := call(t, cs, "sandbox_create", nil)
		leaked()
		id, _ := created["sandbox_id"].(string)
		if res.IsError || id == "" {
			t.Fatalf("sandbox_create with a foreign Host: %s", text(res))
		}
		defer call(t, cs, "sandbox_kill", map[string]any{"sandbox_id": id})
		if _, err := env.Client.Get(ctx, id); err != nil {
			t.Fatalf("the sandbox MCP created is not on the daemon: %v", err)
		}
		out, res := call(t, cs, "sandbox_exec", map[string]any{"sandbox_id": id, "command": "echo real"})
		if res.IsError || out["stdout"] != "real\n" {
			t.Fatalf("sandbox_exec with a foreign Host: %v %s", out, text(res))
		}
		if _, res = call(t, cs, "sandbox_write_file", map[string]any{"sandbox_id": id, "path": "/home/user/f", "content": "x"}); res.IsError {
			t.Fatalf("sandbox_write_file with a foreign Host: %s", text(res))
		}
		out, _ = call(t, cs, "sandbox_list", nil)
		if b, _ := json.Marshal(out); !strings.Contains(string(b), id) {
			t.Fatalf("sandbox_list with a foreign Host: %s", b)
		}
		leaked()
	})
	t.Run("HTTPNeedsKey", func(t *testing.T) {
		resp, err := http.Post(env.URL+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("/mcp without a key: %d", resp.StatusCode)
		}
	})
	stdio := func(t *testing.T, extra ...string) *mcp.ClientSession {
		cmd := exec.Command(cella, append([]string{"mcp"}, extra...)...)
		cmd.Env = append(os.Environ(), "CELLA_URL="+env.URL, "CELLA_API_KEY="+env.APIKey)
		cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	t.Run("Stdio", func(t *testing.T) { exercise(t, stdio(t)) })
	t.Run("PerKeyBudget", func(t *testing.T) {
		k, err := env.Client.CreateKey(ctx, cellaclient.NewKey{Name: "agent-one", MCPMaxCalls: 2})
		if err != nil {
			t.Fatal(err)
		}
		if k.Key == "" || k.MCPMaxCalls != 2 {
			t.Fatalf("created key: %+v", k)
		}
		check := func(t *testing.T, cs *mcp.ClientSession) {
			for i := 0; i < 2; i++ {
				if _, res := call(t, cs, "sandbox_list", nil); res.IsError {
					t.Fatalf("call %d within the key's budget: %s", i+1, text(res))
				}
			}
			if _, res := call(t, cs, "sandbox_list", nil); !res.IsError || !strings.Contains(text(res), "may make 2 tool calls") {
				t.Fatalf("call past the key's budget: %s", text(res))
			}
		}
		t.Run("HTTP", func(t *testing.T) {
			cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
				Endpoint:   env.URL + "/mcp",
				HTTPClient: &http.Client{Transport: keyTransport{key: k.Key, base: http.DefaultTransport}},
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			check(t, cs)
		})
		t.Run("Stdio", func(t *testing.T) {
			cmd := exec.Command(cella, "mcp")
			cmd.Env = append(os.Environ(), "CELLA_URL="+env.URL, "CELLA_API_KEY="+k.Key, "CELLA_MCP_MAX_CALLS=")
			cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			check(t, cs)
		})
		// Only the admin key manages keys, and the admin key stays.
		other, err := daemontestClient(env.URL, k.Key)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.CreateKey(ctx, cellaclient.NewKey{Name: "sneaky"}); err == nil || !strings.Contains(err.Error(), "403") {
			t.Fatalf("a non-admin key created a key: %v", err)
		}
		if err := env.Client.DeleteKey(ctx, "admin"); err == nil || !strings.Contains(err.Error(), "409") {
			t.Fatalf("deleting the admin key: %v", err)
		}
		keys, err := env.Client.Keys(ctx)
		if err != nil || len(keys) != 2 || keys[1].Key != "" {
			t.Fatalf("key list: %v %+v", err, keys)
		}
		if err := env.Client.DeleteKey(ctx, k.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := other.SelfKey(ctx); err == nil || !strings.Contains(err.Error(), "401") {
			t.Fatalf("a deleted key still works: %v", err)
		}
	})
	t.Run("Budget", func(t *testing.T) {
		cs := stdio(t, "--max-calls", "2")
		for i := 0; i < 2; i++ {
			if _, res := call(t, cs, "sandbox_list", nil); res.IsError {
				t.Fatalf("call %d within the budget: %s", i+1, text(res))
			}
		}
		_, res := call(t, cs, "sandbox_list", nil)
		if !res.IsError || !strings.Contains(text(res), "budget") || !strings.Contains(text(res), "max_calls") {
			t.Fatalf("call past the budget: %s", text(res))
		}
	})
}

// TestMCPTenancy: an MCP session acts with its key's rights, over both
// transports: another team's sandbox is not listed, and every tool that
// names it answers as for an unknown sandbox while the sandbox stays
// unharmed.
func TestMCPTenancy(t *testing.T) {
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{})
	cella, _ := daemontest.Binaries(t)
	ctx := context.Background()
	newKey := func(name, team string) cellaclient.Key {
		k, err := env.Client.CreateKey(ctx, cellaclient.NewKey{Name: name, Team: team})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	alice, bob := newKey("alice", "red"), newKey("bob", "blue")
	ac, err := daemontestClient(env.URL, alice.Key)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := ac.Create(ctx, cellaclient.CreateRequest{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Client.Kill(ctx, sb.SandboxID)
	mc := mcp.NewClient(&mcp.Implementation{Name: "cella-test", Version: "1"}, nil)
	attack := func(t *testing.T, cs *mcp.ClientSession) {
		out, res := call(t, cs, "sandbox_list", nil)
		if b, _ := json.Marshal(out); res.IsError || strings.Contains(string(b), sb.SandboxID) {
			t.Fatalf("another team's sandbox_list: %s %s", b, text(res))
		}
		for _, tc := range []struct {
			tool string
			args map[string]any
		}{
			{"sandbox_exec", map[string]any{"command": "id"}},
			{"sandbox_read_file", map[string]any{"path": "/etc/hostname"}},
			{"sandbox_write_file", map[string]any{"path": "/tmp/x", "content": "x"}},
			{"sandbox_list_files", map[string]any{"path": "/"}},
			{"sandbox_expose_port", map[string]any{"port": 8000}},
			{"sandbox_kill", map[string]any{}},
		} {
			tc.args["sandbox_id"] = sb.SandboxID
			if _, res := call(t, cs, tc.tool, tc.args); !res.IsError || !strings.Contains(text(res), "not found") {
				t.Fatalf("%s on another team's sandbox: %s", tc.tool, text(res))
			}
		}
		if d, err := ac.Get(ctx, sb.SandboxID); err != nil || d.State != "running" {
			t.Fatalf("the sandbox after the attack: %+v %v", d, err)
		}
	}
	t.Run("HTTP", func(t *testing.T) {
		cs, err := mc.Connect(ctx, &mcp.StreamableClientTransport{
			Endpoint:   env.URL + "/mcp",
			HTTPClient: &http.Client{Transport: keyTransport{key: bob.Key, base: http.DefaultTransport}},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		attack(t, cs)
	})
	t.Run("Stdio", func(t *testing.T) {
		cmd := exec.Command(cella, "mcp")
		cmd.Env = append(os.Environ(), "CELLA_URL="+env.URL, "CELLA_API_KEY="+bob.Key)
		cs, err := mc.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		attack(t, cs)
	})
}
