package api_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// TestEgressAttacks are attacks on the egress proxy from inside a real
// gVisor sandbox, each against local upstreams that record what reached
// them: each must be refused, with the refusal explained.
func TestEgressAttacks(t *testing.T) {
	t.Run("LoopbackOnlyForMappedNames", testLoopbackScope)
	t.Run("SecretsOnlyWhereTheRuleIsBound", testRuleBinding)
	t.Run("NoDomainFronting", testNoFronting)
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
