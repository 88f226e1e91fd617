package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/envd/process"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// HolderPy is a python process that holds MB megabytes of touched memory
// and a token, writes its marker file once ready, and answers on
// 127.0.0.1:8000: GET → "<token> <len> <checksum byte>", POST /set?token=X
// changes the token and the object in place. cella bench state uses it too.
const HolderPy = `
import http.server, os, sys, secrets
mb = int(sys.argv[1])
buf = bytearray(os.urandom(1 << 20)) * mb   # touched: every page written
state = {"token": secrets.token_hex(8)}
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def reply(self):
        body = ("%s %d %d" % (state["token"], len(buf), buf[len(buf)//2])).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self): self.reply()
    def do_POST(self):
        state["token"] = self.path.split("token=", 1)[1]
        buf[len(buf)//2] = (buf[len(buf)//2] + 1) % 256
        self.reply()
srv = http.server.HTTPServer(("127.0.0.1", 8000), H)
with open("/home/user/marker", "w") as f: f.write(state["token"])
srv.serve_forever()
`

// AskHolder is the command that queries HolderPy inside a sandbox.
const AskHolder = `python3 -c "import urllib.request,sys;print(urllib.request.urlopen('http://127.0.0.1:8000'+(sys.argv[1] if len(sys.argv)>1 else ''), data=(b'' if len(sys.argv)>1 else None), timeout=20).read().decode())"`

// StartHolder writes HolderPy into sb, starts it as a background process
// holding mb MiB and waits for its marker; it returns the token.
func StartHolder(ctx context.Context, sb *client.SandboxConn, mb int) (string, error) {
	if err := sb.WriteFile(ctx, "/home/user/holder.py", "user", strings.NewReader(HolderPy)); err != nil {
		return "", err
	}
	sctx, cancel := context.WithCancel(ctx)
	stream, err := sb.Process.Start(sctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/usr/bin/python3", Args: []string{"/home/user/holder.py", strconv.Itoa(mb)}},
	}))
	if err != nil {
		cancel()
		return "", err
	}
	for stream.Receive() {
		if stream.Msg().GetEvent().GetStart() != nil {
			break
		}
	}
	cancel() // the stream ends, the process keeps running
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		res, err := sb.Exec(ctx, "cat /home/user/marker 2>/dev/null", client.ExecOptions{Timeout: 30 * time.Second})
		if err == nil && res.ExitCode == 0 && strings.TrimSpace(res.Stdout) != "" {
			return strings.TrimSpace(res.Stdout), nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return "", fmt.Errorf("the holder process never wrote its marker")
}

func askHolder(t *testing.T, sb *client.SandboxConn, set string) string {
	t.Helper()
	cmd := AskHolder
	if set != "" {
		cmd += " '/set?token=" + set + "'"
	}
	return strings.TrimSpace(mustOK(t, sb, cmd))
}

// duX is the bytes used under dir on its own filesystem (sandbox mounts
// below it are not counted).
func duX(t *testing.T, dir string) int64 {
	t.Helper()
	out, err := exec.Command("du", "-sx", "--block-size=1", dir).Output()
	if err != nil {
		t.Fatalf("du %s: %v", dir, err)
	}
	n, _ := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
	return n
}

// forkCount is how many forks the suite makes: CELLA_TEST_FORKS, default
// 20, the figure (about 15 s of a 2-core machine under gVisor).
func forkCount() int {
	if n, err := strconv.Atoi(os.Getenv("CELLA_TEST_FORKS")); err == nil && n > 0 {
		return n
	}
	return 20
}

// RunSnapshots is the snapshot and fork suite for one runtime.
func RunSnapshots(t *testing.T, runtimeName string) {
	env := daemontest.Start(t, runtimeName, daemontest.Options{})
	dataDir = env.DataDir
	t.Run("SnapshotCreate", func(t *testing.T) { testSnapshotCreate(t, env, runtimeName) })
	t.Run("Fork", func(t *testing.T) { testFork(t, env, runtimeName) })
}

