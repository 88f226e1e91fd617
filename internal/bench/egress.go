package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
)

// egressClient is the same small HTTP client on both sides of the
// comparison: n GETs, each on a new connection (what a sandbox's pip or
// curl does per host), timed one by one. With a CA file it speaks HTTPS,
// trusting the system's roots (a sandbox's include cella's CA) and that
// file.
const egressClient = `
import http.client, json, ssl, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ctx = None
if len(sys.argv) > 4:
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(sys.argv[4])
out = []
for _ in range(n):
    t = time.perf_counter_ns()
    if ctx:
        c = http.client.HTTPSConnection(host, port, timeout=10, context=ctx)
    else:
        c = http.client.HTTPConnection(host, port, timeout=10)
    c.request("GET", "/")
    r = c.getresponse()
    r.read()
    c.close()
    if r.status != 200:
        sys.exit("status %d" % r.status)
    out.append(time.perf_counter_ns() - t)
print(json.dumps(out))
`

// egressUpstream is the floor's upstream inside the sandbox: the least an
// HTTP server can do (read a request head, answer a fixed body, close), so
// that the floor is the sandbox's own cost of a connection — its network
// stack and the client — with no proxy, no DNS and no host hop. With a
// certificate and key it speaks TLS, as the proxied upstream does.
const egressUpstream = `
import socket, ssl, sys, threading
port = int(sys.argv[1])
ctx = None
if len(sys.argv) > 3:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[2], sys.argv[3])
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port))
ls.listen(128)
def serve(c):
    try:
        if ctx:
            c = ctx.wrap_socket(c, server_side=True)
        buf = b""
        while b"\r\n\r\n" not in buf:
            d = c.recv(4096)
            if not d:
                return
            buf += d
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
    except Exception:
        pass
    finally:
        c.close()
while True:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
`

