package conformance

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// impersonateScript is what a root process inside a sandbox tries against
// the agent (PID 1) and its channel to the daemon: find the channel token
// (the agent's config file, PID 1's environment or memory, ptrace,
// process_vm_readv, PID 1's fds through pidfd_getfd), then dial the
// daemon's socket with it, once while the agent's session is live and once
// right after asking the agent to redial (SIGUSR1, the daemon's own "your
// connection broke" signal), hoping to be the agent the daemon accepts. It
// prints one JSON object: per probe what happened. A daemon that accepts a
// hello opens streams at once, so "accepted" means it sent bytes; "refused"
// means it closed the connection.
const impersonateScript = `
import ctypes, json, os, select, signal, socket

SOCK = '/run/cella/agent.sock'
out = {}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]

def denied(e):
    return 'denied: ' + (e.strerror if isinstance(e, OSError) and e.strerror else str(e))

def errno_denied(what):
    return 'denied: %s: %s' % (what, os.strerror(ctypes.get_errno()))

token = ''
try:
    cfg = json.load(open('/run/cella/config.json'))
    token = cfg.get('channel_token', '')
    out['config'] = 'read (channel_token %s)' % ('present' if token else 'absent')
except Exception as e:
    out['config'] = denied(e)
try:
    open('/proc/1/environ', 'rb').read()
    out['environ'] = 'read'
except Exception as e:
    out['environ'] = denied(e)
addr = 0x400000  # where a static Go binary's text starts
try:
    for line in open('/proc/1/maps'):
        rng, perms = line.split()[:2]
        if perms.startswith('r'):
            addr = int(rng.split('-')[0], 16)
            break
    out['maps'] = 'read'
except Exception as e:
    out['maps'] = denied(e)
try:
    with open('/proc/1/mem', 'rb') as f:
        f.seek(addr)
        out['mem'] = 'read %d bytes' % len(f.read(4096))
except Exception as e:
    out['mem'] = denied(e)

if libc.ptrace(16, 1, None, None) == 0:  # PTRACE_ATTACH
    out['ptrace'] = 'attached'
    os.waitpid(1, 0x40000000)  # __WALL
    libc.ptrace(17, 1, None, None)  # PTRACE_DETACH
else:
    out['ptrace'] = errno_denied('ptrace')

class iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
buf = ctypes.create_string_buffer(64)
local, remote = iovec(ctypes.cast(buf, ctypes.c_void_p), 64), iovec(addr, 64)
n = libc.syscall(310, 1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)  # process_vm_readv
if n > 0:
    out['process_vm_readv'] = 'read %d bytes' % n
elif ctypes.get_errno() in (1, 13):  # EPERM, EACCES
    out['process_vm_readv'] = errno_denied('process_vm_readv')
else:
    out['process_vm_readv'] = 'not refused: ' + os.strerror(ctypes.get_errno())

pfd = libc.syscall(434, 1, 0)  # pidfd_open
if pfd < 0:
    out['pidfd_getfd'] = errno_denied('pidfd_open')
else:
    got, last = [], 0
    for fd in range(64):
        r = libc.syscall(438, pfd, fd, 0)  # pidfd_getfd
        if r >= 0:
            got.append(fd)
            os.close(r)
        elif ctypes.get_errno() != 9:  # EBADF: no such fd in PID 1
            last = ctypes.get_errno()
    out['pidfd_getfd'] = ('got PID 1 fds %s' % got) if got else 'denied: pidfd_getfd: ' + os.strerror(last or 1)
    os.close(pfd)

def hijack(redial):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(SOCK)
    except Exception as e:
        return denied(e)
    hello = {'sandbox_id': os.environ.get('E2B_SANDBOX_ID', ''), 'token': token or 'guessed-' + 'a' * 32, 'version': '0.5.7', 'pid': os.getpid()}
    s.sendall((json.dumps(hello) + '\n').encode())
    if redial:
        os.kill(1, signal.SIGUSR1)
    r, _, _ = select.select([s], [], [], 30)
    if not r:
        s.close()
        return 'no answer within 30s (the hello waits to be taken)'
    try:
        b = s.recv(64)
    except OSError:
        b = b''
    s.close()
    return ('accepted: the daemon sent %d bytes' % len(b)) if b else 'refused'

out['hello_while_live'] = hijack(False)
out['hello_after_redial_signal'] = hijack(True)
print(json.dumps(out))
`