func testSnapshotCreate(t *testing.T, env *daemontest.Env, rt string) {
	ctx := ctxT(t, 5*time.Minute)
	orig := create(t, env, client.CreateRequest{MemoryMB: 512})
	mustOK(t, orig, "echo hello > /home/user/file.txt && mkdir -p /home/user/d && echo x > /home/user/d/y && echo gone > /home/user/gone && sync")
	mustOK(t, orig, "rm /home/user/gone")
	var token string
	var err error
	if rt == runtime.GVisor {
		if token, err = StartHolder(ctx, orig, 8); err != nil {
			t.Fatal(err)
		}
	}
	sn, err := env.Client.Snapshot(ctx, orig.ID, "snap-"+orig.ID[:6])
	if err != nil {
		t.Fatal(err)
	}
	if sn.Memory != (rt == runtime.GVisor) || len(sn.Names) != 1 {
		t.Fatalf("snapshot info: %+v", sn)
	}
	list, err := env.Client.ListSnapshots(ctx, orig.ID)
	if err != nil || len(list) != 1 || list[0].SnapshotID != sn.SnapshotID {
		t.Fatalf("list snapshots: %+v %v", list, err)
	}
	// The original keeps running and answering.
	if got := mustOK(t, orig, "cat /home/user/file.txt"); got != "hello\n" {
		t.Fatalf("original after snapshot: %q", got)
	}
	for _, tpl := range []string{sn.SnapshotID, sn.Names[0]} {
		sb := create(t, env, client.CreateRequest{TemplateID: tpl, EnvVars: map[string]string{"FROM_SNAP": "yes"}})
		if got := mustOK(t, sb, "cat /home/user/file.txt /home/user/d/y; echo $FROM_SNAP"); got != "hello\nx\nyes\n" {
			t.Fatalf("sandbox from snapshot %s: %q", tpl, got)
		}
		if rt == runtime.GVisor {
			if got := askHolder(t, sb, ""); !strings.HasPrefix(got, token+" ") {
				t.Fatalf("holder in restored sandbox: %q (want token %s)", got, token)
			}
			if got := mustOK(t, sb, "echo $E2B_SANDBOX_ID"); strings.TrimSpace(got) != sb.ID {
				t.Fatalf("E2B_SANDBOX_ID in restored sandbox: %q, want %s", got, sb.ID)
			}
		}
	}
	if err := env.Client.DeleteSnapshot(ctx, sn.SnapshotID); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.DeleteSnapshot(ctx, sn.SnapshotID); !client.IsNotFound(err) {
		t.Fatalf("second delete: %v, want 404", err)
	}
	if _, err := env.Client.Create(ctx, client.CreateRequest{TemplateID: sn.SnapshotID}); !client.IsNotFound(err) {
		t.Fatalf("create from a deleted snapshot: %v, want 404", err)
	}
}

