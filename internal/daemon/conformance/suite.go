// Package conformance is the whole-daemon suite every cella runtime passes.
// It drives a real daemon (daemontest) built on the runtime under test,
// through the same API and agent path users take, and checks lifecycle,
// isolation, limits, pause/resume, volumes, lifecycle policies, the agent
// channel, snapshots and forks, and cleanup. Run and RunSnapshots take the
// runtime's name. (What one runtime.Runtime must do on its own, below any
// daemon, is runtime/runtimetest's Suite.)
package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/cgroup"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/diskimage"
	"github.com/cella-sandbox/cella/internal/rootfs"
)

// Run runs the whole suite against the named runtime.
func Run(t *testing.T, runtimeName string) {
	env := daemontest.Start(t, runtimeName, daemontest.Options{})
	dataDir = env.DataDir
	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, env) })
	t.Run("Isolation", func(t *testing.T) { testIsolation(t, env) })
	t.Run("AgentChannel", func(t *testing.T) { testAgentChannel(t, env) }) // agentchannel.go
	t.Run("RunDirReadOnly", func(t *testing.T) { testRunDirReadOnly(t, env) })
	t.Run("FakeDaemon", func(t *testing.T) { testFakeDaemon(t, env) })
	t.Run("Limits", func(t *testing.T) { testLimits(t, env) })
	t.Run("Localhost", func(t *testing.T) { testLocalhost(t, env) }) // hosts.go
	t.Run("PauseResume", func(t *testing.T) { testPauseResume(t, env) })
	t.Run("PauseSurvivesDaemonRestart", func(t *testing.T) { testPauseRestart(t, env) })
	t.Run("PauseSurvivesHostReboot", func(t *testing.T) { testPauseReboot(t, env) })
	t.Run("PauseSurvivesAgentUpgrade", func(t *testing.T) { testAgentUpgrade(t, env) })    // agentbinary.go
	t.Run("AgentBinaryImmutable", func(t *testing.T) { testAgentBinaryImmutable(t, env) }) // agentbinary.go
	t.Run("Volumes", func(t *testing.T) { testVolumes(t, env) })                           // volumes.go
	t.Run("LifecyclePolicies", func(t *testing.T) { testLifecyclePolicies(t, env) })       // volumes.go
	t.Run("CleanupAfterKill", func(t *testing.T) { testCleanupAfterKill(t, env) })
	t.Run("CleanupAfterDaemonStop", func(t *testing.T) { testCleanupAfterStop(t, env) })
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// create makes a sandbox that is killed when the test ends.
func create(t *testing.T, env *daemontest.Env, req client.CreateRequest) *client.SandboxConn {
	t.Helper()
	ctx := ctxT(t, 3*time.Minute)
	sb, err := env.Client.Create(ctx, req)
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Kill(context.Background(), sb.SandboxID) })
	conn, err := env.Client.Sandbox(ctx, sb.SandboxID)
	if err != nil {
		t.Fatalf("attach sandbox: %v", err)
	}
	return conn
}

// dataDir is the data dir of the daemon under test, for agent logs.
var dataDir string

func run(t *testing.T, sb *client.SandboxConn, cmd string, o client.ExecOptions) client.ExecResult {
	t.Helper()
	res, err := sb.Exec(ctxT(t, 2*time.Minute), cmd, o)
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dataDir, "sandboxes", sb.ID, "agent.log"))
		t.Fatalf("exec %q: %v\nagent log tail:\n%s", cmd, err, tailStr(string(log), 3000))
	}
	return res
}

func mustOK(t *testing.T, sb *client.SandboxConn, cmd string) string {
	t.Helper()
	res := run(t, sb, cmd, client.ExecOptions{Timeout: time.Minute})
	if res.ExitCode != 0 {
		t.Fatalf("%q: exit %d, error %q, stderr %q", cmd, res.ExitCode, res.Error, res.Stderr)
	}
	return res.Stdout
}