// testAgentChannel is the attack of a sandbox's root on the daemon↔agent
// channel: it must not learn the channel's credential, not read or trace the
// agent, not be accepted as the agent, and not make the agent drop its
// session; the daemon's audit log records each refused hello as a
// daemon-observed security event.
func testAgentChannel(t *testing.T, env *daemontest.Env) {
	sb := create(t, env, client.CreateRequest{})
	// The attack runs in the foreground: a session the attack broke or
	// replaced would end this very exec's stream.
	res, err := sb.Exec(ctxT(t, 3*time.Minute), "python3 -c \"$SCRIPT\" | tee /tmp/attack.json", client.ExecOptions{
		User: "root", Env: map[string]string{"SCRIPT": impersonateScript}, Timeout: 2 * time.Minute,
	})
	out := res.Stdout
	if err != nil {
		// Read what the attack found once the daemon reaches the agent again.
		var got string
		waitFor(t, 2*time.Minute, "the attack's report after the exec stream broke", func() bool {
			r, e := sb.Exec(ctxT(t, time.Minute), "cat /tmp/attack.json", client.ExecOptions{Timeout: 30 * time.Second})
			got = r.Stdout
			return e == nil && strings.TrimSpace(got) != ""
		})
		t.Errorf("the attack broke the agent's session: the exec running it failed with %v (report: %s)", err, got)
		out = got
	}
	var report map[string]string
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &report); err != nil {
		t.Fatalf("attack report: %v: stdout %q stderr %q", err, out, res.Stderr)
	}
	t.Logf("attack report: %v", report)
	for _, probe := range []string{"config", "environ", "mem", "ptrace", "process_vm_readv", "pidfd_getfd"} {
		v, ok := report[probe]
		if !ok {
			t.Errorf("probe %s did not run: %v", probe, report)
			continue
		}
		// The config may exist once the agent has read it, but without the token.
		if !strings.HasPrefix(v, "denied") && !(probe == "config" && strings.Contains(v, "absent")) {
			t.Errorf("sandbox root reached the agent's secrets through %s: %s", probe, v)
		}
	}
	for _, probe := range []string{"hello_while_live", "hello_after_redial_signal"} {
		if v := report[probe]; v != "refused" && !strings.HasPrefix(v, "denied") {
			t.Errorf("%s: a fake agent's hello was not refused: %s", probe, v)
		}
	}

	// The real agent still serves the owner, over the same session.
	if got := mustOK(t, sb, "echo still-the-agent"); got != "still-the-agent\n" {
		t.Fatalf("after the attack: %q", got)
	}
	// Each refused hello is a security event in the audit log, marked as
	// the daemon's own observation; the agent's reports are marked as the
	// sandbox's.
	var sec []auditRow
	waitFor(t, time.Minute, "the refused hellos in the audit log", func() bool {
		sec = auditRows(t, env, sb.ID, "security")
		return len(sec) >= 2
	})
	for _, e := range sec {
		if e.Observed != "daemon" || e.Source != "daemon" || !strings.Contains(e.Message, "refused") {
			t.Errorf("security entry: %+v, want observed=daemon source=daemon and a refusal message", e)
		}
	}
	checkObserved(t, env, sb.ID)
}

// testRunDirReadOnly: root in a sandbox can create, write, delete or rename
// nothing in /run/cella (a host directory), and the agent's config with its
// secrets is gone by the time the sandbox is handed out.
func testRunDirReadOnly(t *testing.T, env *daemontest.Env) {
	sb := create(t, env, client.CreateRequest{})
	script := `cd /run/cella || exit 1
try() { if "$@" 2>/dev/null; then echo "ALLOWED: $*"; fi; }
try touch /run/cella/new
try mkdir /run/cella/dir
try dd if=/dev/zero of=/run/cella/fill bs=1M count=8 status=none
try sh -c 'echo {} > /run/cella/config.json'
try rm -f /run/cella/agent.sock
try mv /run/cella/agent.sock /run/cella/moved
try ln -s / /run/cella/link
try mknod /run/cella/fifo p
try chmod 0777 /run/cella
try python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("/run/cella/fake.sock")'
for f in /run/cella/*; do try rm -f "$f"; done
echo done`
	out := run(t, sb, script, client.ExecOptions{User: "root", Timeout: time.Minute})
	if strings.Contains(out.Stdout, "ALLOWED") || !strings.Contains(out.Stdout, "done") {
		t.Errorf("sandbox root changed /run/cella:\n%s%s", out.Stdout, out.Stderr)
	}
	onlySocketInRunDir(t, env, sb.ID)
	if got := mustOK(t, sb, "echo alive"); got != "alive\n" {
		t.Fatalf("after the attempts: %q", got)
	}
}

// onlySocketInRunDir checks that a running sandbox's run dir holds the
// daemon's socket and nothing else: the agent's config (its first channel
// credential, the access token, env vars) goes once the agent has said
// hello, and a sandbox restored from memory never gets one.
func onlySocketInRunDir(t *testing.T, env *daemontest.Env, id string) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(env.DataDir, "sandboxes", id, "run"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"agent.sock"}) {
		t.Errorf("sandbox %s: host run dir holds %v, want only agent.sock", id, names)
	}
}

