package agent

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/envd/process"
)

func spawnReq(t *testing.T, url, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+agentapi.SpawnPath, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return do(t, req)
}

// The spawn route times Count bare starts and Count starts through the
// exec path, as the request's user, and with throughConnect starts the
// command through the process service in both Connect codecs too (a warm
// pool's warm-up), and leaves no trace in the process table, the logs or
// the audit feed; programs inside the sandbox cannot reach it, and a bad
// count is refused naming the field and its limit.
func TestSpawn(t *testing.T) {
	for _, rt := range []string{"gvisor", "namespaces"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "namespaces" && landlockABI() < 1 {
				t.Skip("kernel without landlock")
			}
			e := newTestEnv(t, func(c *agentapi.Config, o *Options) { c.Runtime = rt })
			resp, b := spawnReq(t, e.ts.URL, `{"count":3,"throughConnect":true}`, "Authorization", basicAuth("user"))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("spawn: %d %s", resp.StatusCode, b)
			}
			var res agentapi.SpawnResult
			if err := json.Unmarshal(b, &res); err != nil {
				t.Fatal(err)
			}
			if len(res.FloorNs) != 3 || len(res.PathNs) != 3 {
				t.Fatalf("want 3 and 3 durations: %+v", res)
			}
			for _, d := range append(res.FloorNs, res.PathNs...) {
				if d <= 0 {
					t.Fatalf("a duration that is not one: %+v", res)
				}
			}

			ctx := ctxT(t, 30*time.Second)
			list, err := e.proc.List(ctx, connect.NewRequest(&process.ListRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			if n := len(list.Msg.GetProcesses()); n != 0 {
				t.Fatalf("the spawns are in the process table: %d processes", n)
			}
			// The first events of the feed are the next real command's.
			e.run(ctx, bashReq("exit 3"))
			evs := follow(t, e, 0, 2)
			if evs[0].Kind != "process.start" || !strings.Contains(evs[0].Cmd, "exit 3") {
				t.Fatalf("the spawns reached the audit feed: %+v", evs)
			}
			if l := e.srv.logs.get(int(evs[0].PID)); l == nil {
				t.Fatalf("the real command has no log")
			}

			for _, body := range []string{`{"count":0}`, `{"count":100000}`} {
				resp, b := spawnReq(t, e.ts.URL, body)
				if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "count must be between 1 and 200") {
					t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
				}
			}
			local := httptestServer(t, e.srv.LocalHandler())
			if resp, b := spawnReq(t, local, `{"count":1}`); resp.StatusCode != http.StatusNotFound {
				t.Fatalf("local %s: %d %s", agentapi.SpawnPath, resp.StatusCode, b)
			}
		})
	}
}

// With an access token set, the route needs it like any other.
func TestSpawnNeedsToken(t *testing.T) {
	e := newTestEnv(t, func(c *agentapi.Config, o *Options) { c.AccessToken = "tok" })
	if resp, b := spawnReq(t, e.ts.URL, `{"count":1}`); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without token: %d %s", resp.StatusCode, b)
	}
	if resp, b := spawnReq(t, e.ts.URL, `{"count":1}`, agentapi.AccessTokenHeader, "tok"); resp.StatusCode != http.StatusOK {
		t.Fatalf("with token: %d %s", resp.StatusCode, b)
	}
}
