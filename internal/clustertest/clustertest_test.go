package clustertest

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
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
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChild$", "-test.v")
	cmd.Env = append(os.Environ(), "CLUSTERTEST_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var pids []int
	var dir string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "CHILD "); ok {
			f := strings.Fields(rest)
			for _, p := range f[1:] {
				n, _ := strconv.Atoi(p)
				pids = append(pids, n)
			}
			dir = f[0]
			break
		}
	}
	if dir == "" {
		t.Fatal("the child never reported its control plane")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
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
// control plane, says where, and waits to be killed.
func TestChild(t *testing.T) {
	if os.Getenv("CLUSTERTEST_CHILD") != "1" {
		t.Skip("run by TestKilledTestLeavesNothing")
	}
	c := Start(t)
	fmt.Printf("CHILD %s %d %d\n", c.Dir, c.etcd.cmd.Process.Pid, c.apiserver.cmd.Process.Pid)
	time.Sleep(3 * time.Minute)
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
