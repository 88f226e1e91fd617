package clustertest

import (
	"context"
	"fmt"
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
		reapStaleNodes(t, cella, runsc)
		var err error
		if dataDir, err = os.MkdirTemp("", nodeDirPrefix+o.Name+"-"); err != nil {
			t.Fatal(err)
		}
		if err := ownDir(t, dataDir); err != nil {
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

// nodeDirPrefix starts the name of every node's data dir under $TMPDIR.
const nodeDirPrefix = "cella-node-"

// ownDir marks dataDir as this test process's: its owner file, locked
// (flock) for as long as the process lives — the kernel drops the lock
// with the process however it ends, so a dir whose lock can be taken has
// no live owner (a reused pid cannot pass for one), and of two reapers
// only the one holding the lock works on it.
func ownDir(t testing.TB, dataDir string) error {
	f, err := os.OpenFile(filepath.Join(dataDir, ownerFile), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	if _, err := f.WriteString(strconv.Itoa(os.Getpid())); err != nil {
		f.Close()
		return err
	}
	t.Cleanup(func() { f.Close() }) // after the dir's own cleanup below it (last in, first out)
	return nil
}

// reapStaleNodes removes what the nodes of a dead test process left: a
// test binary killed by `go test -timeout` (or a CI cancel) runs no
// cleanup, and its nodes die with it (Pdeathsig) but their sandboxes do
// not. Each data dir of this user's whose owner lock is free is reaped
// as a killed node's is, then removed; one that keeps mounts is reported
// and left (its owner file removed: it is not tried again).
func reapStaleNodes(t testing.TB, cella, runsc string) {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), nodeDirPrefix+"*"))
	for _, d := range dirs {
		if st, err := os.Lstat(d); err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 ||
			st.Sys().(*syscall.Stat_t).Uid != uint32(os.Getuid()) {
			continue // not a dir MkdirTemp made for this user
		}
		f, err := os.OpenFile(filepath.Join(d, ownerFile), os.O_RDWR|syscall.O_NOFOLLOW, 0)
		if err != nil {
			continue // being made, or not a clustertest node's
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close() // its owner lives, or another reaper has it
			continue
		}
		t.Logf("reaping the data dir %s of a node whose test process is gone", d)
		reap(t, cella, runsc, d)
		if left, _ := rootfs.FindMounts(d); len(left) > 0 {
			t.Logf("the stale node dir %s keeps mounts after its reap, left as it is: %v", d, left)
			_ = os.Remove(f.Name())
		} else {
			os.RemoveAll(d)
		}
		f.Close()
	}
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
