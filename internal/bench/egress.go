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

// Egress measures what the egress proxy costs: n small HTTP requests, then
// n small HTTPS requests, from inside a sandbox to an allowed name (DNS
// through cella, every connection decided and proxied; HTTPS terminated
// and re-encrypted), beside the same client on the host talking to the
// same upstream directly, in the same run.
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
	caPEM, leaf, err := benchCert("bench.test")
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
			f, err := egressOne(ctx, cfg, rt, fmt.Sprintf("%d %s GETs, sandbox → egress proxy → upstream", n, upper), port, n, caFile, caPEM, extra)
			if err != nil {
				f.Err = err.Error()
			}
			f.against(b)
			figs = append(figs, f)
		}
		srv.Close()
	}
	return figs, nil
}

func egressOne(ctx context.Context, cfg Config, rt, name, port string, n int, caFile string, caPEM []byte, extra []string) (Figure, error) {
	l, err := startLocalNet(ctx, cfg, rt, daemon.NetworkConfig{
		Allow: []string{"bench.test"}, Resolve: []string{"bench.test=127.0.0.1"}, UpstreamCAFile: caFile,
	})
	if err != nil {
		return Figure{Name: name, Runtime: rt}, err
	}
	defer l.Close()
	conn, err := l.sandbox(ctx, client.CreateRequest{})
	if err != nil {
		return Figure{Name: name, Runtime: rt}, err
	}
	if err := conn.WriteFile(ctx, "/tmp/egress.py", "", strings.NewReader(egressClient)); err != nil {
		return Figure{Name: name, Runtime: rt}, err
	}
	if err := conn.WriteFile(ctx, "/tmp/bench-ca.pem", "", strings.NewReader(string(caPEM))); err != nil {
		return Figure{Name: name, Runtime: rt}, err
	}
	cmd := strings.Join(append([]string{"python3 /tmp/egress.py bench.test", port, strconv.Itoa(n)}, extra...), " ")
	res, err := conn.Exec(ctx, cmd, client.ExecOptions{Timeout: 10 * time.Minute})
	if err != nil {
		return Figure{Name: name, Runtime: rt}, err
	}
	if res.ExitCode != 0 {
		return Figure{Name: name, Runtime: rt}, fmt.Errorf("sandbox client exited %d: %s %v", res.ExitCode, res.Stderr, res.SandboxEvents)
	}
	ds, err := parseNanos([]byte(res.Stdout))
	if err != nil {
		return Figure{Name: name, Runtime: rt}, err
	}
	return summarize(name, rt, ds), nil
}

// benchCert makes a CA and a leaf for name and 127.0.0.1 signed by it.
func benchCert(name string) ([]byte, tls.Certificate, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cella bench CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
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
