package api_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/audit"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/rootfs"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// TestEgressAttacks are attacks on the egress proxy from inside a real
// gVisor sandbox, each against local upstreams that record what reached
// them: each must be refused, with the refusal explained.
func TestEgressAttacks(t *testing.T) {
	t.Run("LoopbackOnlyForMappedNames", testLoopbackScope)
	t.Run("SecretsOnlyWhereTheRuleIsBound", testRuleBinding)
	t.Run("NoDomainFronting", testNoFronting)
	t.Run("ConnectionFlood", testConnectionFlood)
	t.Run("AuditAndLogFlood", testAuditFlood)
}

// recorder is an upstream on loopback that records every request it gets.
type recorder struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []recorded
}

type recorded struct{ host, auth string }

func newRecorder(t *testing.T) *recorder { return startRecorder(t, nil) }

// newTLSRecorder is a recorder over TLS (h2 and http/1.1) with a
// certificate from ca for any name.
func newTLSRecorder(t *testing.T, ca *testCA) *recorder { return startRecorder(t, ca) }

func startRecorder(t *testing.T, ca *testCA) *recorder {
	r := &recorder{}
	h := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.got = append(r.got, recorded{host: req.Host, auth: req.Header.Get("Authorization")})
		r.mu.Unlock()
		fmt.Fprintf(w, "upstream %s saw %s\n", r.srv.Listener.Addr(), req.Host)
	})
	r.srv = httptest.NewUnstartedServer(h)
	if ca == nil {
		r.srv.Start()
	} else {
		r.srv.EnableHTTP2 = true
		r.srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.leaf(t, "api.test", "allowed.test", "evil.test")}}
		r.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		r.srv.StartTLS()
	}
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

