package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/envd/process"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// startBG starts cmd (bash -c) in the background and returns its pid; the
// process keeps running after the stream is closed.
func startBG(t *testing.T, sb *client.SandboxConn, cmd string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", cmd}},
	})
	// Keepalives make the proxy notice quickly that this client left.
	req.Header().Set("Keepalive-Ping-Interval", "1")
	stream, err := sb.Process.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() {
		t.Fatalf("start %q: %v", cmd, stream.Err())
	}
	return int(stream.Msg().GetEvent().GetStart().GetPid())
}

// ptyConn is a test WebSocket client of /sandboxes/{id}/pty.
type ptyConn struct {
	t       *testing.T
	c       *websocket.Conn
	mu      sync.Mutex
	out     strings.Builder
	session map[string]any
	exit    map[string]any
	done    chan struct{}
}

func dialPTY(t *testing.T, env *daemontest.Env, id, query string, hdr http.Header, protos ...string) (*ptyConn, *http.Response, error) {
	t.Helper()
	u := strings.Replace(env.URL, "http://", "ws://", 1) + "/sandboxes/" + id + "/pty" + query
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: hdr, Subprotocols: protos})
	if err != nil {
		return nil, resp, err
	}
	p := &ptyConn{t: t, c: c, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			typ, data, err := c.Read(context.Background())
			if err != nil {
				return
			}
			p.mu.Lock()
			if typ == websocket.MessageBinary {
				p.out.Write(data)
			} else {
				var m map[string]any
				_ = json.Unmarshal(data, &m)
				switch m["type"] {
				case "session":
					p.session = m
				case "exit":
					p.exit = m
				}
			}
			p.mu.Unlock()
		}
	}()
	return p, resp, nil
}

func (p *ptyConn) send(s string) {
	p.t.Helper()
	if err := p.c.Write(context.Background(), websocket.MessageBinary, []byte(s)); err != nil {
		p.t.Fatal(err)
	}
}

func (p *ptyConn) control(m map[string]any) {
	p.t.Helper()
	b, _ := json.Marshal(m)
	if err := p.c.Write(context.Background(), websocket.MessageText, b); err != nil {
		p.t.Fatal(err)
	}
}

func (p *ptyConn) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// waitFor waits until the output contains s.
func (p *ptyConn) waitFor(s string, d time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if strings.Contains(p.output(), s) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.t.Fatalf("no %q in the pty output within %v; output:\n%q", s, d, p.output())
}

