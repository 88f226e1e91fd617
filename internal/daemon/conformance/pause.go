package conformance

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/cgroup"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/diskimage"
	"github.com/cella-sandbox/cella/internal/envd/process"
	"github.com/cella-sandbox/cella/internal/rootfs"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/oci"
)

// counterCmd counts into a file (and stdout) five times a second.
// The count is renamed into place so that a reader never sees the file
// empty between the truncate and the write.
const counterCmd = `i=0; while :; do i=$((i+1)); echo $i > /home/user/count.tmp; mv -f /home/user/count.tmp /home/user/count; echo $i; sleep 0.2; done`

// startCounter starts counterCmd as a tracked process of the agent (like
// the SDK's commands.run(cmd, {background: true})), drops the stream, and
// returns its pid.
func startCounter(t *testing.T, sb *client.SandboxConn) uint32 {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // the stream ends, the process keeps running
	stream, err := sb.Process.Start(ctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", counterCmd}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
		if st := stream.Msg().GetEvent().GetStart(); st != nil {
			return st.GetPid()
		}
	}
	t.Fatalf("no start event: %v", stream.Err())
	return 0
}

// StartCounter and WaitCountAbove are startCounter and waitCountAbove for
// the tests of other packages (a sandbox resumed through a gateway, on
// another node).
func StartCounter(t *testing.T, sb *client.SandboxConn) uint32       { return startCounter(t, sb) }
func WaitCountAbove(t *testing.T, sb *client.SandboxConn, n int) int { return waitCountAbove(t, sb, n) }

func readCount(t *testing.T, sb *client.SandboxConn) int {
	t.Helper()
	out := mustOK(t, sb, "cat /home/user/count")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("count file: %q", out)
	}
	return n
}

