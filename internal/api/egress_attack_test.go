package api_test

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// TestEgressAttacks are attacks on the egress proxy from inside a real
// gVisor sandbox, each against local upstreams that record what reached
// them: each must be refused, with the refusal explained.
func TestEgressAttacks(t *testing.T) {
	t.Run("LoopbackOnlyForMappedNames", testLoopbackScope)
}

// recorder is an upstream on loopback that records every request it gets.
type recorder struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []recorded
}

type recorded struct{ host, auth string }

func newRecorder(t *testing.T) *recorder {
	r := &recorder{}
	h := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.got = append(r.got, recorded{host: req.Host, auth: req.Header.Get("Authorization")})
		r.mu.Unlock()
		fmt.Fprintf(w, "upstream %s saw %s\n", r.srv.Listener.Addr(), req.Host)
	})
	r.srv = httptest.NewServer(h)
	t.Cleanup(r.srv.Close)
	return r
}

func (r *recorder) port() int { return r.srv.Listener.Addr().(*net.TCPAddr).Port }

func (r *recorder) requests() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recorded(nil), r.got...)
}

// dnsQueryPy resolves names through the sandbox's resolver (cella's DNS)
// without /etc/hosts, so that even "localhost" gets cella's answer.
const dnsQueryPy = `
import random, socket, struct
NS = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
def query(name, qtype=1, sock=None):
    q = struct.pack(">HHHHHH", random.randint(0, 65535), 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", qtype, 1)
    s = sock or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.sendto(q, (NS, 53))
    return s.recv(4096)
def resolve(name):
    r = query(name)
    if r[3] & 15 or not struct.unpack(">H", r[6:8])[0]:
        return None
    return socket.inet_ntoa(r[-4:])
`

// testLoopbackScope: two --egress-resolve mappings to loopback, each with
// its own port. Each mapped name reaches its own upstream; neither reaches
// the other's port, and "localhost" (allowed by "*" and resolved to
// 127.0.0.1 by the host's /etc/hosts, not by a mapping) reaches neither.
// Before mappings were scoped, one loopback mapping opened loopback to
// every allowed name.
func testLoopbackScope(t *testing.T) {
	upA, upB := newRecorder(t), newRecorder(t)
	pa, pb := strconv.Itoa(upA.port()), strconv.Itoa(upB.port())
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{Network: daemon.NetworkConfig{
		Allow:   []string{"*"},
		Resolve: []string{"a.test=127.0.0.1:" + pa, "b.test=127.0.0.1:" + pb, "any.test=127.0.0.1"},
	}})
	a := apiT{env: env}
	id, sb := mustCreate(t, env, map[string]any{"templateID": "base"})

	res := sh(t, sb, "", fmt.Sprintf("curl -sS -m 10 http://a.test:%s/ http://b.test:%s/", pa, pb))
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "saw a.test:"+pa) || !strings.Contains(res.Stdout, "saw b.test:"+pb) {
		t.Fatalf("mapped names on their own ports: exit %d stdout %q stderr %q events %q", res.ExitCode, res.Stdout, res.Stderr, res.SandboxEvents)
	}
	hitsA, hitsB := len(upA.requests()), len(upB.requests())

	// A mapped name on the other mapping's port.
	since := time.Now()
	res = sh(t, sb, "", fmt.Sprintf("curl -sS -m 10 http://a.test:%s/", pb))
	if !strings.HasPrefix(res.Stdout, "blocked by cella sandbox policy: ") || !strings.Contains(res.Stdout, "which a.test may reach only on port "+pa) {
		t.Errorf("a.test on b.test's port: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	a.wantBlocked(t, id, since, res, blockedWant{kind: "connect", proto: "http", host: "a.test", rule: "hard-deny", reason: "may reach only on port " + pa})

	// localhost, through cella's DNS (a fake address for the name), on
	// both mapped ports; and a name mapped without a port on the daemon's
	// own API port.
	_, dport, _ := net.SplitHostPort(strings.TrimPrefix(env.URL, "http://"))
	since = time.Now()
	res = sh(t, sb, "", fmt.Sprintf(`python3 - <<'EOF'
%s
import http.client
fake = resolve("localhost")
print("localhost is", fake)
for port in (%s, %s):
    c = http.client.HTTPConnection(fake, port, timeout=10)
    c.request("GET", "/", headers={"Host": "localhost"})
    r = c.getresponse()
    print(port, r.status, r.read().decode().strip())
EOF
curl -sS -m 10 http://any.test:%s/health`, dnsQueryPy, pa, pb, dport))
	if res.ExitCode != 0 || strings.Count(res.Stdout, " 403 blocked by cella sandbox policy: localhost resolves only to addresses cella never connects to") != 2 ||
		!strings.Contains(res.Stdout, "cella dials only for names an operator maps there") || !strings.Contains(res.Stdout, "the cella daemon's own API") {
		t.Errorf("localhost through cella's DNS, any.test on the API port: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	a.wantBlocked(t, id, since, res, blockedWant{kind: "connect", proto: "http", host: "localhost", rule: "hard-deny", reason: "loopback"})
	a.wantBlocked(t, id, since, res, blockedWant{kind: "connect", proto: "http", host: "any.test", rule: "hard-deny", reason: "the cella daemon's own API"})
	if got := upA.requests()[hitsA:]; len(got) != 0 {
		t.Errorf("upstream A got requests it must not: %+v", got)
	}
	if got := upB.requests()[hitsB:]; len(got) != 0 {
		t.Errorf("upstream B got requests it must not: %+v", got)
	}
}
