// Package ocitest holds the fixtures of runtimetest.Suite and of the
// gvisor and crun tests: a sandbox directory with a real root filesystem
// (the built "base" template through an overlay when it exists, else
// read-only binds of the host's /usr and /etc), a unix socket in RunDir
// that the container's PID 1 reports to, and leak checks after Destroy.
package ocitest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/cgroup"
	"github.com/cella-sandbox/cella/internal/rootfs"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/oci"
	"github.com/cella-sandbox/cella/internal/template"
)

// SocketName is the socket PID 1 reports to, in RunDir.
const SocketName = "t.sock"

// Fixture is one sandbox's host side.
type Fixture struct {
	Dir      string // 0755, traversable by a user-namespaced root
	Spec     runtime.Spec
	Template *template.Template // nil: host-paths rootfs
	Layer    *rootfs.Layer      // nil: host-paths rootfs
	ln       *net.UnixListener
}

// NeedRoot skips the test unless it runs as root.
func NeedRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

// CleanupRuntime removes, when the test ends, what a runtime under test
// still holds in its state dir root, and the dir: containers left in it
// and mounts left under it are errors of the test (Destroy should have
// removed them).
func CleanupRuntime(t *testing.T, rt runtime.Runtime, root string) {
	t.Cleanup(func() {
		ids, _ := rt.List(context.Background())
		for _, id := range ids {
			t.Errorf("container %s left in %s's state", id, rt.Name())
			_ = rt.Destroy(context.Background(), id)
		}
		rt.Close()
		if m, err := rootfs.FindMounts(root); err != nil || len(m) > 0 {
			t.Errorf("mounts left under %s's state dir: %v %v", rt.Name(), m, err)
		}
		os.RemoveAll(root)
	})
}

// BaseTemplate returns the built "base" template from $CELLA_TEMPLATE_CACHE
// (default /var/cache/cella), or nil.
func BaseTemplate(t *testing.T) *template.Template {
	dir := os.Getenv("CELLA_TEMPLATE_CACHE")
	if dir == "" {
		dir = template.DefaultCacheDir
	}
	s, err := template.NewStore(dir)
	if err != nil {
		return nil
	}
	tpl, err := s.Get(template.BaseName)
	if err != nil {
		return nil
	}
	return tpl
}