func (p *ptyConn) sessionID() string {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		s := p.session
		p.mu.Unlock()
		if s != nil {
			return s["session"].(string)
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.t.Fatal("no session message")
	return ""
}

func TestInteract(t *testing.T) {
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{})
	a := apiT{env: env}
	key := env.APIKey
	ctx := context.Background()
	created, err := env.Client.Create(ctx, client.CreateRequest{Timeout: new(int64(600))})
	if err != nil {
		t.Fatal(err)
	}
	id := created.SandboxID
	sb, err := env.Client.Sandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	apiKeyHdr := http.Header{"X-Api-Key": {key}}

	t.Run("PTYWithoutHandshake", func(t *testing.T) {
		// A plain GET is refused before any shell starts: none is left in
		// the sandbox that nobody could reach or end.
		req, _ := http.NewRequestWithContext(ctx, "GET", env.URL+"/sandboxes/"+id+"/pty", nil)
		req.Header = apiKeyHdr.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(body), "WebSocket") || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("plain GET /pty: %d %s %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		r, err := sb.Exec(ctx, "ps -eo args= | grep -c '[b]ash -i -l' || true", client.ExecOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(r.Stdout) != "0" {
			t.Fatalf("a shell was started for a plain GET: %q", r.Stdout)
		}
	})

	t.Run("PTY", func(t *testing.T) {
		if _, resp, err := dialPTY(t, env, id, "", nil); err == nil || resp == nil || resp.StatusCode != 401 {
			t.Fatalf("pty without a key: want 401, got %v %v", resp, err)
		}
		p, _, err := dialPTY(t, env, id, "?cols=80&rows=24", apiKeyHdr)
		if err != nil {
			t.Fatal(err)
		}
		sid := p.sessionID()
		// Typing a command shows its output (the arithmetic proves it ran,
		// not just that the keystrokes were echoed).
		p.send("echo hello-$((40+2))\r")
		p.waitFor("hello-42", 15*time.Second)

		// Resize: stty sees the new size.
		p.control(map[string]any{"type": "resize", "cols": 101, "rows": 37})
		p.send("stty size\r")
		p.waitFor("37 101", 10*time.Second)

		// Ctrl-C interrupts a foreground sleep.
		// The marker (computed, so not the echo of the typed line) is
		// printed by the foreground job itself, which then becomes the
		// sleep: once it shows, a ^C reaches the job. (Printed by the shell
		// before it starts the job, a ^C could land in between and be lost.)
		p.send("sh -c 'echo started-$((6+7)); exec sleep 100'\r")
		p.waitFor("started-13", 10*time.Second)
		start := time.Now()
		p.send("\x03")
		p.send("echo after-$((2+3))\r")
		p.waitFor("after-5", 10*time.Second)
		if time.Since(start) > 10*time.Second {
			t.Fatal("Ctrl-C did not interrupt sleep")
		}

		// A second client on the same session sees the same output, and
		// its replay holds what came before it attached.
		p2, _, err := dialPTY(t, env, id, "?session="+sid, apiKeyHdr)
		if err != nil {
			t.Fatal(err)
		}
		p2.waitFor("hello-42", 10*time.Second)
		p.send("echo both-$((3+4))\r")
		p.waitFor("both-7", 10*time.Second)
		p2.waitFor("both-7", 10*time.Second)
		// Input from the second client reaches the same shell.
		p2.send("echo second-$((5+5))\r")
		p.waitFor("second-10", 10*time.Second)

		// Detach everyone; the shell prints while nobody watches; re-attach
		// from the offset we had and get only the new output replayed.
		p.send("sleep 1; echo detached-$((4+5))\r")
		time.Sleep(200 * time.Millisecond)
		p.mu.Lock()
		off := int(p.session["offset"].(float64)) + p.out.Len() - int(p.session["replay"].(float64))
		p.mu.Unlock()
		p.c.Close(websocket.StatusNormalClosure, "")
		p2.c.Close(websocket.StatusNormalClosure, "")
		<-p.done
		<-p2.done
		time.Sleep(2 * time.Second)
		p3, _, err := dialPTY(t, env, id, fmt.Sprintf("?session=%s&offset=%d", sid, off), apiKeyHdr)
		if err != nil {
			t.Fatal(err)
		}
		p3.waitFor("detached-9", 10*time.Second)
		if strings.Contains(p3.output(), "hello-42") {
			t.Fatalf("replay from offset %d repeated old output: %q", off, p3.output())
		}

		// The exit code ends the session for every client.
		p3.send("exit 3\r")
		select {
		case <-p3.done:
		case <-time.After(10 * time.Second):
			t.Fatal("the socket stayed open after the shell exited")
		}
		if p3.exit == nil || p3.exit["exitCode"].(float64) != 3 {
			t.Fatalf("exit message: %v", p3.exit)
		}
		if _, resp, err := dialPTY(t, env, id, "?session="+sid, apiKeyHdr); err == nil || resp == nil || resp.StatusCode != 404 {
			t.Fatalf("ended session: want 404, got %v %v", resp, err)
		}

		// Browser-style auth: ?key= and the cella-key.<key> subprotocol.
		for _, c := range []struct {
			query  string
			protos []string
		}{{"?key=" + url.QueryEscape(key), nil}, {"", []string{"cella.pty", "cella-key." + key}}} {
			pb, _, err := dialPTY(t, env, id, c.query, nil, c.protos...)
			if err != nil {
				t.Fatalf("browser auth %v: %v", c, err)
			}
			if c.protos != nil && pb.c.Subprotocol() != "cella.pty" {
				t.Fatalf("subprotocol %q", pb.c.Subprotocol())
			}
			pb.sessionID()
			pb.control(map[string]any{"type": "kill"})
			select {
			case <-pb.done:
			case <-time.After(10 * time.Second):
				t.Fatal("kill did not end the session")
			}
		}
	})

	t.Run("WaitPort", func(t *testing.T) {
		startBG(t, sb, "mkdir -p /tmp/w && cd /tmp/w && echo waited > index.html && sleep 2 && exec python3 -m http.server 8123")
		start := time.Now()
		st, _, body := a.do(t, "POST", "/sandboxes/"+id+"/wait", key, map[string]any{"port": 8123, "timeout": 30}, nil)
		if st != 200 {
			t.Fatalf("wait port: %d %s", st, body)
		}
		// Right after the wait, the port answers (no retry).
		st2, _, body2 := a.do(t, "GET", "/index.html", "", nil, map[string]string{"Host": fmt.Sprintf("8123-%s.cella.test", id)})
		if st2 != 200 || string(body2) != "waited\n" {
			t.Fatalf("port right after wait: %d %s", st2, body2)
		}
		if time.Since(start) < 1500*time.Millisecond {
			t.Fatalf("wait returned after %v, before the server could listen", time.Since(start))
		}
		// The agent saw it in /proc/net/tcp{,6} (gVisor provides them), not by connecting.
		if r, err := sb.Exec(ctx, "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null", client.ExecOptions{}); err != nil || !strings.Contains(r.Stdout, ":1FBB") {
			t.Fatalf("/proc/net/tcp in the sandbox does not show port 8123 listening: %q %v", r.Stdout, err)
		}
		var res client.WaitResult
		_ = json.Unmarshal(body, &res)
		if !res.Ready || res.Port != 8123 {
			t.Fatalf("wait body %s", body)
		}
		st, _, body = a.do(t, "POST", "/sandboxes/"+id+"/wait", key, map[string]any{"port": 8999, "timeout": "1s"}, nil)
		if st != 408 || !strings.Contains(string(body), "timeout") || !strings.Contains(string(body), `"ready":false`) {
			t.Fatalf("wait on a closed port: want 408 naming the timeout, got %d %s", st, body)
		}
		st, _, body = a.do(t, "POST", "/sandboxes/"+id+"/wait", key, map[string]any{}, nil)
		a.wantError(t, 400, st, body, "port")
	})

	t.Run("WaitLogAndLogs", func(t *testing.T) {
		// Writes to stdout and stderr are read by separate goroutines, so
		// the merged order is defined only for writes some time apart.
		pid := startBG(t, sb, "echo booting; sleep 1.5; echo 'server ready on port 5000'; sleep 0.3; echo oops >&2; sleep 0.5; echo bye")
		start := time.Now()
		res, err := env.Client.Wait(ctx, id, client.WaitRequest{Log: `ready on port \d+`, PID: pid, Timeout: 20})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Ready || res.Line != "server ready on port 5000" {
			t.Fatalf("wait log: %+v", res)
		}
		if el := time.Since(start); el < time.Second {
			t.Fatalf("log wait returned after %v, before the line was printed", el)
		}
		// A line printed before the wait counts too.
		if res, err := env.Client.Wait(ctx, id, client.WaitRequest{Log: `^booting$`, PID: pid, Timeout: 5}); err != nil || !res.Ready {
			t.Fatalf("earlier line: %+v %v", res, err)
		}
		// After the process ended, its logs are still there.
		deadline := time.Now().Add(15 * time.Second)
		var logs client.ProcessLogs
		for {
			logs, err = env.Client.ProcessLogs(ctx, id, pid)
			if err != nil {
				t.Fatal(err)
			}
			if !logs.Running || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if logs.Running || logs.ExitCode == nil || *logs.ExitCode != 0 {
			t.Fatalf("logs after exit: %+v", logs)
		}
		var got []string
		for _, l := range logs.Lines {
			got = append(got, l.Stream+":"+l.Line)
			if l.Time.IsZero() {
				t.Fatalf("line without a timestamp: %+v", l)
			}
		}
		want := "stdout:booting|stdout:server ready on port 5000|stderr:oops|stdout:bye"
		if strings.Join(got, "|") != want {
			t.Fatalf("log lines %q, want %q", strings.Join(got, "|"), want)
		}
		st, hdr, body := a.do(t, "GET", fmt.Sprintf("/sandboxes/%s/processes/%d/logs?format=text&stream=stdout", id, pid), key, nil, nil)
		if st != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") || string(body) != "booting\nserver ready on port 5000\nbye\n" {
			t.Fatalf("text logs: %d %q", st, body)
		}
		// A wait on a process that ends without the line answers 409.
		pid2 := startBG(t, sb, "echo nothing here")
		_, err = env.Client.Wait(ctx, id, client.WaitRequest{Log: "never", PID: pid2, Timeout: 10})
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.Status != 409 {
			t.Fatalf("wait on an ended process: %v", err)
		}
		st, _, body = a.do(t, "GET", fmt.Sprintf("/sandboxes/%s/processes/999999/logs", id), key, nil, nil)
		a.wantError(t, 404, st, body, "999999")
	})

	t.Run("ExposeWebSocketStreaming", func(t *testing.T) {
		if err := sb.WriteFile(ctx, "/tmp/ws.py", "", strings.NewReader(wsServerPy)); err != nil {
			t.Fatal(err)
		}
		if err := sb.WriteFile(ctx, "/tmp/stream.py", "", strings.NewReader(streamServerPy)); err != nil {
			t.Fatal(err)
		}
		startBG(t, sb, "exec python3 /tmp/ws.py")
		startBG(t, sb, "exec python3 /tmp/stream.py")
		for _, port := range []int{8765, 8766} {
			if res, err := env.Client.Wait(ctx, id, client.WaitRequest{Port: port, Timeout: 20}); err != nil || !res.Ready {
				t.Fatalf("wait %d: %+v %v", port, res, err)
			}
		}
		e, err := env.Client.Expose(ctx, id, 8765)
		if err != nil {
			t.Fatal(err)
		}
		daemonAddr := strings.TrimPrefix(env.URL, "http://")
		_, dport, _ := net.SplitHostPort(daemonAddr)
		if want := fmt.Sprintf("http://8765-%s.cella.test:%s/", id, dport); e.URL != want {
			t.Fatalf("expose URL %q, want %q", e.URL, want)
		}
		// Every connection goes to the daemon: this is what wildcard DNS
		// for the domain would do.
		hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, daemonAddr)
		}}}
		wsURL := strings.Replace(e.URL, "http://", "ws://", 1) + "echo"
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		wc, _, err := websocket.Dial(dctx, wsURL, &websocket.DialOptions{HTTPClient: hc})
		if err != nil {
			t.Fatalf("websocket through the proxy: %v", err)
		}
		for _, msg := range []string{"one", "two"} {
			if err := wc.Write(dctx, websocket.MessageText, []byte(msg)); err != nil {
				t.Fatal(err)
			}
			_, data, err := wc.Read(dctx)
			if err != nil || string(data) != "echo:"+msg {
				t.Fatalf("websocket echo: %q %v", data, err)
			}
		}
		wc.Close(websocket.StatusNormalClosure, "")

		// A chunked response arrives chunk by chunk, not at the end. The
		// producer spreads its chunks over 3 s; a buffering proxy would hand
		// them all over together at the end. Timing is measured between
		// chunks, not from the request, so a slow connect does not count.
		e2, _ := env.Client.Expose(ctx, id, 8766)
		resp, err := hc.Get(e2.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("stream: %d", resp.StatusCode)
		}
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		if err != nil || line != "chunk0\n" {
			t.Fatalf("first chunk %q %v", line, err)
		}
		first := time.Now()
		rest, _ := io.ReadAll(br)
		if string(rest) != "chunk1\nchunk2\n" {
			t.Fatalf("rest %q", rest)
		}
		if el := time.Since(first); el < 1500*time.Millisecond {
			t.Fatalf("the first chunk came only %v before the last (sent 3 s apart): the proxy buffered the stream", el)
		}

		// A POST answered as soon as its body is read, with the answer
		// streaming on: the proxy must not cut the stream short. (net/http
		// used to close the request body under the transport when the
		// response header went out, which killed about one answer in 200.)
		for i := range 400 {
			if err := postStreamRaw(daemonAddr, e2.URL, fmt.Sprintf("req%d", i)); err != nil {
				t.Fatalf("POST %d through the proxy: %v", i, err)
			}
		}
	})

	t.Run("TrafficToken", func(t *testing.T) {
		st, _, body := a.do(t, "POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "timeout": 120, "network": map[string]any{"allowPublicTraffic": false}}, nil)
		if st != 201 {
			t.Fatalf("create: %d %s", st, body)
		}
		var cr struct {
			SandboxID          string  `json:"sandboxID"`
			EnvdAccessToken    string  `json:"envdAccessToken"`
			TrafficAccessToken *string `json:"trafficAccessToken"`
		}
		_ = json.Unmarshal(body, &cr)
		if cr.TrafficAccessToken == nil || *cr.TrafficAccessToken == "" {
			t.Fatalf("no trafficAccessToken in %s", body)
		}
		defer env.Client.Kill(ctx, cr.SandboxID)
		if created.SandboxID != "" {
			if st, _, body := a.do(t, "GET", "/sandboxes/"+id, key, nil, nil); st != 200 || !strings.Contains(string(body), `"trafficAccessToken":null`) {
				t.Fatalf("public sandbox: %d %s", st, body)
			}
		}
		sb2, err := env.Client.Sandbox(ctx, cr.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		startBG(t, sb2, "mkdir -p /tmp/p && cd /tmp/p && echo private > index.html && exec python3 -m http.server 8124")
		if _, err := env.Client.Wait(ctx, cr.SandboxID, client.WaitRequest{Port: 8124, Timeout: 20}); err != nil {
			t.Fatal(err)
		}
		host := fmt.Sprintf("8124-%s.cella.test", cr.SandboxID)
		st, _, body = a.do(t, "GET", "/index.html", "", nil, map[string]string{"Host": host})
		if st != 403 || !strings.Contains(string(body), `"code":403`) || !strings.Contains(string(body), "e2b-traffic-access-token") {
			t.Fatalf("without token: want 403 JSON, got %d %s", st, body)
		}
		st, _, body = a.do(t, "GET", "/index.html", "", nil, map[string]string{"Host": host, "e2b-traffic-access-token": "wrong"})
		if st != 403 {
			t.Fatalf("wrong token: want 403, got %d %s", st, body)
		}
		st, _, body = a.do(t, "GET", "/index.html", "", nil, map[string]string{"Host": host, "e2b-traffic-access-token": *cr.TrafficAccessToken})
		if st != 200 || string(body) != "private\n" {
			t.Fatalf("with token: %d %s", st, body)
		}
		// The agent's port keeps its own auth (X-Access-Token), no traffic token.
		st, _, body = a.do(t, "GET", "/health", "", nil, map[string]string{"E2b-Sandbox-Id": cr.SandboxID, "E2b-Sandbox-Port": "49983"})
		if st != 204 {
			t.Fatalf("envd health without traffic token: %d %s", st, body)
		}
	})
}

// wsServerPy is a minimal WebSocket echo server (no third-party modules).
const wsServerPy = `
import socket, hashlib, base64, threading, struct
G = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def handle(c):
    data = b""
    while b"\r\n\r\n" not in data:
        data += c.recv(4096)
    hdrs = {}
    for l in data.split(b"\r\n")[1:]:
        if b":" in l:
            k, v = l.split(b":", 1)
            hdrs[k.strip().lower()] = v.strip()
    acc = base64.b64encode(hashlib.sha1(hdrs[b"sec-websocket-key"] + G).digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    def rd(n):
        b = b""
        while len(b) < n:
            x = c.recv(n - len(b))
            if not x:
                raise EOFError
            b += x
        return b
    try:
        while True:
            h = rd(2); op = h[0] & 15; n = h[1] & 127
            if n == 126: n = struct.unpack(">H", rd(2))[0]
            elif n == 127: n = struct.unpack(">Q", rd(8))[0]
            mask = rd(4) if h[1] & 128 else b"\0\0\0\0"
            p = bytes(b ^ mask[i % 4] for i, b in enumerate(rd(n)))
            if op == 8:
                c.sendall(b"\x88\x00"); return
            out = b"echo:" + p
            hdr = bytes([0x80 | op]) + (bytes([len(out)]) if len(out) < 126 else b"\x7e" + struct.pack(">H", len(out)))
            c.sendall(hdr + out)
    except EOFError:
        pass
    finally:
        c.close()
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8765)); s.listen(8)
while True:
    c, _ = s.accept()
    threading.Thread(target=handle, args=(c,), daemon=True).start()
`

// streamServerPy answers every GET with three chunks 1.5 s apart.
const streamServerPy = `
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        for i in range(3):
            d = ("chunk%d\n" % i).encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(d), d)); self.wfile.flush()
            if i < 2: time.sleep(1.5)
        self.wfile.write(b"0\r\n\r\n"); self.wfile.flush()
    def do_POST(self):
        # Answers the moment the body is read and keeps streaming after it:
        # the shape of the code interpreter's /execute.
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(3):
            d = b"%s-%d\n" % (body, i)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(d), d)); self.wfile.flush()
            time.sleep(0.002)
        self.wfile.write(b"0\r\n\r\n"); self.wfile.flush()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8766), H).serve_forever()
`

// postStreamRaw sends a POST the way Node's fetch does (the header in one
// write, the body in the next) and checks the whole streamed answer arrived.
func postStreamRaw(daemonAddr, url, payload string) error {
	c, err := net.Dial("tcp", daemonAddr)
	if err != nil {
		return err
	}
	defer c.Close()
	host := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")
	if _, err := fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n", host, len(payload)); err != nil {
		return err
	}
	time.Sleep(500 * time.Microsecond)
	if _, err := io.WriteString(c, payload); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	got, err := io.ReadAll(resp.Body)
	want := fmt.Sprintf("%[1]s-0\n%[1]s-1\n%[1]s-2\n", payload)
	if err != nil || resp.StatusCode != 200 || string(got) != want {
		return fmt.Errorf("status %d, body %q (want %q), err %v", resp.StatusCode, got, want, err)
	}
	return nil
}
