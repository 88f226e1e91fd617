// Package clustertest starts a real Kubernetes control plane for tests: etcd
// and kube-apiserver, the binaries `make cluster-deps` builds from the pinned
// wrapper modules in tools/k8s (scripts/cluster-deps.sh), on loopback with
// free ports, serving TLS with a fresh CA and authenticating a static token.
// Nothing of Kubernetes is faked.
//
// The tests that use it run only under CELLA_TEST_CLUSTER=1 (make
// test-cluster); elsewhere they skip, so `make test` needs no engines.
//
// Teardown leaves nothing: both processes get SIGKILL when the test process
// dies (Pdeathsig, so a panicking or timed-out test does not leak them), and
// a later Start removes the state directories of control planes whose test
// process is gone.
package clustertest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/clusterdeps"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// EnvGate is the variable that enables the tests that need the engines.
const EnvGate = clusterdeps.EnvGate

// Binaries are the engines' paths.
type Binaries = clusterdeps.Binaries

// Require skips the test unless CELLA_TEST_CLUSTER=1 and returns the
// engines' paths; it fails the test when they are enabled but not built.
func Require(t testing.TB) Binaries {
	t.Helper()
	if !clusterdeps.Enabled() {
		t.Skipf("needs the real control plane: run make test-cluster (sets %s=1)", EnvGate)
	}
	b, err := clusterdeps.Lookup()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ControlPlane is one running etcd + kube-apiserver.
type ControlPlane struct {
	// URL is the API server's https://127.0.0.1:PORT.
	URL string
	// CA is the PEM of the CA that signed the serving certificate.
	CA []byte
	// Token is the bearer token of the admin user (system:masters).
	Token string
	// Dir holds the PKI, the logs and etcd's data.
	Dir string
	// Ready is how long the API server took from its exec to /readyz OK;
	// EtcdReady how long etcd took to answer /health.
	Ready, EtcdReady time.Duration

	etcd, apiserver *proc

	mu sync.Mutex
	// nodes is the last node process started on each data dir.
	nodes map[string]*Proc
}

// proc is a started engine and the end of its Wait.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait reports whether the process exited within d.
func (p *proc) wait(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// ownerFile names the PID of the test process owning a control plane's Dir.
const ownerFile = "owner.pid"

// dirPrefix starts the name of every control plane's Dir under $TMPDIR.
const dirPrefix = "cella-k8s-"

// Start runs a fresh control plane until the test ends.
func Start(t testing.TB) *ControlPlane {
	t.Helper()
	c, err := New(Require(t))
	if err != nil {
		t.Fatalf("start the control plane: %v", err)
	}
	t.Logf("control plane up: etcd %v, kube-apiserver %v (%s); CPU so far: %s", c.EtcdReady.Round(time.Millisecond), c.Ready.Round(time.Millisecond), c.URL, c.CPUTime())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log tail:\n%s", c.LogTail("kube-apiserver.log", 30))
		}
		t.Logf("control plane CPU time: %s", c.CPUTime())
		c.Stop()
	})
	return c
}

// New runs a fresh control plane until Stop (for a TestMain shared by a
// package's tests).
func New(bins Binaries) (*ControlPlane, error) {
	removeStale()
	var lastErr error
	// Free ports are picked by binding :0 and closing; another process can
	// take one in between, so a bind failure is retried with new ports.
	for attempt := 0; attempt < 3; attempt++ {
		c, err := start(bins)
		if err == nil {
			return c, nil
		}
		lastErr = err
		if !errors.Is(err, errAddrInUse) {
			break
		}
	}
	return nil, lastErr
}

var errAddrInUse = errors.New("address already in use")

// Stop ends the control plane and removes its Dir.
func (c *ControlPlane) Stop() {
	c.stop()
	os.RemoveAll(c.Dir)
}

func start(bins Binaries) (c *ControlPlane, err error) {
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, err
	}
	c = &ControlPlane{Dir: dir}
	// Each failure below returns nil for c: the deferred stop holds its
	// own reference to what was started.
	started := c
	defer func() {
		if err != nil {
			started.Stop()
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return nil, err
	}
	if err := c.writePKI(); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.URL = "https://127.0.0.1:" + strconv.Itoa(ports[2])

	t0 := time.Now()
	c.etcd, err = c.run(bins.Etcd, "etcd.log",
		"--name=test", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=test="+peerURL,
		// A test's etcd dies with its test: durability buys nothing and
		// fsyncs on a shared disk cost seconds.
		"--unsafe-no-fsync")
	if err != nil {
		return nil, err
	}
	if err := c.waitHTTP(http.DefaultClient, etcdURL+"/health", c.etcd, "etcd.log"); err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	c.EtcdReady = time.Since(t0)

	pki := func(n string) string { return filepath.Join(dir, "pki", n) }
	t1 := time.Now()
	c.apiserver, err = c.run(bins.KubeAPIServer, "kube-apiserver.log",
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports[2]),
		"--tls-cert-file="+pki("apiserver.crt"), "--tls-private-key-file="+pki("apiserver.key"),
		"--client-ca-file="+pki("ca.crt"), "--token-auth-file="+pki("tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+pki("sa.pub"), "--service-account-signing-key-file="+pki("sa.key"),
		// privileged pods allowed, as kubeadm and managed clusters do: the
		// node DaemonSet needs them (TestManifests).
		"--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
		// Without it the apiserver refuses a loopback advertise address.
		"--endpoint-reconciler-type=none",
		"--cert-dir="+filepath.Join(dir, "apiserver-certs"))
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: c.pool()}}
	defer tr.CloseIdleConnections()
	if err := c.waitHTTP(&http.Client{Transport: &bearer{c.Token, tr}, Timeout: 10 * time.Second}, c.URL+"/readyz", c.apiserver, "kube-apiserver.log"); err != nil {
		return nil, fmt.Errorf("kube-apiserver: %w", err)
	}
	c.Ready = time.Since(t1)
	return c, nil
}