// waitCountAbove waits until the counter passes n, proving it runs.
func waitCountAbove(t *testing.T, sb *client.SandboxConn, n int) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		// A counter just started may not have written its first count yet.
		c := -1
		if out := mustOK(t, sb, "cat /home/user/count 2>/dev/null || true"); strings.TrimSpace(out) != "" {
			c = readCount(t, sb)
		}
		if c > n {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("the counter stays at %d (want above %d): the background process is not running", c, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reattach re-attaches to a process by pid (process.Process/Connect, the
// SDK's commands.connect) and waits for one output event.
func reattach(t *testing.T, sb *client.SandboxConn, pid uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := sb.Process.Connect(ctx, connect.NewRequest(&process.ConnectRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	gotStart := false
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if st := ev.GetStart(); st != nil {
			if st.GetPid() != pid {
				t.Fatalf("re-attach: start event for pid %d, want %d", st.GetPid(), pid)
			}
			gotStart = true
		}
		if ev.GetData() != nil && gotStart {
			return
		}
		if ev.GetEnd() != nil {
			t.Fatalf("re-attach: process %d ended: %v", pid, ev.GetEnd())
		}
	}
	t.Fatalf("re-attach to pid %d: no output (start=%v): %v", pid, gotStart, stream.Err())
}

func state(t *testing.T, env *daemontest.Env, id string) string {
	t.Helper()
	d, err := env.Client.Get(ctxT(t, time.Minute), id)
	if err != nil {
		t.Fatal(err)
	}
	return d.State
}

// holdsCPULimit: sandbox id's container is held to the CPU limit its record
// gives (a memory restore runs under a higher one and must put it back).
func holdsCPULimit(t *testing.T, env *daemontest.Env, id string) {
	t.Helper()
	d, err := env.Client.Get(ctxT(t, time.Minute), id)
	if err != nil {
		t.Fatal(err)
	}
	if d.CPUCount <= 0 {
		t.Fatalf("sandbox %s has no CPU limit (%g) to check", id, d.CPUCount)
	}
	want, period := oci.CPUQuota(d.CPUCount)
	if q, p, err := cgroup.CPUQuota(id); err != nil || q != want || p != period {
		t.Errorf("sandbox %s (%g CPUs) runs under a CPU quota of %d every %d (%v); want %d every %d", id, d.CPUCount, q, p, err, want, period)
	}
}

// checkPausedContainer checks what the runtime holds of a paused sandbox:
// nothing after a memory checkpoint, a frozen container otherwise.
func checkPausedContainer(t *testing.T, env *daemontest.Env, id string) {
	t.Helper()
	rt := env.Daemon.Runtime
	ids, err := rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rt.Capabilities().MemoryCheckpoint {
		if slices.Contains(ids, id) {
			t.Fatalf("after a checkpoint the container %s still exists", id)
		}
		if _, err := os.Stat(env.DataDir + "/sandboxes/" + id + "/checkpoint/checkpoint.img"); err != nil {
			t.Fatalf("no checkpoint image: %v", err)
		}
		return
	}
	if st, err := rt.State(context.Background(), id); err != nil || st != runtime.StatusPaused {
		t.Fatalf("frozen container: state %q, %v", st, err)
	}
}

func testPauseResume(t *testing.T, env *daemontest.Env) {
	sb := create(t, env, client.CreateRequest{})
	mustOK(t, sb, "echo kept > /home/user/kept")
	pid := startCounter(t, sb)
	n := waitCountAbove(t, sb, 1)

	// Ten cycles: each writes a file before pausing, and after resuming
	// every file of every cycle is there byte for byte, the counter goes on
	// and the counting process can be re-attached by pid.
	want := "kept\n"
	for i := 0; i < 10; i++ {
		line := fmt.Sprintf("cycle %d %s\n", i+1, strings.Repeat("x", 100*(i+1)))
		want += line
		if err := sb.WriteFile(ctxT(t, time.Minute), fmt.Sprintf("/home/user/cycle-%02d", i+1), "", strings.NewReader(line)); err != nil {
			t.Fatalf("cycle %d: write: %v", i+1, err)
		}
		ctx := ctxT(t, 2*time.Minute)
		start := time.Now()
		if err := env.Client.Pause(ctx, sb.ID, true); err != nil {
			t.Fatalf("pause #%d: %v", i+1, err)
		}
		pauseTook := time.Since(start)
		if i == 0 {
			if err := env.Client.Pause(ctx, sb.ID, true); !client.IsConflict(err) {
				t.Fatalf("second pause: want 409, got %v", err)
			}
			if st := state(t, env, sb.ID); st != "paused" {
				t.Fatalf("state after pause: %q", st)
			}
			checkPausedContainer(t, env, sb.ID)
			if _, err := sb.Exec(ctxT(t, time.Minute), "true", client.ExecOptions{}); err == nil {
				t.Fatal("exec in a paused sandbox succeeded")
			}
		}
		start = time.Now()
		_, resumed, err := env.Client.ConnectResumed(ctx, sb.ID)
		if err != nil || !resumed {
			t.Fatalf("resume #%d: resumed=%v err=%v", i+1, resumed, err)
		}
		t.Logf("cycle %d: pause %v, resume %v", i+1, pauseTook.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		holdsCPULimit(t, env, sb.ID)
		if c := readCount(t, sb); c < n {
			t.Fatalf("cycle %d: counter went back from %d to %d", i+1, n, c)
		}
		n = waitCountAbove(t, sb, readCount(t, sb))
		got := mustOK(t, sb, "cat /home/user/kept /home/user/cycle-*")
		if got != want {
			t.Fatalf("cycle %d: files written before the pauses: got %d bytes, want %d", i+1, len(got), len(want))
		}
		reattach(t, sb, pid)
	}
	if _, resumed, err := env.Client.ConnectResumed(ctxT(t, time.Minute), sb.ID); err != nil || resumed {
		t.Fatalf("connect to a running sandbox: resumed=%v err=%v", resumed, err)
	}
	reattach(t, sb, pid)

	// Without memory: the files stay, the processes do not.
	if err := env.Client.Pause(ctxT(t, time.Minute), sb.ID, false); err != nil {
		t.Fatal(err)
	}
	if _, resumed, err := env.Client.ConnectResumed(ctxT(t, 2*time.Minute), sb.ID); err != nil || !resumed {
		t.Fatalf("resume after pause without memory: resumed=%v err=%v", resumed, err)
	}
	if out := mustOK(t, sb, "cat /home/user/kept; pgrep -f '[w]hile :' || echo no-counter"); out != "kept\nno-counter\n" {
		t.Fatalf("after a pause without memory: %q", out)
	}
	onlySocketInRunDir(t, env, sb.ID) // the cold boot's config went (agentchannel.go)
	// Kill of a paused sandbox leaves nothing behind.
	if err := env.Client.Pause(ctxT(t, time.Minute), sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Kill(ctxT(t, time.Minute), sb.ID); err != nil {
		t.Fatal(err)
	}
	if l := leftovers(t, env, sb.ID); len(l) > 0 {
		t.Fatalf("after killing a paused sandbox the host still holds: %v", l)
	}
}

func testPauseRestart(t *testing.T, env *daemontest.Env) {
	dir, err := os.MkdirTemp("", "cella-test-restart-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	rtName := env.Daemon.Runtime.Name()
	// Egress to an upstream on the host's loopback must work before the
	// pause and after the resume by the next daemon (a frozen container
	// keeps its network slot: the next daemon adopts it).
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "upstream says hi") }))
	t.Cleanup(up.Close)
	netCfg := daemon.NetworkConfig{Allow: []string{"up.test"}, Resolve: []string{"up.test=127.0.0.1"}}
	curl := "curl -sS -m 10 http://up.test:" + strings.TrimPrefix(up.URL, "http://127.0.0.1:") + "/"
	env1 := daemontest.Start(t, rtName, daemontest.Options{DataDir: dir, Network: netCfg})
	ctx := ctxT(t, 3*time.Minute)
	created, err := env1.Client.Create(ctx, client.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id := created.SandboxID
	sb, err := env1.Client.Sandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, sb, "echo kept > /home/user/kept")
	if out := mustOK(t, sb, curl); out != "upstream says hi" {
		t.Fatalf("egress before the pause: %q", out)
	}
	startCounter(t, sb)
	n := waitCountAbove(t, sb, 1)
	if err := env1.Client.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	env1.Close() // a graceful stop keeps paused sandboxes

	env2 := daemontest.Start(t, rtName, daemontest.Options{DataDir: dir, Network: netCfg})
	t.Cleanup(func() { _ = env2.Client.Kill(context.Background(), id) })
	if !slices.Contains(env2.Daemon.Reconcile.AdoptedPaused, id) {
		t.Fatalf("restart did not keep the paused sandbox: %+v", env2.Daemon.Reconcile)
	}
	if st := state(t, env2, id); st != "paused" {
		t.Fatalf("state after restart: %q", st)
	}
	got, resumed, err := env2.Client.ConnectResumed(ctx, id)
	if err != nil || !resumed || got.EnvdAccessToken != created.EnvdAccessToken {
		t.Fatalf("resume after restart: resumed=%v err=%v token kept=%v", resumed, err, got.EnvdAccessToken == created.EnvdAccessToken)
	}
	sb2, err := env2.Client.Sandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if out := mustOK(t, sb2, "cat /home/user/kept"); out != "kept\n" {
		t.Fatalf("file after restart: %q", out)
	}
	if c := readCount(t, sb2); c < n {
		t.Fatalf("counter went back from %d to %d", n, c)
	}
	waitCountAbove(t, sb2, readCount(t, sb2))
	if res := run(t, sb2, curl, client.ExecOptions{Timeout: time.Minute}); res.ExitCode != 0 || res.Stdout != "upstream says hi" {
		t.Fatalf("egress after a resume by the next daemon: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
}

// testPauseReboot: a paused sandbox's files survive what a host reboot does
// to them (every mount under the sandbox gone, its image file kept), and
// the next daemon mounts them again and resumes it; under gVisor its
// memory too (the checkpoint is on disk beside it). A writable layer in
// RAM is lost at this point, and the sandbox with it.
func testPauseReboot(t *testing.T, env *daemontest.Env) {
	dir, err := os.MkdirTemp("", "cella-test-reboot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	rtName := env.Daemon.Runtime.Name()
	env1 := daemontest.Start(t, rtName, daemontest.Options{DataDir: dir})
	memory := env1.Daemon.Runtime.Capabilities().MemoryCheckpoint // crun's frozen memory dies with the host
	ctx := ctxT(t, 3*time.Minute)
	sb := create(t, env1, client.CreateRequest{})
	id := sb.ID
	mustOK(t, sb, "echo kept > /home/user/kept && head -c 64M /dev/urandom > /home/user/big && sha256sum /home/user/big > /home/user/big.sum")
	run(t, sb, "rm /etc/hostname", client.ExecOptions{User: "root"})
	n := 0
	if memory {
		startCounter(t, sb)
		n = waitCountAbove(t, sb, 1)
	}
	if err := env1.Client.Pause(ctx, id, memory); err != nil {
		t.Fatal(err)
	}
	env1.Close() // a graceful stop keeps paused sandboxes

	// The reboot, as far as the sandbox's files go: its mounts are gone
	// (cleanly unmounted by the shutdown), and so are their loop devices.
	sbDir := filepath.Join(dir, "sandboxes", id)
	mounts, err := rootfs.FindMounts(sbDir)
	if err != nil || len(mounts) == 0 {
		t.Fatalf("a paused sandbox's layer is not mounted: %v %v", mounts, err)
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := unix.Unmount(mounts[i], 0); err != nil {
			t.Fatalf("unmount %s: %v", mounts[i], err)
		}
	}
	if l := diskimage.WaitLoopsGone(sbDir, 10*time.Second); len(l) > 0 {
		t.Fatalf("loop devices after the unmount: %+v", l)
	}

	env2 := daemontest.Start(t, rtName, daemontest.Options{DataDir: dir})
	t.Cleanup(func() { _ = env2.Client.Kill(context.Background(), id) })
	if !slices.Contains(env2.Daemon.Reconcile.AdoptedPaused, id) {
		d, _ := env2.Client.Get(ctx, id)
		t.Fatalf("after the reboot the paused sandbox was not kept: %+v; state %q: %s", env2.Daemon.Reconcile, d.State, d.Error)
	}
	if _, resumed, err := env2.Client.ConnectResumed(ctx, id); err != nil || !resumed {
		t.Fatalf("resume after the reboot: resumed=%v err=%v", resumed, err)
	}
	sb2, err := env2.Client.Sandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if out := mustOK(t, sb2, "cat /home/user/kept && sha256sum -c --quiet /home/user/big.sum && echo big-ok && test ! -e /etc/hostname && echo deleted-stays-deleted"); out != "kept\nbig-ok\ndeleted-stays-deleted\n" {
		t.Fatalf("files after the reboot: %q", out)
	}
	if memory {
		if c := readCount(t, sb2); c < n {
			t.Fatalf("counter went back from %d to %d", n, c)
		}
		waitCountAbove(t, sb2, readCount(t, sb2))
	}
	if err := env2.Client.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	if l := leftovers(t, env2, id); len(l) > 0 {
		t.Fatalf("after kill the host still holds: %v", l)
	}
}
