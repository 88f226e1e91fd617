package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/envd/filesystem/filesystemconnect"
	"github.com/cella-sandbox/cella/internal/envd/process"
	"github.com/cella-sandbox/cella/internal/envd/process/processconnect"
)

// Test users in a private passwd file, so that uid switching is tested even
// on hosts without a "user" account.
const (
	testUID = 1000
	// bombUID runs the fork bomb test: RLIMIT_NPROC counts per uid, so an
	// otherwise unused uid bounds the bomb even if the watchdog failed.
	bombUID = 54321
)

func TestMain(m *testing.M) {
	// The test binary doubles as the PID-1-like agent of the reaping test.
	if os.Getenv("CELLA_TEST_AGENT_SOCKET") != "" {
		os.Exit(runTestAgent())
	}
	if root := os.Getenv(jailEnv); root != "" {
		os.Exit(runJail(root)) // fuzz_test.go
	}
	flag.Parse()
	if !testing.Verbose() {
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	}
	os.Exit(m.Run())
}

type testEnv struct {
	t       *testing.T
	srv     *Server
	ts      *httptest.Server
	proc    processconnect.ProcessClient
	fs      filesystemconnect.FilesystemClient
	home    string // home of "user" (uid 1000)
	rootDir string // a scratch dir
}

type envOpt func(*agentapi.Config, *Options)

func newTestEnv(t *testing.T, opts ...envOpt) *testEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("agent tests run as root")
	}
	dir := t.TempDir()
	// TempDir and its parent are 0700; users must reach their home below.
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	home := filepath.Join(dir, "home", "user")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, testUID, testUID); err != nil {
		t.Fatal(err)
	}
	scratch := filepath.Join(dir, "scratch")
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		t.Fatal(err)
	}
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	writeFile(t, passwd, fmt.Sprintf("root:x:0:0:root:/root:/bin/bash\nuser:x:%d:%d::%s:/bin/bash\nbomb:x:%d:%d::/tmp:/bin/bash\n", testUID, testUID, home, bombUID, bombUID))
	writeFile(t, group, fmt.Sprintf("root:x:0:\nuser:x:%d:\nextra:x:4242:user\nbomb:x:%d:\n", testUID, bombUID))

	cfg := agentapi.Config{SandboxID: "sbxtest", TemplateID: "tpl", Runtime: "gvisor", DefaultUser: "root", EnvVars: map[string]string{"GLOBAL_VAR": "g"}}
	o := Options{PasswdPath: passwd, GroupPath: group}
	for _, f := range opts {
		f(&cfg, &o)
	}
	srv := NewServer(cfg, o)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		srv.Close()
		ts.CloseClientConnections()
		ts.Close()
	})
	hc := ts.Client()
	return &testEnv{
		t: t, srv: srv, ts: ts, home: home, rootDir: scratch,
		proc: processconnect.NewProcessClient(hc, ts.URL, connect.WithProtoJSON()),
		fs:   filesystemconnect.NewFilesystemClient(hc, ts.URL, connect.WithProtoJSON()),
	}
}

func writeFile(t *testing.T, p, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func bashReq(script string) *process.StartRequest {
	f := false
	return &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", script}}, Stdin: &f}
}

// result is a finished command as the client saw it.
type result struct {
	pid    uint32
	stdout string
	stderr string
	pty    string
	order  []string // "o:..." / "e:..." chunks in arrival order
	end    *process.ProcessEvent_EndEvent
	keep   int
}

func (r *result) add(ev *process.ProcessEvent) {
	switch e := ev.Event.(type) {
	case *process.ProcessEvent_Start:
		r.pid = e.Start.Pid
	case *process.ProcessEvent_Data:
		switch o := e.Data.Output.(type) {
		case *process.ProcessEvent_DataEvent_Stdout:
			r.stdout += string(o.Stdout)
			r.order = append(r.order, "o:"+string(o.Stdout))
		case *process.ProcessEvent_DataEvent_Stderr:
			r.stderr += string(o.Stderr)
			r.order = append(r.order, "e:"+string(o.Stderr))
		case *process.ProcessEvent_DataEvent_Pty:
			r.pty += string(o.Pty)
		}
	case *process.ProcessEvent_End:
		r.end = e.End
	case *process.ProcessEvent_Keepalive:
		r.keep++
	}
}

// run starts a command and collects its events until the end.
func (e *testEnv) run(ctx context.Context, req *process.StartRequest, hdr ...string) *result {
	e.t.Helper()
	creq := connect.NewRequest(req)
	for i := 0; i+1 < len(hdr); i += 2 {
		creq.Header().Set(hdr[i], hdr[i+1])
	}
	stream, err := e.proc.Start(ctx, creq)
	if err != nil {
		e.t.Fatalf("start: %v", err)
	}
	defer stream.Close()
	r := &result{}
	first := true
	for stream.Receive() {
		ev := stream.Msg().Event
		if first {
			if _, ok := ev.Event.(*process.ProcessEvent_Start); !ok {
				e.t.Fatalf("first event is %v, want start", ev)
			}
			first = false
		}
		r.add(ev)
	}
	if err := stream.Err(); err != nil {
		e.t.Fatalf("stream: %v (so far %+v)", err, r)
	}
	if r.end == nil {
		e.t.Fatalf("no end event (so far %+v)", r)
	}
	return r
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// frame is one Connect streaming envelope.
type frame struct {
	flags byte
	body  []byte
}

// rawStart posts a Start request by hand and returns the envelopes.
func rawStream(t *testing.T, url, procedure string, msg any, hdr http.Header) (*http.Response, []frame) {
	t.Helper()
	body, _ := json.Marshal(msg)
	var env bytes.Buffer
	env.WriteByte(0)
	_ = binary.Write(&env, binary.BigEndian, uint32(len(body)))
	env.Write(body)
	req, _ := http.NewRequest("POST", url+procedure, &env)
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var frames []frame
	for {
		var h [5]byte
		if _, err := io.ReadFull(resp.Body, h[:]); err != nil {
			break
		}
		n := binary.BigEndian.Uint32(h[1:])
		b := make([]byte, n)
		if _, err := io.ReadFull(resp.Body, b); err != nil {
			t.Fatalf("short frame: %v", err)
		}
		frames = append(frames, frame{h[0], b})
	}
	return resp, frames
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// pidsOfUID lists the live processes of a uid.
func pidsOfUID(uid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		var state string
		var u int = -1
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "State:"); ok {
				state = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				fmt.Sscan(v, &u)
			}
		}
		if u == uid && !strings.HasPrefix(state, "Z") {
			var pid int
			fmt.Sscan(e.Name(), &pid)
			out = append(out, pid)
		}
	}
	return out
}

func syscallKill(pid int) error { return unix.Kill(pid, unix.SIGKILL) }

func basicAuth(user string) string {
	return "Basic " + b64(user+":")
}

// jsonEqual compares JSON texts semantically (protojson randomizes spaces).
func jsonEqual(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("bad JSON %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad want JSON %s: %v", want, err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if string(gb) != string(wb) {
		t.Fatalf("got %s\nwant %s", got, want)
	}
}