// testRuleBinding: a header rule's secret goes only to the scheme and port
// the rule is bound to. Sandbox X's rule for api.test says https on the
// TLS upstream's port (cella's "port" field); sandbox Y's rule is E2B's
// shape, bound by default to https on 443. Neither's secret reaches the
// plain HTTP upstream on another port of api.test, nor a second TLS
// upstream on a third port, nor (Y) the TLS upstream on its port: each
// request is refused with the rule named. Before rules were bound, both
// injected the secret into every request to api.test, plain HTTP included.
func testRuleBinding(t *testing.T) {
	ca := newTestCA(t)
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(caFile, ca.certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	bound, other, plain := newTLSRecorder(t, ca), newTLSRecorder(t, ca), newRecorder(t)
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{Network: daemon.NetworkConfig{
		Allow: []string{"api.test"}, Resolve: []string{"api.test=127.0.0.1"}, UpstreamCAFile: caFile,
	}})
	a := apiT{env: env}
	secretValue := randHex(t, 16)
	if st, _, body := a.do(t, "POST", "/secrets", env.APIKey, map[string]any{"name": "TOKEN", "value": secretValue}, nil); st != 201 {
		t.Fatalf("POST /secrets: %d %s", st, body)
	}
	transform := map[string]any{"headers": map[string]string{"Authorization": "Bearer ${e2b.secrets.TOKEN}"}}
	ids, sbs := createMany(t, env, []map[string]any{
		{"templateID": "base", "network": map[string]any{"rules": map[string]any{"api.test": []any{map[string]any{"transform": transform, "port": bound.port()}}}}},
		{"templateID": "base", "network": map[string]any{"rules": map[string]any{"api.test": []any{map[string]any{"transform": transform}}}}},
	})
	// The detail shows each rule's binding, not its value.
	st, _, body := a.do(t, "GET", "/sandboxes/"+ids[0], env.APIKey, nil, nil)
	if st != 200 || !strings.Contains(string(body), fmt.Sprintf(`"port":%d`, bound.port())) || strings.Contains(string(body), secretValue) {
		t.Fatalf("detail of X: %d %s", st, body)
	}
	attacks := fmt.Sprintf("for u in http://api.test:%d/ https://api.test:%d/ http://api.test:%d/; do curl -sS -m 10 $u; echo; done",
		plain.port(), other.port(), bound.port())
	var results []client.ExecResult
	var sinces []time.Time
	for i := range sbs {
		sinces = append(sinces, time.Now())
		results = append(results, sh(t, sbs[i], "", attacks))
	}
	res := sh(t, sbs[1], "", fmt.Sprintf("curl -sS -m 10 https://api.test:%d/", bound.port()))
	for _, r := range []*recorder{bound, other, plain} {
		for _, got := range r.requests() {
			if strings.Contains(got.auth, secretValue) {
				t.Fatalf("upstream %s got the secret: %+v", r.srv.URL, got)
			}
		}
	}
	for i, name := range []string{"X", "Y"} {
		if r := results[i]; r.ExitCode != 0 || strings.Count(r.Stdout, "blocked by cella sandbox policy: the header rules for api.test (rules key \"api.test\") apply to") != 3 {
			t.Errorf("%s: requests outside the rule's binding: exit %d stdout %q stderr %q", name, r.ExitCode, r.Stdout, r.Stderr)
		}
		a.wantBlocked(t, ids[i], sinces[i], results[i], blockedWant{kind: "connect", proto: "http", host: "api.test", rule: "rule-binding"})
	}
	if !strings.Contains(res.Stdout, "apply to https on port 443 only, and this request is https on port "+strconv.Itoa(bound.port())) {
		t.Errorf("Y (E2B's shape) on the TLS upstream's port: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if got := append(other.requests(), plain.requests()...); len(got) != 0 {
		t.Errorf("upstreams outside every binding got requests: %+v", got)
	}
	// Where X's rule is bound, the secret is sent.
	res = sh(t, sbs[0], "", fmt.Sprintf("curl -sS -m 10 https://api.test:%d/", bound.port()))
	if got := bound.requests(); res.ExitCode != 0 || len(got) != 1 || got[0].auth != "Bearer "+secretValue {
		t.Fatalf("X where its rule is bound: exit %d stdout %q stderr %q; upstream saw %+v", res.ExitCode, res.Stdout, res.Stderr, got)
	}
}

// testNoFronting: TLS whose server name is allowed and whose requests name
// another host (domain fronting: a shared server, a CDN, routes by the
// inner name). The sandbox trusts both cella's CA and the upstream's, so
// that it would complete the handshake whether cella splices or
// terminates. Every form is refused, and the upstream sees no request for
// the other host. Before cella looked inside TLS, all of them reached it.
func testNoFronting(t *testing.T) {
	ca := newTestCA(t)
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(caFile, ca.certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	up := newTLSRecorder(t, ca)
	port := strconv.Itoa(up.port())
	env := daemontest.Start(t, runtime.GVisor, daemontest.Options{Network: daemon.NetworkConfig{
		Allow: []string{"allowed.test"}, Resolve: []string{"*.test=127.0.0.1"}, UpstreamCAFile: caFile,
	}})
	a := apiT{env: env}
	id, sb := mustCreate(t, env, map[string]any{"templateID": "base"})
	if err := sb.WriteFile(context.Background(), "/tmp/testca.pem", "", bytes.NewReader(ca.certPEM)); err != nil {
		t.Fatal(err)
	}
	url := "https://allowed.test:" + port + "/"
	since := time.Now()
	res := sh(t, sb, "", fmt.Sprintf(`cat /etc/ssl/certs/ca-certificates.crt /tmp/testca.pem > /tmp/both.pem
curl -sS -m 10 --cacert /tmp/both.pem --http1.1 -H 'Host: evil.test' %[1]s; echo " rc=$?"
curl -sS -m 10 --cacert /tmp/both.pem --http2 -H 'Host: evil.test' %[1]s; echo " rc=$?"
python3 - <<'EOF'
import socket, ssl, time
ctx = ssl.create_default_context(cafile="/tmp/both.pem")
for first, rest in ((b"FOO / HTTP/1.1\r\n", b""), (b"G", b"ET / HTTP/1.1\r\n")):
    s = ctx.wrap_socket(socket.create_connection(("allowed.test", %[2]s), 10), server_hostname="allowed.test")
    s.sendall(first)
    if rest:
        time.sleep(5.5)
        s.sendall(rest)
    s.sendall(b"Host: evil.test\r\nConnection: close\r\n\r\n")
    print(s.recv(1000).decode().splitlines()[0])
EOF`, url, port))
	if strings.Count(res.Stdout, "domain fronting") != 2 || strings.Count(res.Stdout, "HTTP/1.1 403 Forbidden") != 2 || strings.Contains(res.Stdout, "saw evil.test") {
		t.Errorf("fronting: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	a.wantBlocked(t, id, since, res, blockedWant{kind: "connect", proto: "tls", host: "evil.test", rule: "host-mismatch", reason: "domain fronting"})
	for _, got := range up.requests() {
		if got.host != "allowed.test:"+port {
			t.Fatalf("the upstream got a request for %q", got.host)
		}
	}
	// The allowed name itself, HTTP/1.1 and h2, with the system bundle.
	res = sh(t, sb, "", fmt.Sprintf("curl -sS -m 10 --http1.1 %[1]s && curl -sS -m 10 --http2 -w '%%{http_version}\\n' %[1]s", url))
	if res.ExitCode != 0 || strings.Count(res.Stdout, "saw allowed.test:"+port) != 2 || !strings.HasSuffix(res.Stdout, "\n2\n") {
		t.Errorf("allowed.test itself: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
}

// holdScriptPy opens N connections to NAME:PORT through the proxy, sends a
// request on each (the upstream never answers, so the proxy holds both
// ends), then keeps counting how many the proxy closed into /tmp/closed.
const holdScriptPy = `
import json, resource, select, socket, sys, time
name, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
addr = socket.gethostbyname(name)
socks = []
for i in range(n):
    try:
        s = socket.create_connection((addr, port), 10)
        s.sendall(b"GET / HTTP/1.1\r\nHost: " + name.encode() + b"\r\n\r\n")
        socks.append(s)
    except OSError as e:
        print("connect", i, e, flush=True)
open("/tmp/opened", "w").write(str(len(socks)))
p = select.poll()
for s in socks:
    p.register(s, select.POLLIN | select.POLLHUP | select.POLLERR)
closed = set()
while True:
    for fd, ev in p.poll(1000):
        closed.add(fd)
        p.unregister(fd)
    open("/tmp/closed.tmp", "w").write(str(len(closed)))
    import os; os.rename("/tmp/closed.tmp", "/tmp/closed")
`

// testConnectionFlood: a sandbox opens 3000 connections through the egress
// proxy and holds them, in a daemon whose open-file limit is 4096 (as if
// 15,000 against 20,000). The proxy holds the sandbox's limit (1024, the
// default) and refuses the rest with a block event that names the limit;
// meanwhile another tenant creates a sandbox and uses egress, and the API
// answers. Before the cap, the flood took every descriptor the daemon had:
// the other tenant's create failed and its egress with it.
func testConnectionFlood(t *testing.T) {
	const n, limit = 3000, 1024
	// An upstream that never accepts: the kernel completes the proxy's
	// connections into its backlog, so the flood costs this process (the
	// daemon's) no descriptor on the upstream side.
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	holePort := hole.Addr().(*net.TCPAddr).Port
	ok := newRecorder(t)
	env := startServeProc(t, 4096, "--egress-allow", "hold.test,ok.test",
		"--egress-resolve", fmt.Sprintf("hold.test=127.0.0.1:%d", holePort), "--egress-resolve", fmt.Sprintf("ok.test=127.0.0.1:%d", ok.port())).env
	a := apiT{env: env}
	idA, sbA := mustCreate(t, env, map[string]any{"templateID": "base"})
	if err := sbA.WriteFile(context.Background(), "/tmp/hold.py", "", strings.NewReader(holdScriptPy)); err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	startBG(t, sbA, fmt.Sprintf("python3 /tmp/hold.py hold.test %d %d > /tmp/hold.log 2>&1", holePort, n))
	// Every connection is either held or refused: wait until the script
	// has opened them all and sees the refused ones closed.
	deadline := time.Now().Add(3 * time.Minute)
	var state string
	for {
		res := sh(t, sbA, "", "cat /tmp/opened 2>/dev/null; echo; cat /tmp/closed 2>/dev/null; echo; tail -3 /tmp/hold.log")
		state = res.Stdout
		if strings.HasPrefix(state, fmt.Sprintf("%d\n%d\n", n, n-limit)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flood did not settle at %d held, %d refused: opened, closed, log = %q", limit, n-limit, state)
		}
		time.Sleep(500 * time.Millisecond)
	}
	a.wantBlockedEntry(t, idA, since, blockedWant{kind: "connect", rule: "connection-limit", reason: "1024 connections open through cella's egress proxy"})

	// Another tenant, meanwhile: its own key, a create, egress.
	k, err := env.Client.CreateKey(context.Background(), client.NewKey{Name: "tenant-b"})
	if err != nil {
		t.Fatal(err)
	}
	st, _, body := a.do(t, "POST", "/v2/sandboxes", k.Key, map[string]any{"templateID": "base"}, nil)
	var created struct {
		SandboxID string `json:"sandboxID"`
	}
	if st != 201 || json.Unmarshal(body, &created) != nil {
		t.Fatalf("the other tenant's create during the flood: %d %s (flood state %q)", st, body, state)
	}
	t.Cleanup(func() { env.Client.Kill(context.Background(), created.SandboxID) })
	cb, err := client.New(client.Config{URL: env.URL, APIKey: k.Key})
	if err != nil {
		t.Fatal(err)
	}
	sbB, err := cb.Sandbox(context.Background(), created.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	res := sh(t, sbB, "", fmt.Sprintf("curl -sS -m 10 http://ok.test:%d/", ok.port()))
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "saw ok.test") {
		t.Fatalf("the other tenant's egress during the flood: exit %d stdout %q stderr %q events %q", res.ExitCode, res.Stdout, res.Stderr, res.SandboxEvents)
	}
	if st, _, body := a.do(t, "GET", "/sandboxes/"+idA+"/logs?decision=blocked&limit=1", env.APIKey, nil, nil); st != 200 {
		t.Fatalf("the API during the flood: %d %s", st, body)
	}
}

// testAuditFlood: a sandbox makes one blocked HTTP request, then 20,000
// blocked DNS queries for long random names as fast as it can (enough, one
// entry each, to fill the audit log's 16 MiB cap). The early block is still
// in the audit log, what was not recorded one by one is counted, and the
// daemon's log grew by a few lines, not a line per query. Before the
// bounds, the flood added megabytes to the daemon's log and the audit log's
// cut dropped its oldest half, the early block with it.
func testAuditFlood(t *testing.T) {
	const n = 20000
	p := startServeProc(t, 0, "--egress-allow", "ok.test")
	env := p.env
	a := apiT{env: env}
	id, sb := mustCreate(t, env, map[string]any{"templateID": "base"})
	since := time.Now()
	res := sh(t, sb, "", "curl -sS -m 10 -H 'Host: evidence.test' http://10.1.2.3/")
	if !strings.HasPrefix(res.Stdout, "blocked by cella sandbox policy: evidence.test is not allowed") {
		t.Fatalf("the early request: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	a.wantBlocked(t, id, since, res, blockedWant{kind: "connect", proto: "http", host: "evidence.test"})
	if err := sb.WriteFile(context.Background(), "/tmp/flood.py", "", strings.NewReader(dnsQueryPy+fmt.Sprintf(`
import random, string, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
nx = 0
for i in range(%d):
    name = ".".join("".join(random.choice(string.ascii_lowercase) for _ in range(60)) for _ in range(4)) + ".evil.test"
    r = query(name[-253:].lstrip("."), sock=s)
    nx += (r[3] & 15) == 3
print("nxdomain", nx)
`, n))); err != nil {
		t.Fatal(err)
	}
	before, beforeLines := p.log.size(), p.log.lineCount()
	t0 := time.Now()
	res = sh(t, sb, "", "python3 /tmp/flood.py")
	took := time.Since(t0)
	if res.ExitCode != 0 || res.Stdout != fmt.Sprintf("nxdomain %d\n", n) {
		t.Fatalf("the flood: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	// The daemon sums up the rest when its window ends.
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(p.log.tail(), "not_logged=") {
		if time.Now().After(deadline) {
			t.Fatalf("no summary line in the daemon's log")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Per sandbox the daemon logs at most 10 refusals and one summary
	// per 10 s window: so many windows as the flood took, one more for
	// the summary, and lines of at most 2 KiB.
	lines, grew := p.log.lineCount()-beforeLines, p.log.size()-before
	most := (int(took/(10*time.Second)) + 2) * 11
	if lines > most || grew > int64(most)*2048 {
		t.Errorf("the daemon's log grew by %d lines (%d bytes) for %d refused queries in %v, want at most %d lines", lines, grew, n, took.Round(time.Millisecond), most)
	}
	// The early block, through the API.
	st, _, body := a.do(t, "GET", "/sandboxes/"+id+"/logs?kind=connect&decision=blocked", env.APIKey, nil, nil)
	var out struct {
		Entries []audit.Entry `json:"entries"`
		Dropped audit.Dropped `json:"dropped"`
	}
	if st != 200 || json.Unmarshal(body, &out) != nil {
		t.Fatalf("logs: %d %.300s", st, body)
	}
	early := 0
	for _, e := range out.Entries {
		if e.Host == "evidence.test" {
			early++
		}
	}
	if early != 1 {
		t.Fatalf("the early block is gone from the audit log (dropped %+v): %.500s", out.Dropped, body)
	}
	// Every lookup is accounted for: recorded one by one, or counted (the
	// file itself, however many were recorded).
	data, err := os.ReadFile(filepath.Join(env.DataDir, "audit", id+".jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var dns, notRecorded int64
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var e audit.Entry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		switch {
		case e.Rule == audit.RuleNotRecorded:
			notRecorded += e.Dropped.Blocked
		case e.Kind == "dns" && e.Decision == "blocked":
			dns++
		}
	}
	if dns+notRecorded != n || out.Dropped.Blocked != notRecorded {
		t.Errorf("%d lookups recorded and %d counted as not recorded (the answer says %+v): want all %d accounted for", dns, notRecorded, out.Dropped, n)
	}
	t.Logf("%d lookups in %v: %d recorded one by one, %d summed up; the audit file is %d bytes; the daemon's log grew by %d lines, %d bytes",
		n, took.Round(time.Millisecond), dns, notRecorded, len(data), lines, grew)
}

// serveProc is a `cella serve` process of its own, for attacks on what
// belongs to the process: its open-file limit, its log.
type serveProc struct {
	env *daemontest.Env
	log *countingLog
}

// startServeProc runs bin/cella serve with an open-file limit of nofile
// (0: this process's) and args, until the test ends; then it stops it
// (SIGTERM) and checks it left no mount behind.
func startServeProc(t *testing.T, nofile int, args ...string) *serveProc {
	t.Helper()
	bin, _ := daemontest.Binaries(t)
	daemontest.EnsureBase(t)
	dataDir, err := os.MkdirTemp("", "cella-test-")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	ln.Close()
	argv := append([]string{bin, "serve", "--listen", listen, "--data-dir", dataDir, "--cache-dir", daemontest.CacheDir()}, args...)
	if nofile > 0 {
		argv = append([]string{"sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$@"`, nofile), "sh"}, argv...)
	}
	p := &serveProc{log: &countingLog{}}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(90 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Error("cella serve did not stop within 90 s of SIGTERM")
		}
		if left, _ := rootfs.FindMounts(dataDir); len(left) > 0 {
			t.Errorf("the daemon left mounts behind: %v", left)
		}
		if t.Failed() {
			t.Logf("daemon log (last %d of %d bytes):\n%s", len(p.log.tail()), p.log.size(), p.log.tail())
		}
		os.RemoveAll(dataDir)
	})
	url := "http://" + listen
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if resp, err := http.Get(url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 204 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("cella serve did not come up; log:\n%s", p.log.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	key, err := os.ReadFile(filepath.Join(dataDir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	p.env = &daemontest.Env{URL: url, APIKey: strings.TrimSpace(string(key)), DataDir: dataDir, Domain: "localhost"}
	if p.env.Client, err = client.New(client.Config{URL: url, APIKey: p.env.APIKey}); err != nil {
		t.Fatal(err)
	}
	return p
}

// countingLog counts what the daemon writes and keeps the end of it.
type countingLog struct {
	mu    sync.Mutex
	n     int64
	lines int
	last  []byte
}

const keepLog = 256 << 10

func (l *countingLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n += int64(len(b))
	l.lines += bytes.Count(b, []byte{'\n'})
	l.last = append(l.last, b...)
	if len(l.last) > 2*keepLog {
		l.last = append([]byte(nil), l.last[len(l.last)-keepLog:]...)
	}
	return len(b), nil
}

func (l *countingLog) size() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

func (l *countingLog) lineCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lines
}

func (l *countingLog) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.last[max(0, len(l.last)-keepLog):])
}