// auditRow is the part of an audit entry these tests look at.
type auditRow struct {
	Kind     string `json:"kind"`
	Source   string `json:"source"`
	Observed string `json:"observed"`
	Message  string `json:"message"`
}

func auditRows(t *testing.T, env *daemontest.Env, id, kinds string) []auditRow {
	t.Helper()
	q := url.Values{}
	if kinds != "" {
		q.Set("kind", kinds)
	}
	req, _ := http.NewRequestWithContext(context.Background(), "GET", env.URL+"/sandboxes/"+id+"/logs?"+q.Encode(), nil)
	req.Header.Set("X-API-Key", env.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET logs: %s", resp.Status)
	}
	var body struct {
		Entries []auditRow `json:"entries"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body.Entries
}

// checkObserved: what the daemon saw itself (lifecycle, security events,
// the proxy's decisions) is marked observed=daemon; what the agent inside
// reported (processes, files) is marked observed=sandbox.
func checkObserved(t *testing.T, env *daemontest.Env, id string) {
	t.Helper()
	want := map[string]string{"lifecycle": "daemon", "security": "daemon", "connect": "daemon", "dns": "daemon",
		"process.start": "sandbox", "process.exit": "sandbox", "file.write": "sandbox"}
	seen := map[string]bool{}
	waitFor(t, time.Minute, "lifecycle and process entries in the audit log", func() bool {
		clear(seen)
		for _, e := range auditRows(t, env, id, "") {
			if w, ok := want[e.Kind]; ok && e.Observed != w {
				t.Fatalf("%s entry marked observed=%q, want %q: %+v", e.Kind, e.Observed, w, e)
			}
			seen[e.Kind] = true
		}
		return seen["lifecycle"] && seen["process.start"] && seen["process.exit"]
	})
}

// fakeDaemonScript listens where the agent dials the daemon and keeps what
// it is told in /tmp/fake-daemon.log; it touches /tmp/fake-daemon.ready
// once listening.
const fakeDaemonScript = `
import socket, threading
s = socket.socket(socket.AF_UNIX)
s.bind('/run/cella/agent.sock')
s.listen(8)
open('/tmp/fake-daemon.ready', 'w').close()
def serve(c):
    with open('/tmp/fake-daemon.log', 'ab') as f:
        while True:
            b = c.recv(4096)
            if not b:
                return
            f.write(b)
            f.flush()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
`

// testFakeDaemon: root tries to put a socket of its own where the agent
// dials the daemon — replacing /run/cella/agent.sock, or moving /run aside
// (the /run/cella mount would go with it) and making a new /run/cella — and
// then to make the agent dial again without the daemon listening anew: with
// the redial signal, and under gVisor with a snapshot, whose checkpoint
// breaks the agent's connection. A planted socket would learn the agent's
// credential and sit between the daemon and the agent. Either the plant
// fails, or the agent still reaches the daemon and the planted socket hears
// nothing.
func testFakeDaemon(t *testing.T, env *daemontest.Env) {
	sb := create(t, env, client.CreateRequest{})
	plant := `if python3 -c 'import os; os.rename("/run", "/run.moved")' 2>/dev/null; then mkdir -p /run/cella || exit 1
elif ! rm -f /run/cella/agent.sock 2>/dev/null; then echo cannot-plant; exit 0
fi
nohup python3 -c "$FAKE" >/tmp/fake-daemon.err 2>&1 &
while [ ! -e /tmp/fake-daemon.ready ]; do if ! kill -0 $! 2>/dev/null; then cat /tmp/fake-daemon.err; exit 1; fi; sleep 0.05; done
echo planted`
	res := run(t, sb, plant, client.ExecOptions{User: "root", Env: map[string]string{"FAKE": fakeDaemonScript}, Timeout: time.Minute})
	switch res.Stdout {
	case "cannot-plant\n":
		t.Log("root can neither replace the agent's socket nor move /run/cella aside")
	case "planted\n":
		t.Log("root planted a socket where the agent dials")
	default:
		t.Fatalf("planting the fake daemon: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	// The exec's own stream goes if the agent drops its session.
	_, _ = sb.Exec(ctxT(t, time.Minute), "kill -USR1 1", client.ExecOptions{User: "root", Timeout: 30 * time.Second})
	if env.Daemon.Runtime.Name() == runtime.GVisor {
		if _, err := env.Client.Snapshot(ctxT(t, 3*time.Minute), sb.ID, ""); err != nil {
			t.Fatalf("snapshot: %v", err)
		}
	}
	if out := mustOK(t, sb, "cat /tmp/fake-daemon.log 2>/dev/null; echo end"); out != "end\n" {
		t.Fatalf("the agent dialed the planted socket and told it: %q", out)
	}
}
