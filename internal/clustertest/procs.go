package clustertest

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/rootfs"
)

// Proc is a `cella serve --cluster` node or a `cella gateway`, run as its
// own process from bin/cella (make build).
type Proc struct {
	Name string
	// URL is where it serves (http://127.0.0.1:PORT).
	URL string
	// DataDir is a node's data dir ("" for a gateway).
	DataDir string
	Log     string

	p      *proc
	killed bool
}

// NodeOptions say how a node joins.
type NodeOptions struct {
	Name, Namespace string
	// LeaseDuration is --lease-duration (default 3s: lapses are quick to
	// see in tests).
	LeaseDuration time.Duration
	// DataDir restarts a node on the data dir of an earlier one (after a
	// Kill: the new daemon adopts or removes what the dead one left).
	DataDir string
	// Args are more flags of cella serve (--archive ...), Env more
	// variables (the archive's AWS_* credentials).
	Args, Env []string
}

// StartNode runs `cella serve` on a data dir of its own, joined to the
// control plane, until the test ends; it returns once the node's API
// answers.
func (c *ControlPlane) StartNode(t testing.TB, o NodeOptions) *Proc {
	t.Helper()
	cella, runsc := daemontest.Binaries(t)
	daemontest.EnsureBase(t)
	if o.LeaseDuration == 0 {
		o.LeaseDuration = 3 * time.Second
	}
	dataDir := o.DataDir
	if dataDir == "" {
		var err error
		if dataDir, err = os.MkdirTemp("", "cella-node-"+o.Name+"-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// After the node stopped (cleanups run last-in first-out). A
			// node whose last daemon was killed (a test that failed before
			// restarting it) left its sandboxes running: a standalone
			// daemon on the data dir adopts and then stops them.
			if last := c.lastOn(dataDir); last != nil && last.killed {
				reap(t, cella, runsc, dataDir)
			}
			if left, _ := rootfs.FindMounts(dataDir); len(left) > 0 {
				// Never RemoveAll across mounts: report and leave them.
				t.Errorf("node %s left mounts behind: %v", o.Name, left)
				return
			}
			os.RemoveAll(dataDir)
		})
	}
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	listen := "127.0.0.1:" + strconv.Itoa(ports[0])
	n := &Proc{Name: o.Name, URL: "http://" + listen, DataDir: dataDir}
	c.setLast(dataDir, n)
	n.start(t, c, cella, "node-"+o.Name+".log", append([]string{"CELLA_CACHE_DIR=" + daemontest.CacheDir()}, o.Env...),
		append([]string{"serve", "--data-dir=" + dataDir, "--listen=" + listen, "--runsc=" + runsc, "--domain=cella.test",
			"--cluster=" + c.Kubeconfig(t), "--node-name=" + o.Name, "--cluster-namespace=" + o.Namespace,
			"--lease-duration=" + o.LeaseDuration.String(), "--network-pool=1"}, o.Args...)...)
	return n
}

// StartGateway runs `cella gateway` for namespace ns until the test ends.
func (c *ControlPlane) StartGateway(t testing.TB, name, ns string) *Proc {
	t.Helper()
	cella, _ := daemontest.Binaries(t)
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	listen := "127.0.0.1:" + strconv.Itoa(ports[0])
	g := &Proc{Name: name, URL: "http://" + listen}
	g.start(t, c, cella, "gateway-"+name+".log", nil,
		"gateway", "--listen="+listen, "--domain=cella.test", "--cluster="+c.Kubeconfig(t), "--cluster-namespace="+ns)
	return g
}

func (p *Proc) start(t testing.TB, c *ControlPlane, bin, log string, env []string, args ...string) {
	t.Helper()
	p.Log = filepath.Join(c.Dir, log)
	f, err := os.Create(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.p = &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.p.done) }()
	t.Cleanup(func() {
		p.Stop(t)
		if t.Failed() {
			t.Logf("%s log tail:\n%s", p.Name, tail(p.Log, 40))
		}
	})
	deadline := time.Now().Add(5 * time.Minute) // a first start may build the base template
	for {
		resp, err := http.Get(p.URL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return
			}
		}
		if p.p.exited() {
			t.Fatalf("%s exited before it served:\n%s", p.Name, tail(p.Log, 40))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer /health after 5m:\n%s", p.Name, tail(p.Log, 40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop ends the process with SIGTERM (a node stops its sandboxes and
// leaves the cluster) and waits for it; SIGKILL after a minute.
func (p *Proc) Stop(t testing.TB) {
	if p.p.exited() {
		return
	}
	_ = p.p.cmd.Process.Signal(syscall.SIGTERM)
	if !p.p.wait(time.Minute) {
		t.Errorf("%s did not stop within a minute of SIGTERM", p.Name)
		_ = p.p.cmd.Process.Kill()
		p.p.wait(time.Minute)
	}
}

// Kill ends the process with SIGKILL, as a crash would, and waits for it.
func (p *Proc) Kill() {
	p.killed = true
	_ = p.p.cmd.Process.Kill()
	p.p.wait(time.Minute)
}

// lastOn is the last node process started on dataDir.
func (c *ControlPlane) lastOn(dataDir string) *Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[dataDir]
}

func (c *ControlPlane) setLast(dataDir string, p *Proc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nodes == nil {
		c.nodes = map[string]*Proc{}
	}
	c.nodes[dataDir] = p
}

// reap runs a standalone daemon on a killed node's data dir until it
// serves (it has adopted what the dead one left) and stops it with SIGTERM
// (it stops those sandboxes and removes their resources).
func reap(t testing.TB, cella, runsc, dataDir string) {
	t.Helper()
	ports, err := freePorts(1)
	if err != nil {
		t.Error(err)
		return
	}
	listen := "127.0.0.1:" + strconv.Itoa(ports[0])
	cmd := exec.Command(cella, "serve", "--data-dir="+dataDir, "--listen="+listen, "--runsc="+runsc, "--domain=cella.test", "--network-pool=1")
	cmd.Env = append(os.Environ(), "CELLA_CACHE_DIR="+daemontest.CacheDir())
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Error(err)
		return
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline) && !p.exited(); time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get("http://" + listen + "/health"); err == nil {
			resp.Body.Close()
			break
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if !p.wait(time.Minute) {
		_ = cmd.Process.Kill()
		p.wait(time.Minute)
	}
}

// AdminKey is a node's admin key (the cluster's, shared by every node).
func (p *Proc) AdminKey(t testing.TB) string {
	b, err := os.ReadFile(filepath.Join(p.DataDir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Poll calls cond until it returns true or the deadline passes (generous:
// the CPU is shared), failing with what cond last said.
func Poll(t testing.TB, d time.Duration, what string, cond func(ctx context.Context) (bool, string)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var last string
	for {
		ok, msg := cond(ctx)
		if ok {
			return
		}
		last = msg
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %v (last: %s)", what, d, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