// Egress measures what the egress proxy costs: n small HTTP requests, then
// n small HTTPS requests, from inside a sandbox to an allowed name (DNS
// through cella, every connection decided and proxied; HTTPS terminated
// and re-encrypted), beside the same client on the host talking to the
// same upstream directly, in the same run, and beside the sandbox's own
// floor: the same client in the same sandbox talking to an upstream on the
// sandbox's loopback (no proxy).
func Egress(ctx context.Context, cfg Config, n int) ([]Figure, error) {
	if n <= 0 {
		n = 1000
	}
	dir, err := os.MkdirTemp("", "cella-bench-egress-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "egress.py")
	if err := os.WriteFile(script, []byte(egressClient), 0o644); err != nil {
		return nil, err
	}
	caPEM, leaf, leafPEM, err := benchCert("bench.test")
	if err != nil {
		return nil, err
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		return nil, err
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	var figs []Figure
	for _, scheme := range []string{"http", "https"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		srv := &http.Server{Handler: handler}
		extra := []string{}
		if scheme == "https" {
			srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{leaf}}
			ln = tls.NewListener(ln, srv.TLSConfig)
			extra = []string{"/tmp/bench-ca.pem"}
		}
		go srv.Serve(ln)
		port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		hostArgs := []string{script, "127.0.0.1", port, strconv.Itoa(n)}
		if scheme == "https" {
			hostArgs = append(hostArgs, caFile)
		}
		out, err := exec.CommandContext(ctx, "python3", hostArgs...).Output()
		if err != nil {
			srv.Close()
			return nil, fmt.Errorf("host client (%s): %w", scheme, err)
		}
		base, err := parseNanos(out)
		if err != nil {
			srv.Close()
			return nil, err
		}
		upper := strings.ToUpper(scheme)
		b := summarize(fmt.Sprintf("%d %s GETs, host → upstream (no proxy)", n, upper), "", base)
		figs = append(figs, b)
		for _, rt := range runtimesOf(cfg) {
			f, floor, err := egressOne(ctx, cfg, rt, upper, port, n, caFile, caPEM, leafPEM, extra)
			if err != nil {
				f.Err = err.Error()
			}
			f.against(b)
			f.alsoAgainst(floor)
			figs = append(figs, floor, f)
		}
		srv.Close()
	}
	return figs, nil
}

// egressOne runs the client n times in one sandbox of runtime rt through
// the egress proxy to the host's upstream on port, then n times against
// an upstream on the sandbox's own loopback: the proxied figure and its
// floor, measured in the same sandbox.
func egressOne(ctx context.Context, cfg Config, rt, scheme, port string, n int, caFile string, caPEM []byte, leaf leafFiles, extra []string) (proxied, floor Figure, err error) {
	proxied = Figure{Name: fmt.Sprintf("%d %s GETs, sandbox → egress proxy → upstream", n, scheme), Runtime: rt}
	floor = Figure{Name: fmt.Sprintf("%d %s GETs, sandbox → upstream on its own loopback (no proxy)", n, scheme), Runtime: rt}
	l, err := startLocalNet(ctx, cfg, rt, daemon.NetworkConfig{
		Allow: []string{"bench.test"}, Resolve: []string{"bench.test=127.0.0.1"}, UpstreamCAFile: caFile,
	})
	if err != nil {
		return proxied, floor, err
	}
	defer l.Close()
	conn, err := l.sandbox(ctx, client.CreateRequest{})
	if err != nil {
		return proxied, floor, err
	}
	for path, body := range map[string]string{
		"/tmp/egress.py": egressClient, "/tmp/egress-upstream.py": egressUpstream, "/tmp/bench-ca.pem": string(caPEM),
		"/tmp/bench-leaf.pem": leaf.cert, "/tmp/bench-leaf.key": leaf.key,
	} {
		if err := conn.WriteFile(ctx, path, "", strings.NewReader(body)); err != nil {
			return proxied, floor, err
		}
	}
	run := func(f Figure, cmd string) (Figure, error) {
		res, err := conn.Exec(ctx, cmd, client.ExecOptions{Timeout: 10 * time.Minute})
		if err != nil {
			return f, err
		}
		if res.ExitCode != 0 {
			return f, fmt.Errorf("sandbox client exited %d: %s %v", res.ExitCode, res.Stderr, res.SandboxEvents)
		}
		ds, err := parseNanos([]byte(res.Stdout))
		if err != nil {
			return f, err
		}
		return summarize(f.Name, rt, ds), nil
	}
	proxiedCmd := strings.Join(append([]string{"python3 /tmp/egress.py bench.test", port, strconv.Itoa(n)}, extra...), " ")
	if proxied, err = run(proxied, proxiedCmd); err != nil {
		return proxied, floor, err
	}
	// The floor's upstream listens on the sandbox's loopback; the client
	// waits for it, then runs exactly as above but to 127.0.0.1 (the leaf
	// names that address too).
	const floorPort = "18089"
	tlsArgs := ""
	if len(extra) > 0 {
		tlsArgs = " /tmp/bench-leaf.pem /tmp/bench-leaf.key"
	}
	floorCmd := "python3 /tmp/egress-upstream.py " + floorPort + tlsArgs + " >/dev/null 2>&1 & up=$!; " +
		"for i in $(seq 200); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", " + floorPort + "), 1)' 2>/dev/null && break; sleep 0.05; done; " +
		strings.Join(append([]string{"python3 /tmp/egress.py 127.0.0.1", floorPort, strconv.Itoa(n)}, extra...), " ") + "; rc=$?; kill $up; exit $rc"
	if floor, err = run(floor, floorCmd); err != nil {
		return proxied, floor, fmt.Errorf("the no-proxy floor: %w", err)
	}
	return proxied, floor, nil
}

// leafFiles is a leaf certificate and its key, PEM-encoded, for a server
// in a sandbox.
type leafFiles struct{ cert, key string }

// benchCert makes a CA and a leaf for name and 127.0.0.1 signed by it (the
// leaf also PEM-encoded, for a server in a sandbox).
func benchCert(name string) ([]byte, tls.Certificate, leafFiles, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, leafFiles{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cella bench CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, leafFiles{}, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, leafFiles{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, leafFiles{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, tls.Certificate{}, leafFiles{}, err
	}
	files := leafFiles{
		cert: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		key:  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})),
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, files, nil
}

func parseNanos(b []byte) ([]time.Duration, error) {
	var ns []int64
	if err := json.Unmarshal(b, &ns); err != nil {
		return nil, fmt.Errorf("client output: %w", err)
	}
	out := make([]time.Duration, len(ns))
	for i, v := range ns {
		out[i] = time.Duration(v)
	}
	return out, nil
}