// New prepares a sandbox directory for container id. With useTemplate and a
// built base template, the rootfs is an overlay on it; otherwise it is the
// host-paths rootfs. PID 1 runs script with /bin/sh.
func New(t *testing.T, id string, useTemplate bool, script string) *Fixture {
	t.Helper()
	dir, err := os.MkdirTemp("", "cella-rt-"+id+"-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f := &Fixture{Dir: dir}
	t.Cleanup(func() {
		if f.ln != nil {
			f.ln.Close()
		}
		if err := rootfs.UnmountAll(dir); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
		os.RemoveAll(dir)
	})
	bundle := filepath.Join(dir, "bundle")
	run := filepath.Join(dir, "run")
	for _, d := range []string{bundle, run} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	f.Spec = runtime.Spec{
		ID:          id,
		BundleDir:   bundle,
		AgentBinary: "/usr/bin/true", // stand-in: the test's PID 1 is /bin/sh
		Args:        []string{"/bin/sh", "-c", script},
		Env:         []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"},
		RunDir:      run,
		Hostname:    "sbx-" + id,
		LogPath:     filepath.Join(dir, "container.log"),
		Limits:      runtime.Limits{CPUs: 1, MemoryBytes: 512 << 20, Pids: 256},
	}
	if useTemplate {
		f.Template = BaseTemplate(t)
	}
	if f.Template != nil {
		l, err := rootfs.Mount(f.Template.RootFS, filepath.Join(dir, "sbx"), 64<<20)
		if err != nil {
			t.Fatal(err)
		}
		f.Layer = l
		f.Spec.RootFS = l.Root
	} else {
		if strings.Contains(script, "python3") {
			if _, err := os.Stat("/usr/bin/python3"); err != nil {
				t.Skip("host-paths rootfs needs the host's /usr/bin/python3")
			}
		}
		f.Spec.RootFS = filepath.Join(dir, "rootfs")
		mounts, err := oci.HostPathsRootfs(f.Spec.RootFS)
		if err != nil {
			t.Fatal(err)
		}
		f.Spec.Mounts = mounts
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(run, SocketName), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	f.ln = ln
	return f
}

// Report is what ReportScript sends.
type Report struct {
	UIDMap     []string `json:"uid_map"`
	Seccomp    string   `json:"Seccomp"`
	NoNewPrivs string   `json:"NoNewPrivs"`
	CapEff     string   `json:"CapEff"`
	Hostname   string   `json:"hostname"`
	NetDevs    []string `json:"netdevs"`
	Unshare    string   `json:"unshare"`
	UserWrite  string   `json:"user_write"`
	PID        int      `json:"pid"`
	PPID       int      `json:"ppid"`
	// RunMounted says whether /run is a mount point; RunRename is what
	// renaming /run to /run.moved gave ("renamed", then put back, or the
	// error), as the container's root.
	RunMounted bool     `json:"run_mounted"`
	RunRename  string   `json:"run_rename"`
	RunEntries []string `json:"run_entries"`
}

// ReportScript is a PID 1 script that inspects its sandbox with python3,
// reports to the socket, then stays up.
const ReportScript = `python3 - <<'EOF'
import ctypes, json, os, socket
r = {}
r['uid_map'] = open('/proc/self/uid_map').read().split()
for l in open('/proc/self/status').read().splitlines():
    k, _, v = l.partition(':')
    if k in ('Seccomp', 'NoNewPrivs', 'CapEff'):
        r[k] = v.strip()
r['hostname'] = socket.gethostname()
r['netdevs'] = [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.unshare(0x10000000)  # CLONE_NEWUSER
r['unshare'] = 'ok' if rc == 0 else os.strerror(ctypes.get_errno())
pid = os.fork()
if pid == 0:
    try:
        os.setgroups([]); os.setgid(1000); os.setuid(1000)
        with open('/home/user/written-by-user', 'w') as f:
            f.write('x')
        os._exit(0)
    except BaseException as e:
        print('user write:', e, flush=True)
        os._exit(1)
_, st = os.waitpid(pid, 0)
r['user_write'] = 'ok' if st == 0 else 'failed'
r['pid'] = os.getpid(); r['ppid'] = os.getppid()
r['run_mounted'] = any(l.split()[4] == '/run' for l in open('/proc/self/mountinfo'))
try:
    os.rename('/run', '/run.moved')
    os.rename('/run.moved', '/run')
    r['run_rename'] = 'renamed'
except OSError as e:
    r['run_rename'] = e.strerror
r['run_entries'] = sorted(os.listdir('/run'))
s = socket.socket(socket.AF_UNIX)
s.connect('/run/cella/t.sock')
s.sendall(json.dumps(r).encode() + b'\n')
s.close()
EOF
exec sleep 1000`

// Accept waits for PID 1's report.
func (f *Fixture) Accept(t *testing.T, timeout time.Duration) Report {
	t.Helper()
	_ = f.ln.SetDeadline(time.Now().Add(timeout))
	c, err := f.ln.Accept()
	if err != nil {
		log, _ := os.ReadFile(f.Spec.LogPath)
		t.Fatalf("no connection from the container: %v\ncontainer log:\n%s", err, log)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		t.Fatalf("read report: %v", err)
	}
	var r Report
	if err := json.Unmarshal(line, &r); err != nil {
		t.Fatalf("parse report %q: %v", line, err)
	}
	return r
}

// AssertGone fails the test if anything of container id (or of ids
// starting with id) is left: a process in its cgroups or naming it on its
// command line, a cgroup dir, a mount under any of mountPrefixes, or an
// entry in rt's List.
func AssertGone(t *testing.T, rt runtime.Runtime, id string, mountPrefixes ...string) {
	t.Helper()
	// id may be a prefix (probe ids end in a random part).
	cgs, err := cgroup.List()
	if err != nil {
		t.Errorf("cgroup.List: %v", err)
	}
	for _, c := range cgs {
		if strings.HasPrefix(c, id) {
			t.Errorf("cgroup dir left: %s", c)
		}
	}
	// A runtime's helper process may still be exiting (crun's child of a
	// failed start): what is left is what is still there after a while.
	deadline := time.Now().Add(10 * time.Second)
	for left := processesOf(id); len(left) > 0; left = processesOf(id) {
		if time.Now().After(deadline) {
			for _, p := range left {
				t.Errorf("process left: %s", p)
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, pre := range mountPrefixes {
		if m, err := rootfs.FindMounts(pre); err != nil || len(m) > 0 {
			t.Errorf("mounts left under %s: %v %v", pre, m, err)
		}
	}
	ids, err := rt.List(t.Context())
	if err != nil {
		t.Errorf("List: %v", err)
	}
	for _, x := range ids {
		if strings.HasPrefix(x, id) {
			t.Errorf("%s still listed", x)
		}
	}
	if _, err := rt.State(t.Context(), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("State after Destroy: %v, want ErrNotFound", err)
	}
}

// processesOf lists the live processes in container id's cgroups or naming
// it on their command line (zombies have none: they are gone but for their
// exit status).
func processesOf(id string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	self := filepath.Join("/proc", strconv.Itoa(os.Getpid()))
	for _, p := range procs {
		if p == self {
			continue
		}
		cg, _ := os.ReadFile(filepath.Join(p, "cgroup"))
		cmd, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		if strings.Contains(string(cg), "/"+cgroup.Parent+"/"+id) || strings.Contains(string(cmd), id) {
			out = append(out, fmt.Sprintf("%s %q", p, strings.ReplaceAll(string(cmd), "\x00", " ")))
		}
	}
	return out
}

// ConnectScript is a PID 1 script that only connects to the socket (to
// time Start to first contact), then stays up.
const ConnectScript = `python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.connect("/run/cella/t.sock"); s.sendall(b"{}\n")'; exec sleep 1000`

// Stats summarizes durations.
func Stats(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return "n=0"
	}
	r := func(d time.Duration) string { return d.Round(100 * time.Microsecond).String() }
	return fmt.Sprintf("n=%d min %s / median %s / max %s", len(s), r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]))
}

// Latency starts n containers one after another on rt (base template if
// built), and reports Start's duration (until PID 1 runs) and the time
// until PID 1's python3 connects to the socket, destroying each.
func Latency(t *testing.T, rt runtime.Runtime, prefix string, n int) {
	var starts, connects, destroys []time.Duration
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		f := New(t, id, true, ConnectScript)
		t0 := time.Now()
		if err := rt.Start(t.Context(), f.Spec); err != nil {
			t.Fatal(err)
		}
		starts = append(starts, time.Since(t0))
		f.Accept(t, 30*time.Second)
		connects = append(connects, time.Since(t0))
		t1 := time.Now()
		if err := rt.Destroy(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		destroys = append(destroys, time.Since(t1))
	}
	t.Logf("%s Start (PID 1 running):   %s", rt.Name(), Stats(starts))
	t.Logf("%s Start to socket contact: %s", rt.Name(), Stats(connects))
	t.Logf("%s Destroy:                 %s", rt.Name(), Stats(destroys))
}