func testFork(t *testing.T, env *daemontest.Env, rt string) {
	ctx := ctxT(t, 15*time.Minute)
	n := forkCount()
	orig := create(t, env, client.CreateRequest{MemoryMB: 512})
	mustOK(t, orig, "echo orig > /home/user/file.txt")
	gv := rt == runtime.GVisor
	var token string
	var err error
	if gv {
		if token, err = StartHolder(ctx, orig, 100); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.Client.Fork(ctx, "nosuchsandbox", 1, 0); !client.IsNotFound(err) {
		t.Fatalf("fork of an unknown sandbox: %v, want 404", err)
	}
	for _, bad := range []int{0, -1, 33} {
		var ae *client.APIError
		if _, err := env.Client.Fork(ctx, orig.ID, bad, 0); !errors.As(err, &ae) || ae.Status != 400 {
			t.Fatalf("fork count %d: %v, want 400", bad, err)
		}
	}
	if _, err := env.Client.Snapshot(ctx, "nosuchsandbox", ""); !client.IsNotFound(err) {
		t.Fatalf("snapshot of an unknown sandbox: %v, want 404", err)
	}
	before := duX(t, env.DataDir)
	start := time.Now()
	res, err := env.Client.Fork(ctx, orig.ID, n, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork x%d took %v", n, time.Since(start))
	after := duX(t, env.DataDir)
	var forks []*client.SandboxConn
	for i, r := range res {
		if r.Sandbox == nil {
			t.Fatalf("fork %d failed: %+v", i, r.Error)
		}
		if r.Sandbox.MemoryRestored != gv {
			t.Fatalf("fork %d memoryRestored=%v on %s", i, r.Sandbox.MemoryRestored, rt)
		}
		id := r.Sandbox.SandboxID
		onlySocketInRunDir(t, env, id) // agentchannel.go
		holdsCPULimit(t, env, id)
		t.Cleanup(func() { _ = env.Client.Kill(context.Background(), id) })
		c, err := env.Client.Sandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		forks = append(forks, c)
	}
	if len(forks) != n {
		t.Fatalf("%d forks, want %d", len(forks), n)
	}
	for i, f := range forks {
		if got := mustOK(t, f, "cat /home/user/file.txt"); got != "orig\n" {
			t.Fatalf("fork %d file: %q", i, got)
		}
		if gv {
			if got := askHolder(t, f, ""); !strings.HasPrefix(got, token+" 104857600 ") {
				t.Fatalf("fork %d holder: %q (want token %s and 100 MiB)", i, got, token)
			}
		}
	}
	// Fork 0's audit log holds its own commands, not the original's (its
	// restored agent still had them in its feed).
	forkAuditHasNoOriginalCommands(t, env, forks[0].ID)
	// Change fork 0, files and memory; nobody else sees it.
	mustOK(t, forks[0], "echo changed > /home/user/file.txt && echo new > /home/user/new.txt")
	if gv {
		if got := askHolder(t, forks[0], "changed"); !strings.HasPrefix(got, "changed ") {
			t.Fatalf("fork 0 set: %q", got)
		}
	}
	others := append([]*client.SandboxConn{orig}, forks[1:]...)
	for i, o := range others {
		if got := mustOK(t, o, "cat /home/user/file.txt; test -e /home/user/new.txt && echo leaked; true"); got != "orig\n" {
			t.Fatalf("sandbox %d (0 = original) sees fork 0's files: %q", i, got)
		}
		if gv {
			if got := askHolder(t, o, ""); !strings.HasPrefix(got, token+" ") {
				t.Fatalf("sandbox %d (0 = original) sees fork 0's memory: %q", i, got)
			}
		}
	}
	// Disk: one snapshot (layer + memory image), not n copies.
	grew := after - before
	t.Logf("data dir grew by %.1f MiB for %d forks", float64(grew)/(1<<20), n)
	limit := int64(40 << 20)
	if gv {
		limit = 200 << 20 // one ~100 MiB memory image plus its layer
	}
	if grew > limit {
		t.Fatalf("data dir grew by %d bytes for %d forks (limit %d): the snapshot is copied per fork", grew, n, limit)
	}
	// The hidden fork snapshot is not listed, and goes with the last fork.
	if list, err := env.Client.ListSnapshots(ctx, orig.ID); err != nil || len(list) != 0 {
		t.Fatalf("fork's snapshot is listed: %+v %v", list, err)
	}
	for _, f := range forks {
		if err := env.Client.Kill(ctx, f.ID); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ents, _ := os.ReadDir(env.DataDir + "/snapshots")
		if len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d snapshot dirs left after the last fork was killed", len(ents))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// forkAuditHasNoOriginalCommands waits for the fork's own `cat` to reach its
// audit log, then checks that the original's `echo orig` is not there.
func forkAuditHasNoOriginalCommands(t *testing.T, env *daemontest.Env, id string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		req, _ := http.NewRequest("GET", env.URL+"/sandboxes/"+id+"/logs?kind=process.start", nil)
		req.Header.Set("X-API-Key", env.APIKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Entries []struct {
				Cmd string `json:"cmd"`
			} `json:"entries"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		own := false
		for _, e := range out.Entries {
			if strings.Contains(e.Cmd, "echo orig") {
				t.Fatalf("fork %s's audit log has the original's command %q", id, e.Cmd)
			}
			own = own || strings.Contains(e.Cmd, "cat /home/user/file.txt")
		}
		if own {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fork %s's own command never reached its audit log: %+v", id, out.Entries)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