func testLifecycle(t *testing.T, env *daemontest.Env) {
	sb := create(t, env, client.CreateRequest{})
	if out := mustOK(t, sb, "echo hello"); out != "hello\n" {
		t.Fatalf("echo: got %q", out)
	}
	res := run(t, sb, "echo out; echo err >&2; exit 3", client.ExecOptions{})
	if res.ExitCode != 3 || res.Stdout != "out\n" || res.Stderr != "err\n" {
		t.Fatalf("exit 3: got %+v", res)
	}
	if out := mustOK(t, sb, "python3 -c 'print(6*7)'"); out != "42\n" {
		t.Fatalf("python: got %q", out)
	}
	// Threaded programs work (glibc's pthread_create uses clone3).
	if out := mustOK(t, sb, `python3 -c 'import threading; t = threading.Thread(target=print, args=("thread ok",)); t.start(); t.join()'`); out != "thread ok\n" {
		t.Fatalf("threads: got %q", out)
	}
	// Kill: the record goes and the sandbox URL answers 502.
	if err := env.Client.Kill(ctxT(t, time.Minute), sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.Get(ctxT(t, time.Minute), sb.ID); !client.IsNotFound(err) {
		t.Fatalf("GET after kill: want 404, got %v", err)
	}
	req, _ := http.NewRequest("GET", env.URL+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", sb.ID)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("sandbox URL after kill: want 502, got %d", resp.StatusCode)
	}
}

func testIsolation(t *testing.T, env *daemontest.Env) {
	// Canaries the sandbox must not see: a host file, a host env var of the
	// daemon's process, and a server on the host's loopback.
	canary := fmt.Sprintf("cella-canary-%d", time.Now().UnixNano())
	hostFile := filepath.Join("/tmp", canary)
	if err := os.WriteFile(hostFile, []byte(canary), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(hostFile) })
	t.Setenv("CELLA_HOST_CANARY", canary)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hostSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(canary)) })}
	go hostSrv.Serve(ln)
	t.Cleanup(func() { hostSrv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port

	sb := create(t, env, client.CreateRequest{})
	other := create(t, env, client.CreateRequest{})

	t.Run("HostFile", func(t *testing.T) {
		res := run(t, sb, "cat "+hostFile+"; grep -rl "+canary+" /tmp /home /root /run 2>/dev/null; true", client.ExecOptions{User: "root"})
		if strings.Contains(res.Stdout, canary) {
			t.Fatalf("sandbox read the host canary file: %q", res.Stdout)
		}
	})
	t.Run("LayerInternals", func(t *testing.T) {
		// The writable layer's filesystem holds more than the upper dir the
		// sandbox sees through its overlay (the layer's record, lost+found),
		// and it sits on a host loop device: root in the sandbox reaches
		// none of it, nor any other loop device.
		res := run(t, sb, "ls -d /lost+found /layer.json /upper /work /dev/loop* /dev/loop-control 2>/dev/null; mknod /tmp/l b 7 0 && head -c 1 /tmp/l | od -c; true", client.ExecOptions{User: "root"})
		if out := strings.TrimSpace(res.Stdout); out != "" {
			t.Fatalf("the sandbox sees its layer's internals or a loop device: %q", out)
		}
	})
	t.Run("HostEnv", func(t *testing.T) {
		res := run(t, sb, "env; cat /proc/1/environ | tr '\\0' '\\n'", client.ExecOptions{User: "root"})
		if strings.Contains(res.Stdout, canary) || strings.Contains(res.Stdout, "CELLA_HOST_CANARY") {
			t.Fatalf("host environment leaked into the sandbox: %q", res.Stdout)
		}
	})
	t.Run("HostLoopback", func(t *testing.T) {
		cmd := fmt.Sprintf("curl -sS --max-time 3 http://127.0.0.1:%d/ ; python3 -c \"import socket; s=socket.create_connection(('127.0.0.1', %d), 3); print('connected')\"", port, port)
		res := run(t, sb, cmd, client.ExecOptions{Timeout: 30 * time.Second})
		if strings.Contains(res.Stdout, canary) || strings.Contains(res.Stdout, "connected") {
			t.Fatalf("sandbox reached a host loopback server: %q", res.Stdout)
		}
	})
	t.Run("NoEgressByDefault", func(t *testing.T) {
		// One link besides loopback, the network slot's eth0, and with the
		// daemon's default ceiling nothing is reachable through it: names
		// do not resolve, HTTP is refused with the explanation, other TCP
		// is closed without a byte. (192.0.2.0/24 is TEST-NET: nothing is
		// ever dialed there, the proxy refuses before any dial.)
		out := mustOK(t, sb, "cat /proc/net/dev | tail -n +3 | awk -F: '{print $1}' | tr -d ' ' | sort")
		if got := strings.Fields(out); len(got) > 2 || (len(got) == 2 && (got[0] != "eth0" || got[1] != "lo")) {
			t.Fatalf("sandbox interfaces: %q, want lo and at most the slot's eth0", out)
		}
		res := run(t, sb, `getent hosts example.com && echo resolved; curl -sS --max-time 5 http://192.0.2.1/; python3 -c "
import socket
s = socket.create_connection(('192.0.2.1', 5432), 5)
s.settimeout(5)
try:
    print('tcp-read', s.recv(10))
except Exception as e:
    print('tcp-error', e)
"`, client.ExecOptions{Timeout: 60 * time.Second})
		if strings.Contains(res.Stdout, "resolved") {
			t.Fatalf("a name resolved with no egress allowed: %q", res.Stdout)
		}
		if !strings.Contains(res.Stdout, "blocked by cella sandbox policy") {
			t.Fatalf("HTTP out was not refused with the policy's explanation: %q %q", res.Stdout, res.Stderr)
		}
		if !strings.Contains(res.Stdout, "tcp-read b''") && !strings.Contains(res.Stdout+res.Stderr, "tcp-error") && !strings.Contains(res.Stderr, "Connection") {
			t.Fatalf("raw TCP out got data: %q %q", res.Stdout, res.Stderr)
		}
	})
	t.Run("OtherSandbox", func(t *testing.T) {
		// A server in one sandbox is not reachable from the other.
		run(t, other, "nohup python3 -m http.server 8123 >/dev/null 2>&1 &", client.ExecOptions{Timeout: 10 * time.Second})
		time.Sleep(500 * time.Millisecond)
		res := run(t, sb, "curl -sS --max-time 3 http://127.0.0.1:8123/ && echo reached", client.ExecOptions{Timeout: 30 * time.Second})
		if strings.Contains(res.Stdout, "reached") {
			t.Fatalf("sandbox reached another sandbox's server: %q", res.Stdout)
		}
	})
	t.Run("ProcIsSandboxOnly", func(t *testing.T) {
		out := mustOK(t, sb, "ps -eo comm=")
		for _, bad := range []string{"runsc", "crun", "systemd", "sshd", "containerd", "go"} {
			for _, name := range strings.Fields(out) {
				if name == bad {
					t.Fatalf("sandbox sees host process %q: %q", bad, out)
				}
			}
		}
		if n := len(strings.Fields(out)); n > 8 {
			t.Fatalf("sandbox sees %d processes, want only its own: %q", n, out)
		}
	})
	t.Run("DefaultUser", func(t *testing.T) {
		out := mustOK(t, sb, "id -u; pwd; touch ~/written && echo ok")
		if out != "1000\n/home/user\nok\n" {
			t.Fatalf("default user: got %q, want uid 1000 in /home/user", out)
		}
		if out := mustOK(t, sb, "id -u"); strings.TrimSpace(out) != "1000" {
			t.Fatal(out)
		}
		res := run(t, sb, "id -u", client.ExecOptions{User: "root"})
		if strings.TrimSpace(res.Stdout) != "0" {
			t.Fatalf("--user root: got %q", res.Stdout)
		}
	})
	// hardening.go
	t.Run("FilesAPIActsAsUser", func(t *testing.T) { testFilesActAsUser(t, sb) })
	t.Run("NoIOUring", func(t *testing.T) { testNoIOUring(t, sb) })
	t.Run("OwnSysfs", func(t *testing.T) { testOwnSysfs(t, sb) })
	t.Run("MountinfoNoHostPaths", func(t *testing.T) { testMountinfoNoHostPaths(t, env, sb) })
	t.Run("TemplateUnchanged", func(t *testing.T) {
		mustOK(t, sb, "echo changed > /home/user/.profile-test")
		run(t, sb, "rm -rf /usr/bin/python3", client.ExecOptions{User: "root"})
		if out := mustOK(t, other, "test -e /usr/bin/python3 && test ! -e /home/user/.profile-test && echo intact"); out != "intact\n" {
			t.Fatalf("one sandbox's changes reached another: %q", out)
		}
	})
}

func testLimits(t *testing.T, env *daemontest.Env) {
	sb := create(t, env, client.CreateRequest{MemoryMB: 256, PidsLimit: 64, DiskSizeMB: 64})
	bystander := create(t, env, client.CreateRequest{})

	expect := func(t *testing.T, res client.ExecResult, words ...string) {
		t.Helper()
		for _, w := range words {
			if !strings.Contains(res.Error, w) {
				t.Fatalf("result error %q does not name %q (exit %d, stderr %q)", res.Error, w, res.ExitCode, tailStr(res.Stderr, 300))
			}
		}
		if res.ExitCode == 0 {
			t.Fatalf("command hitting a limit exited 0: %+v", res)
		}
	}
	stillServing := func(t *testing.T) {
		t.Helper()
		if out := mustOK(t, sb, "echo alive"); out != "alive\n" {
			t.Fatalf("sandbox after limit: %q", out)
		}
		if out := mustOK(t, bystander, "echo alive"); out != "alive\n" {
			t.Fatalf("other sandbox after limit: %q", out)
		}
	}

	t.Run("MemoryHog", func(t *testing.T) {
		res := run(t, sb, `python3 -c "
chunks = []
while True:
    chunks.append(bytearray(b'x' * (16 << 20)))
"`, client.ExecOptions{Timeout: time.Minute})
		expect(t, res, "memory limit", "256 MiB", "--memory")
		stillServing(t)
	})
	t.Run("SharedMappings", func(t *testing.T) { testSharedMappings(t, env) })
	t.Run("TooManyProcesses", func(t *testing.T) {
		res := run(t, sb, `for i in $(seq 100); do sleep 30 & done; wait`, client.ExecOptions{Timeout: time.Minute})
		expect(t, res, "pids limit", "64", "--pids")
		stillServing(t)
	})
	t.Run("ForkBomb", func(t *testing.T) {
		// A fork bomb ends as a command over its limit does: the command
		// is killed with a result naming the pids limit, and its sandbox
		// goes on serving. Under crun the host pids cgroup refuses the
		// forks; under gVisor the guest's own pids cgroup does (the host
		// ceiling would end the whole sandbox). Twice: what a bomb leaves
		// behind must not make the next one fatal.
		// The bomb first tries to lift the cap (uid 1000 may not) and to
		// leave the commands' cgroup.
		bomb := create(t, env, client.CreateRequest{PidsLimit: 64})
		const escape = `for try in 'echo max > /sys/fs/cgroup/cella-commands/pids.max' 'echo $$ > /sys/fs/cgroup/cgroup.procs' 'mkdir /sys/fs/cgroup/mine'; do
			sh -c "$try" 2>/dev/null && echo "escaped: $try"; done; `
		for i := 0; i < 2; i++ {
			res := run(t, bomb, escape+`bomb() { bomb | bomb & }; bomb; sleep 30`, client.ExecOptions{Timeout: time.Minute})
			if strings.Contains(res.Stdout, "escaped") {
				t.Fatalf("uid 1000 changed the sandbox's cgroups: %+v", res)
			}
			expect(t, res, "pids limit", "64", "--pids")
			if strings.Contains(res.Error, "host process ceiling") {
				t.Fatalf("the fork bomb took the whole sandbox down: %q", res.Error)
			}
			if d, err := env.Client.Get(ctxT(t, time.Minute), bomb.ID); err != nil || d.State != "running" {
				t.Fatalf("fork-bombed sandbox: %v %+v", err, d)
			}
			if out := mustOK(t, bomb, "echo alive"); out != "alive\n" {
				t.Fatalf("fork-bombed sandbox not answering: %q", out)
			}
		}
		if out := mustOK(t, bystander, "echo alive"); out != "alive\n" {
			t.Fatalf("other sandbox after a fork bomb: %q", out)
		}
	})
	t.Run("InfiniteLoopTimeout", func(t *testing.T) {
		res := run(t, sb, `while :; do :; done`, client.ExecOptions{Timeout: 2 * time.Second})
		expect(t, res, "timeout", "--timeout")
		stillServing(t)
	})
	t.Run("DiskFiller", func(t *testing.T) {
		res := run(t, sb, `dd if=/dev/zero of=/home/user/fill bs=1M count=200`, client.ExecOptions{Timeout: time.Minute})
		expect(t, res, "disk limit", "64 MiB", "--disk")
		run(t, sb, "rm -f /home/user/fill", client.ExecOptions{})
		stillServing(t)
	})
	t.Run("DiskBeyondMemory", func(t *testing.T) { testDiskBeyondMemory(t, env, bystander) })
	t.Run("OutputFlood", func(t *testing.T) {
		res := run(t, sb, `head -c 30000000 /dev/zero | tr '\0' 'a'`, client.ExecOptions{Timeout: time.Minute})
		if len(res.Stdout) > 11<<20 || len(res.Stdout) < 9<<20 {
			t.Fatalf("output flood: got %d bytes of stdout, want about 10 MiB", len(res.Stdout))
		}
		if !strings.Contains(res.Stderr+res.Error, "output truncated at 10 MiB") {
			t.Fatalf("no truncation marker: error %q, stderr tail %q", res.Error, tailStr(res.Stderr, 200))
		}
		stillServing(t)
	})
}

// mapShared is a python3 program that maps the file argv[1] shared and
// read-only, touches every page and sleeps argv[2] seconds.
const mapShared = `python3 -c "
import mmap, sys, time
f = open(sys.argv[1], 'rb')
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
for i in range(0, len(m), 4096): m[i]
print('mapped', flush=True)
time.sleep(float(sys.argv[2]))
"`

// testSharedMappings: the memory limit holds what the sandbox is charged,
// each page once. Four processes mapping one 120 MB file (the libraries of
// a desktop session, in small) cost the sandbox 120 MB, not 480 MB: under
// a 256 MiB limit they live. (Summing gVisor's statm, which reports no
// shared pages, killed them.) A hog beside such mappings, run as root and
// trying first to hide from the count — leaving the commands' cgroup for
// the root or a cgroup of its own, mounting a tmpfs with a memory.current
// of 0 over /sys/fs/cgroup — is still killed, with the named reason.
func testSharedMappings(t *testing.T, env *daemontest.Env) {
	sb := create(t, env, client.CreateRequest{MemoryMB: 256, DiskSizeMB: 1024})
	mustOK(t, sb, "dd if=/dev/zero of=/home/user/shared bs=1M count=120 status=none && chmod 644 /home/user/shared")
	res := run(t, sb, `for i in 1 2 3 4; do `+mapShared+` /home/user/shared 5 & done; wait; echo done`, client.ExecOptions{Timeout: time.Minute})
	if res.ExitCode != 0 || strings.Count(res.Stdout, "mapped") != 4 || !strings.Contains(res.Stdout, "done") {
		t.Fatalf("4 processes mapping one 120 MB file under a 256 MiB limit: exit %d, error %q, stdout %q, stderr %q", res.ExitCode, res.Error, res.Stdout, tailStr(res.Stderr, 300))
	}

	// The hog's own shell moves itself (and so the hog) out of the
	// commands' cgroup; gVisor lets root do that.
	const hide = `mkdir -p /sys/fs/cgroup/mine 2>/dev/null; echo $$ > /sys/fs/cgroup/mine/cgroup.procs 2>/dev/null && echo moved;
		mount -t tmpfs none /sys/fs/cgroup 2>/dev/null && echo 0 > /sys/fs/cgroup/memory.current && echo mounted; `
	res = run(t, sb, hide+`(`+mapShared+` /home/user/shared 60 &) ; sleep 1; python3 -c "
chunks = []
while True:
    chunks.append(bytearray(b'x' * (16 << 20)))
"`, client.ExecOptions{Timeout: time.Minute, User: "root"})
	t.Logf("the hog's attempts to hide: %q", res.Stdout)
	if !strings.Contains(res.Error, "memory limit") || !strings.Contains(res.Error, "256 MiB") || !strings.Contains(res.Error, "--memory") || res.ExitCode == 0 {
		t.Fatalf("a hog hiding from the memory count: exit %d, error %q, stderr %q", res.ExitCode, res.Error, tailStr(res.Stderr, 300))
	}
	if d, err := env.Client.Get(ctxT(t, time.Minute), sb.ID); err != nil || d.State != "running" {
		t.Fatalf("after the hog the sandbox is not running: %v %+v", err, d)
	}
	if out := mustOK(t, sb, "echo alive"); out != "alive\n" {
		t.Fatalf("sandbox after the hog: %q", out)
	}
}

// testDiskBeyondMemory is the attack of a disk limit above the memory limit:
// a sandbox with 256 MiB of memory (host ceilings 576 MiB gVisor, 384 MiB
// namespaces) and 1 GiB of disk writes 700 MB, then fills the disk, then
// uploads past the limit. A writable layer that is RAM charged to the
// sandbox's memory cgroup takes the whole sandbox down on the first write;
// a disk-backed one takes the 700 MB, refuses the rest with ENOSPC named
// as the disk limit (exec) and a 507 naming it (upload), and the sandbox
// and its other processes carry on.
func testDiskBeyondMemory(t *testing.T, env *daemontest.Env, bystander *client.SandboxConn) {
	sb := create(t, env, client.CreateRequest{MemoryMB: 256, DiskSizeMB: 1024})
	pid := strings.TrimSpace(mustOK(t, sb, "nohup sleep 3600 >/dev/null 2>&1 & echo $!"))
	alive := func(t *testing.T, what string) {
		t.Helper()
		if d, err := env.Client.Get(ctxT(t, time.Minute), sb.ID); err != nil || d.State != "running" {
			t.Fatalf("after %s the sandbox is not running: %v %+v", what, err, d)
		}
		if out := mustOK(t, sb, "kill -0 "+pid+" && echo alive"); out != "alive\n" {
			t.Fatalf("after %s the sandbox's background process %s is gone: %q", what, pid, out)
		}
		if out := mustOK(t, bystander, "echo alive"); out != "alive\n" {
			t.Fatalf("after %s another sandbox: %q", what, out)
		}
	}

	// More than the memory ceiling, less than the disk: it fits.
	res := run(t, sb, `dd if=/dev/zero of=/home/user/big bs=1M count=700`, client.ExecOptions{Timeout: 90 * time.Second})
	if res.ExitCode != 0 {
		t.Fatalf("writing 700 MB into a 1 GiB disk with 256 MiB of memory: exit %d, error %q, output %q", res.ExitCode, res.Error, res.Stdout+res.Stderr)
	}
	alive(t, "a 700 MB write")

	// Past the disk: ENOSPC, named.
	res = run(t, sb, `dd if=/dev/zero of=/home/user/more bs=1M count=600`, client.ExecOptions{Timeout: 90 * time.Second})
	if !strings.Contains(res.Stderr, "No space left on device") {
		t.Fatalf("writing past the disk limit: stderr %q does not say ENOSPC (exit %d, error %q)", tailStr(res.Stderr, 300), res.ExitCode, res.Error)
	}
	for _, w := range []string{"disk limit", "1 GiB", "--disk"} {
		if !strings.Contains(res.Error, w) {
			t.Fatalf("result error %q does not name %q (exit %d)", res.Error, w, res.ExitCode)
		}
	}
	mustOK(t, sb, "rm -f /home/user/more")
	alive(t, "a write past the disk limit")

	// /tmp is the sandbox's disk too, not its memory (runsc would put a
	// tmpfs there): the same write there is refused the same way, and the
	// sandbox lives.
	res = run(t, sb, `dd if=/dev/zero of=/tmp/more bs=1M count=600`, client.ExecOptions{Timeout: 90 * time.Second})
	if !strings.Contains(res.Stderr, "No space left on device") {
		t.Fatalf("writing past the disk limit in /tmp: stderr %q does not say ENOSPC (exit %d, error %q)", tailStr(res.Stderr, 300), res.ExitCode, res.Error)
	}
	mustOK(t, sb, "rm -f /tmp/more")
	alive(t, "a write past the disk limit in /tmp")

	// An upload past the disk, through the daemon's API: 507 in E2B's shape.
	err := sb.WriteFile(ctxT(t, 3*time.Minute), "/home/user/upload", "", io.LimitReader(zeros{}, 500<<20))
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusInsufficientStorage {
		t.Fatalf("upload past the disk limit: want a 507, got %v", err)
	}
	var body struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(ae.Message), &body); err != nil || body.Code != http.StatusInsufficientStorage {
		t.Fatalf("upload past the disk limit: body %q is not E2B's {code, message} (%v)", ae.Message, err)
	}
	for _, w := range []string{"disk limit 1024 MiB reached", "--disk", "diskSizeMB"} {
		if !strings.Contains(body.Message, w) {
			t.Fatalf("upload past the disk limit: message %q does not name %q", body.Message, w)
		}
	}
	alive(t, "an upload past the disk limit")
	if out := mustOK(t, sb, "rm -f /home/user/upload /home/user/big && echo ok"); out != "ok\n" {
		t.Fatalf("free the disk: %q", out)
	}
}