// run starts bin with its output in Dir/log, killed if the test process dies.
func (c *ControlPlane) run(bin, log string, args ...string) (*proc, error) {
	f, err := os.Create(filepath.Join(c.Dir, log))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// waitHTTP polls url until it answers 200, the process exits or 2 minutes
// pass (generous: the CPU is shared).
func (c *ControlPlane) waitHTTP(hc *http.Client, url string, p *proc, log string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p.exited() {
			tail := c.LogTail(log, 20)
			if strings.Contains(tail, "address already in use") {
				return fmt.Errorf("%w:\n%s", errAddrInUse, tail)
			}
			return fmt.Errorf("exited before it was ready:\n%s", tail)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after 2m (last: %v):\n%s", err, c.LogTail(log, 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the API server, then etcd, each waited for (so its ports and
// files are free when stop returns).
func (c *ControlPlane) stop() {
	for _, p := range []*proc{c.apiserver, c.etcd} {
		if p == nil {
			continue
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if !p.wait(30 * time.Second) {
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			p.wait(time.Minute)
		}
	}
}

// CPUTime says how much CPU (user + system) etcd and the API server have
// used so far: what a test's control plane costs the shared machine.
func (c *ControlPlane) CPUTime() string {
	var parts []string
	for _, p := range []struct {
		name string
		p    *proc
	}{{"etcd", c.etcd}, {"kube-apiserver", c.apiserver}} {
		if p.p == nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.p.cmd.Process.Pid))
		if err != nil {
			continue
		}
		// Fields after the command name (which may hold spaces): utime and
		// stime are the 14th and 15th fields, in clock ticks (100 Hz).
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		parts = append(parts, fmt.Sprintf("%s %v", p.name, time.Duration(ut+st)*10*time.Millisecond))
	}
	return strings.Join(parts, ", ")
}

// LogTail is the last n lines of one of the control plane's logs.
func (c *ControlPlane) LogTail(log string, n int) string {
	return tail(filepath.Join(c.Dir, log), n)
}

// RESTConfig is a client configuration for the admin user.
func (c *ControlPlane) RESTConfig() *rest.Config {
	return &rest.Config{
		Host:            c.URL,
		BearerToken:     c.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CA},
		// Tests create and poll fast; the default 5 QPS would throttle them.
		QPS: 200, Burst: 400,
	}
}

// Kubeconfig writes a kubeconfig file for the admin user (what `cella serve
// --cluster FILE` and kubectl read) and returns its path.
func (c *ControlPlane) Kubeconfig(t testing.TB) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: c.URL, CertificateAuthorityData: c.CA}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: c.Token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "admin"}
	cfg.CurrentContext = "test"
	path := filepath.Join(c.Dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func (c *ControlPlane) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(c.CA)
	return p
}

// writePKI makes the CA, the API server's serving certificate (for
// 127.0.0.1 and localhost), the service-account key pair and the token file.
func (c *ControlPlane) writePKI() error {
	dir := filepath.Join(c.Dir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cella-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	c.CA = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})

	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tok := make([]byte, 24)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	c.Token = hex.EncodeToString(tok)
	files := map[string][]byte{
		"ca.crt":        c.CA,
		"apiserver.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		"apiserver.key": pemKey(srvKey),
		"sa.key":        pemKey(saKey),
		"sa.pub":        pemPub(&saKey.PublicKey),
		"tokens.csv":    []byte(c.Token + ",admin,admin-uid,system:masters\n"),
	}
	for name, b := range files {
		if b == nil {
			return fmt.Errorf("encode %s", name)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func pemKey(k *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

func pemPub(k *ecdsa.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		return nil
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// freePorts returns n loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// removeStale removes the Dirs of control planes whose test process is gone
// (a test killed before its cleanup ran; its processes died with it).
func removeStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue // being made, or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid == os.Getpid() || alive(pid) {
			continue
		}
		os.RemoveAll(d)
	}
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// bearer adds the admin token to requests.
type bearer struct {
	token string
	rt    http.RoundTripper
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}

// Kubectl runs the built kubectl against the control plane.
func (c *ControlPlane) Kubectl(ctx context.Context, t testing.TB, stdin []byte, args ...string) (string, error) {
	t.Helper()
	bins := Require(t)
	if bins.Kubectl == "" {
		t.Fatal("kubectl is not built: run make cluster-deps")
	}
	cmd := exec.CommandContext(ctx, bins.Kubectl, append([]string{"--kubeconfig=" + c.Kubeconfig(t)}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
