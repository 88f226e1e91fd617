package conformance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
)

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// agentInside is the SHA-256 of the agent binary a sandbox sees at
// /.cella/cella.
func agentInside(t *testing.T, sb *client.SandboxConn) string {
	t.Helper()
	out := mustOK(t, sb, "sha256sum < /.cella/cella")
	return strings.TrimSuffix(strings.TrimSpace(out), "  -")
}

// storedAgents lists the agent binaries a data dir holds on disk and on
// its tmpfs.
func storedAgents(t *testing.T, dir string) (disk, mem []string) {
	t.Helper()
	for _, d := range []struct {
		name string
		out  *[]string
	}{{"agent-binaries", &disk}, {"agent", &mem}} {
		entries, err := os.ReadDir(filepath.Join(dir, d.name))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			*d.out = append(*d.out, e.Name())
		}
		slices.Sort(*d.out)
	}
	return disk, mem
}

// testAgentUpgrade: the daemon is restarted with another agent binary (an
// upgrade). A sandbox paused with its memory (a checkpoint under gVisor, a
// frozen container under crun) resumes with the agent it was paused with
// and answers, its processes going on; one paused without memory boots the
// new agent, as does a new sandbox; under gVisor a memory snapshot taken
// before the upgrade restores with its own agent too. The old binary stays
// while anything runs it and goes after.
func testAgentUpgrade(t *testing.T, env *daemontest.Env) {
	dir, err := os.MkdirTemp("", "cella-test-agent-upgrade-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	rtName := env.Daemon.Runtime.Name()
	agentA := daemontest.Agent(t)
	// Another build of the agent: the same program with bytes after its
	// end (which the ELF loader never maps), so its hash differs.
	agentB := append(bytes.Clone(agentA), "\ncella conformance: agent B\n"...)
	hashA, hashB := sha256Hex(agentA), sha256Hex(agentB)

	env1 := daemontest.Start(t, rtName, daemontest.Options{DataDir: dir, Agent: agentA})
	memory := env1.Daemon.Runtime.Capabilities().MemoryCheckpoint
	ctx := ctxT(t, 5*time.Minute)
	kept := create(t, env1, client.CreateRequest{})
	stopped := create(t, env1, client.CreateRequest{})
	if got := agentInside(t, kept); got != hashA {
		t.Fatalf("a sandbox of the first daemon runs agent %s, want A %s", got, hashA)
	}
	startCounter(t, kept)
	n := waitCountAbove(t, kept, 1)
	snapshot := ""
	if memory {
		sn, err := env1.Client.Snapshot(ctx, kept.ID, "before-upgrade")
		if err != nil {
			t.Fatal(err)
		}
		snapshot = sn.SnapshotID
	}
	if err := env1.Client.Pause(ctx, kept.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := env1.Client.Pause(ctx, stopped.ID, false); err != nil {
		t.Fatal(err)
	}
	env1.Close() // a graceful stop keeps paused sandboxes

	env2 := daemontest.Start(t, rtName, daemontest.Options{DataDir: dir, Agent: agentB})
	for _, id := range []string{kept.ID, stopped.ID} {
		t.Cleanup(func() { _ = env2.Client.Kill(context.Background(), id) })
	}
	if disk, _ := storedAgents(t, dir); !slices.Equal(disk, sorted(hashA, hashB)) {
		t.Fatalf("agent binaries after the upgrade: %v, want A and B (a paused sandbox runs A)", disk)
	}
	kept2 := resume(t, env2, kept.ID)
	if got := agentInside(t, kept2); got != hashA {
		t.Fatalf("the resumed sandbox binds agent %s, want the one it was paused with (A %s)", got, hashA)
	}
	if c := readCount(t, kept2); c < n {
		t.Fatalf("counter went back from %d to %d", n, c)
	}
	waitCountAbove(t, kept2, readCount(t, kept2))

	if got := agentInside(t, resume(t, env2, stopped.ID)); got != hashB {
		t.Fatalf("a sandbox cold-booted after the upgrade runs agent %s, want B %s", got, hashB)
	}
	if got := agentInside(t, create(t, env2, client.CreateRequest{})); got != hashB {
		t.Fatalf("a new sandbox runs agent %s, want B %s", got, hashB)
	}
	if memory {
		restored := create(t, env2, client.CreateRequest{TemplateID: snapshot})
		if got := agentInside(t, restored); got != hashA {
			t.Fatalf("a sandbox restored from a snapshot of before the upgrade binds agent %s, want A %s", got, hashA)
		}
		if c := readCount(t, restored); c < n {
			t.Fatalf("restored counter at %d, below %d", c, n)
		}
		if err := env2.Client.Kill(ctx, restored.ID); err != nil {
			t.Fatal(err)
		}
	}

	// A goes with the last sandbox and snapshot that run it.
	if err := env2.Client.Kill(ctx, kept.ID); err != nil {
		t.Fatal(err)
	}
	if memory {
		if disk, _ := storedAgents(t, dir); !slices.Contains(disk, hashA) {
			t.Fatalf("agent A was removed while a snapshot still restores with it: %v", disk)
		}
		if err := env2.Client.DeleteSnapshot(ctx, snapshot); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, time.Minute, "agent A's binary to go", func() bool {
		disk, mem := storedAgents(t, dir)
		return slices.Equal(disk, []string{hashB}) && slices.Equal(mem, []string{hashB})
	})
}

func sorted(s ...string) []string { slices.Sort(s); return s }

// resume resumes a paused sandbox through connect and attaches to it.
func resume(t *testing.T, env *daemontest.Env, id string) *client.SandboxConn {
	t.Helper()
	ctx := ctxT(t, 3*time.Minute)
	if _, resumed, err := env.Client.ConnectResumed(ctx, id); err != nil || !resumed {
		t.Fatalf("resume %s: resumed=%v err=%v", id, resumed, err)
	}
	sb, err := env.Client.Sandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// testAgentBinaryImmutable: the agent binary is one host file shared by
// every sandbox running that agent. Root in one sandbox tries to change it
// every way there is; the file on the host, and what another sandbox
// sees, stay the same.
func testAgentBinaryImmutable(t *testing.T, env *daemontest.Env) {
	attacker := create(t, env, client.CreateRequest{})
	bystander := create(t, env, client.CreateRequest{})
	want := sha256Hex(daemontest.Agent(t))
	hostFile := filepath.Join(env.DataDir, "agent", env.Daemon.Agent)
	if env.Daemon.Agent != want {
		t.Fatalf("the daemon's agent is %s, want the embedded one %s", env.Daemon.Agent, want)
	}
	mountinfo := mustOK(t, attacker, "grep ' /.cella/cella ' /proc/self/mountinfo")
	if fields := strings.Fields(mountinfo); len(fields) < 6 || !slices.Contains(strings.Split(fields[5], ","), "ro") {
		t.Fatalf("/.cella/cella is not mounted read-only: %q", mountinfo)
	}
	script := `try() { if "$@" 2>/dev/null; then echo "ALLOWED: $*"; fi; }
try sh -c 'echo x >> /.cella/cella'
try sh -c ': > /.cella/cella'
try truncate -s 0 /.cella/cella
try dd if=/bin/true of=/.cella/cella conv=notrunc status=none
try cp /bin/true /.cella/cella
try chmod 0777 /.cella/cella
try chown user /.cella/cella
try touch -d 2001-01-01 /.cella/cella
try setfattr -n user.x -v y /.cella/cella
try rm -f /.cella/cella
try mv /.cella/cella /.cella/moved
try ln -f /bin/true /.cella/cella
try sh -c 'echo x >> /proc/1/exe'
try sh -c 'mount -o remount,rw,bind /.cella/cella && echo x >> /.cella/cella'
try sh -c 'mount -o remount,rw /.cella/cella && echo x >> /.cella/cella'
try python3 -c 'import os; fd = os.open("/proc/1/exe", os.O_WRONLY); os.write(fd, b"x")'
echo done`
	out := run(t, attacker, script, client.ExecOptions{User: "root", Timeout: time.Minute})
	if strings.Contains(out.Stdout, "ALLOWED") || !strings.Contains(out.Stdout, "done") {
		t.Errorf("sandbox root changed its agent binary:\n%s%s", out.Stdout, out.Stderr)
	}
	// Covering the mount (where the runtime lets root unmount it) changes
	// only the sandbox's own view: the shared file is never reached.
	run(t, attacker, "umount -l /.cella/cella 2>/dev/null && cp /bin/true /.cella/cella", client.ExecOptions{User: "root", Timeout: time.Minute})

	b, err := os.ReadFile(hostFile)
	if err != nil {
		t.Fatal(err)
	}
	if got := sha256Hex(b); got != want {
		t.Fatalf("the agent binary on the host changed: sha256 %s, want %s", got, want)
	}
	if got := agentInside(t, bystander); got != want {
		t.Fatalf("another sandbox now sees agent %s, want %s", got, want)
	}
	if got := mustOK(t, bystander, "echo alive"); got != "alive\n" {
		t.Fatalf("the other sandbox after the attempts: %q", got)
	}
	if got := mustOK(t, create(t, env, client.CreateRequest{}), "echo new"); got != "new\n" {
		t.Fatalf("a new sandbox after the attempts: %q", got)
	}
}
