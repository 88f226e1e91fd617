package clustertest

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"k8s.io/client-go/rest"
)

// TestStartStop: the API server answers with the pinned version, and once
// the test's cleanups ran neither process nor the state directory is left.
func TestStartStop(t *testing.T) {
	var pids []int
	var dir string
	t.Run("up", func(t *testing.T) {
		c := Start(t)
		pids = []int{c.etcd.cmd.Process.Pid, c.apiserver.cmd.Process.Pid}
		dir = c.Dir
		hc, err := rest.HTTPClientFor(c.RESTConfig())
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Get(c.URL + "/version")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v struct{ GitVersion string }
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("/version: %d %v", resp.StatusCode, err)
		}
		if v.GitVersion != "v1.37.2" {
			t.Errorf("gitVersion %q, want v1.37.2 (the pinned tools/k8s/kube)", v.GitVersion)
		}
		// Without the token the API server refuses: the test's cluster is
		// not open to whatever else runs on the host.
		anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: c.pool()}}}
		resp2, err := anon.Get(c.URL + "/api/v1/namespaces")
		if err != nil {
			t.Fatal(err)
		}
		resp2.Body.Close()
		if resp2.StatusCode != http.StatusForbidden && resp2.StatusCode != http.StatusUnauthorized {
			t.Errorf("no token: %d, want 401 or 403 (anonymous)", resp2.StatusCode)
		}
	})
	if t.Failed() {
		return
	}
	for _, pid := range pids {
		if running(pid) {
			t.Errorf("process %d still runs after the cleanup", pid)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s is still there (%v)", dir, err)
	}
}

// running reports whether pid is a live process (a zombie is not).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

// TestKilledTestLeavesNothing: a test process killed with SIGKILL (as a
// `go test -timeout` panic or a CI cancel leaves it) takes etcd and the API
// server with it, and the next Start removes its state directory.
func TestKilledTestLeavesNothing(t *testing.T) {
	Require(t)
	if os.Getenv("CLUSTERTEST_CHILD") == "1" {
		t.Skip("the child's own run")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f, kill := startChild(ctx, t, "1")
	if len(f) < 3 {
		t.Fatalf("the child never reported its control plane (%q)", f)
	}
	dir := f[0]
	var pids []int
	for _, p := range f[1:] {
		n, _ := strconv.Atoi(p)
		pids = append(pids, n)
	}
	kill()
	for _, pid := range pids {
		for running(pid) {
			if ctx.Err() != nil {
				t.Fatalf("process %d outlived its killed test process", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	removeStale() // what the next Start does first
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s survived removeStale (%v)", dir, err)
	}
}

// TestChild is the child of TestKilledTestLeavesNothing: it starts a
// control plane, says where, and waits to be killed. As the child of
// TestKilledNodeTestLeavesNothing it also runs a node with a sandbox.
func TestChild(t *testing.T) {
	switch os.Getenv("CLUSTERTEST_CHILD") {
	case "1":
		c := Start(t)
		fmt.Printf("CHILD %s %d %d\n", c.Dir, c.etcd.cmd.Process.Pid, c.apiserver.cmd.Process.Pid)
	case "node":
		c, _ := StartIn(t, "cella-stale-node")
		n := c.StartNode(t, NodeOptions{Name: "stale", Namespace: "cella-stale-node"})
		cl, err := client.New(client.Config{URL: n.URL, APIKey: n.AdminKey(t)})
		if err != nil {
			t.Fatal(err)
		}
		sb, err := cl.Create(context.Background(), client.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("CHILD %s %s %d\n", n.DataDir, sb.SandboxID, n.p.cmd.Process.Pid)
	default:
		t.Skip("run by TestKilledTestLeavesNothing and TestKilledNodeTestLeavesNothing")
	}
	time.Sleep(3 * time.Minute)
}

// TestKilledNodeTestLeavesNothing: a test process killed with SIGKILL
// while its node runs a sandbox takes the node with it, but not the
// sandbox (nothing of the test runs any more to stop it); the next
// StartNode of any test finds the dead test's data dir, stops the
// sandbox's processes and removes the dir.
func TestKilledNodeTestLeavesNothing(t *testing.T) {
	Require(t)
	if os.Getenv("CLUSTERTEST_CHILD") != "" {
		t.Skip("the child's own run")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f, kill := startChild(ctx, t, "node")
	if len(f) != 3 {
		t.Fatalf("the child never reported its node's sandbox (%q)", f)
	}
	dataDir, sandbox := f[0], f[1]
	nodePID, _ := strconv.Atoi(f[2])
	kill()
	for running(nodePID) {
		if ctx.Err() != nil {
			t.Fatalf("the node %d outlived its killed test process", nodePID)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(processesOf(sandbox)) == 0 {
		t.Fatalf("sandbox %s has no process left after its test was killed: nothing to reap, the test cannot tell", sandbox)
	}
	cella, runsc := daemontest.Binaries(t)
	reapStaleNodes(t, cella, runsc) // what the next StartNode does first
	removeStale()                   // the child's control plane: what the next Start does first
	// The reaping daemon has stopped the sandbox when it exits; its
	// processes end on their own after that.
	Poll(t, time.Minute, "sandbox "+sandbox+"'s processes gone", func(context.Context) (bool, string) {
		left := processesOf(sandbox)
		return len(left) == 0, strings.Join(left, "\n")
	})
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("the dead test's node dir %s survived the reap (%v)", dataDir, err)
	}
}

// startChild runs TestChild in a child test process as mode
// (CLUSTERTEST_CHILD) and returns the fields of its "CHILD ..." line (nil
// if it ended without one) and what kills it with SIGKILL and waits.
func startChild(ctx context.Context, t *testing.T, mode string) ([]string, func()) {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChild$", "-test.v")
	cmd.Env = append(os.Environ(), "CLUSTERTEST_CHILD="+mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	kill := func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}
	t.Cleanup(kill)
	var fields []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "CHILD "); ok {
			fields = strings.Fields(rest)
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, out) }() // the rest, until it dies
	return fields, kill
}

// processesOf are the running processes whose command line names id.
func processesOf(id string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), id) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil && running(pid) {
			out = append(out, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

// TestFailedStartLeavesNothing: a control plane whose etcd exits at once
// is an error (not a panic of the cleanup) and leaves no state directory.
// Needs no engines: /bin/false stands where etcd would run.
func TestFailedStartLeavesNothing(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	c, err := New(Binaries{Etcd: "/bin/false", KubeAPIServer: "/bin/false"})
	if err == nil {
		c.Stop()
		t.Fatal("a control plane whose etcd exits at once started")
	}
	t.Logf("the error: %v", err)
	if left, _ := filepath.Glob(filepath.Join(tmp, dirPrefix+"*")); len(left) != 0 {
		t.Errorf("a failed start left %v", left)
	}
}