// zeros is an endless reader of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func tailStr(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// leftovers lists what the host still holds of a sandbox.
func leftovers(t *testing.T, env *daemontest.Env, id string) []string {
	t.Helper()
	var out []string
	ids, err := env.Daemon.Runtime.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ids {
		if c == id {
			out = append(out, "container "+id)
		}
	}
	mounts, err := rootfs.FindMounts(filepath.Join(env.DataDir, "sandboxes", id))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		out = append(out, "mount "+m)
	}
	// The kernel detaches a freed loop device shortly after the unmount.
	loops := diskimage.Loops(filepath.Join(env.DataDir, "sandboxes", id))
	if len(out) == 0 {
		loops = diskimage.WaitLoopsGone(filepath.Join(env.DataDir, "sandboxes", id), 10*time.Second)
	}
	for _, l := range loops {
		out = append(out, "loop device "+l.Device+" on "+l.BackingFile)
	}
	cgs, err := cgroup.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cgs {
		if c == id {
			out = append(out, "cgroup "+c)
		}
	}
	if _, err := os.Stat(filepath.Join(env.DataDir, "sandboxes", id)); err == nil {
		out = append(out, "dir "+id)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), id) {
			out = append(out, "process "+filepath.Base(filepath.Dir(p))+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

func testCleanupAfterKill(t *testing.T, env *daemontest.Env) {
	ctx := ctxT(t, 2*time.Minute)
	sb, err := env.Client.Create(ctx, client.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := env.Client.Sandbox(ctx, sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	// A background process that would outlive a sloppy kill.
	run(t, conn, "nohup sleep 1000 >/dev/null 2>&1 &", client.ExecOptions{Timeout: 10 * time.Second})
	if l := leftovers(t, env, sb.SandboxID); !slices.ContainsFunc(l, func(s string) bool { return strings.HasPrefix(s, "loop device ") }) {
		t.Fatalf("leftovers() finds no loop device for a running sandbox: the check itself is broken (%v)", l)
	}
	if err := env.Client.Kill(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	if l := leftovers(t, env, sb.SandboxID); len(l) > 0 {
		t.Fatalf("after kill the host still holds: %v", l)
	}
}

func testCleanupAfterStop(t *testing.T, env *daemontest.Env) {
	// A second daemon on its own data dir, stopped with sandboxes running.
	env2 := daemontest.Start(t, env.Daemon.Runtime.Name(), daemontest.Options{})
	ctx := ctxT(t, 2*time.Minute)
	var ids []string
	for i := 0; i < 2; i++ {
		sb, err := env2.Client.Create(ctx, client.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.SandboxID)
	}
	env2.Close()
	for _, id := range ids {
		if l := leftovers(t, env2, id); len(l) > 0 {
			t.Fatalf("after daemon stop the host still holds: %v", l)
		}
	}
}
