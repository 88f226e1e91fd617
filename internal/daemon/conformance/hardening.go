package conformance

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
)

// testFilesActAsUser: uid 1000 plants symlinks from its home to root's
// files, then goes through the files API as the default user. The agent
// (root) must resolve them as uid 1000 would: the writes and reads are
// refused with 403, /etc/passwd stays root's and unchanged, and the next
// command still runs as uid 1000. (Before, a write chowned /etc/passwd to
// uid 1000, which made the next exec run as uid 0 under gVisor.)
func testFilesActAsUser(t *testing.T, sb *client.SandboxConn) {
	ctx := ctxT(t, 2*time.Minute)
	const fingerprint = "stat -c '%u:%g %a' /etc/passwd /etc/shadow; sha256sum /etc/passwd /etc/shadow"
	before := run(t, sb, fingerprint, client.ExecOptions{User: "root"}).Stdout
	run(t, sb, "echo s3cret > /root/secret && chmod 600 /root/secret", client.ExecOptions{User: "root"})
	mustOK(t, sb, "ln -sf /etc/passwd ~/out.txt && ln -sf /etc/shadow ~/shadow && ln -sfn /root ~/rootdir && id -u")

	forbidden := func(what string, err error) {
		t.Helper()
		var apiErr *client.APIError
		if !errors.As(err, &apiErr) || apiErr.Status != 403 || !strings.Contains(apiErr.Message, "permission denied") {
			t.Fatalf("%s: want a 403 permission error, got %v", what, err)
		}
	}
	for _, p := range []string{"/home/user/out.txt", "/etc/passwd", "/home/user/rootdir/planted"} {
		forbidden("write "+p, sb.WriteFile(ctx, p, "", strings.NewReader("pwned::0:0::/:/bin/sh\n")))
	}
	for _, p := range []string{"/home/user/shadow", "/home/user/rootdir/secret", "/etc/shadow"} {
		r, err := sb.ReadFile(ctx, p, "")
		if err == nil {
			b, _ := io.ReadAll(r)
			r.Close()
			t.Fatalf("read %s as the default user: got %q", p, b)
		}
		forbidden("read "+p, err)
	}
	if _, err := sb.ListDir(ctx, "/home/user/rootdir", 1); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("list root's home through a link: want permission_denied, got %v", err)
	}

	if after := run(t, sb, fingerprint, client.ExecOptions{User: "root"}).Stdout; after != before || !strings.HasPrefix(after, "0:0 644\n") {
		t.Fatalf("/etc/passwd or /etc/shadow changed:\nbefore %q\nafter  %q", before, after)
	}
	if out := mustOK(t, sb, "id -u; test -e /root/planted || echo not-planted"); out != "1000\nnot-planted\n" {
		t.Fatalf("after the attack an ordinary command runs as %q, want uid 1000", out)
	}
	// The user's own files still go through, owned by the user.
	if err := sb.WriteFile(ctx, "/home/user/own/a.txt", "", strings.NewReader("mine")); err != nil {
		t.Fatal(err)
	}
	if out := mustOK(t, sb, "stat -c '%u %U' ~/own ~/own/a.txt; cat ~/own/a.txt"); out != "1000 user\n1000 user\nmine" {
		t.Fatalf("own upload: %q", out)
	}
}

// testNoIOUring: io_uring_setup/enter/register fail with EPERM or ENOSYS,
// as under Docker's default profile (io_uring reaches kernel code that
// seccomp cannot see into). enter and register get a bad fd, so an allowed
// call would answer EBADF.
func testNoIOUring(t *testing.T, sb *client.SandboxConn) {
	const py = `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
for nr, args in ((425, (8, params)), (426, (-1, 0, 0, 0, 0, 0)), (427, (-1, 0, 0, 0))):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *args)
    print(nr, r, os.strerror(ctypes.get_errno()) if r < 0 else "")
`
	want := map[string]bool{"Operation not permitted": true, "Function not implemented": true}
	for _, user := range []string{"", "root"} {
		res := run(t, sb, "python3 -c '"+py+"'", client.ExecOptions{User: user})
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		if res.ExitCode != 0 || len(lines) != 3 {
			t.Fatalf("io_uring probe as %q: exit %d, %q %q", user, res.ExitCode, res.Stdout, res.Stderr)
		}
		for _, l := range lines {
			f := strings.SplitN(l, " ", 3)
			if len(f) != 3 || f[1] != "-1" || !want[f[2]] {
				t.Fatalf("io_uring syscall as %q: %q, want -1 with EPERM or ENOSYS", user, l)
			}
		}
	}
}

// testOwnSysfs: /sys shows the sandbox's own network interfaces and none
// of the host's block devices (loop devices name the host's volume images
// in loop/backing_file).
func testOwnSysfs(t *testing.T, sb *client.SandboxConn) {
	out := mustOK(t, sb, "ls /sys/class/net 2>/dev/null; true")
	for _, name := range strings.Fields(out) {
		if name != "lo" && name != "eth0" {
			t.Fatalf("/sys/class/net lists %q (all: %q): the host's interfaces, not the sandbox's", name, out)
		}
	}
	host, _ := os.ReadDir("/sys/block")
	if len(host) == 0 {
		t.Fatal("the host has no /sys/block entries: the check below would prove nothing")
	}
	out = mustOK(t, sb, "for d in /sys/block /sys/class/block /sys/dev/block /sys/devices/virtual/block; do ls -A $d 2>/dev/null; done; cat /sys/block/*/loop/backing_file 2>/dev/null; true")
	for _, e := range host {
		for _, f := range strings.Fields(out) {
			if f == e.Name() {
				t.Fatalf("the sandbox sees the host's block device %s:\n%s", e.Name(), out)
			}
		}
	}
	if strings.Contains(out, "/") {
		t.Fatalf("the sandbox sees a loop device's backing file:\n%s", out)
	}
}

// testMountinfoNoHostPaths: no host path (the data dir with the sandbox's
// own directory, the template cache) appears in the sandbox's mountinfo,
// neither as a mount's root nor in its options.
func testMountinfoNoHostPaths(t *testing.T, env *daemontest.Env, sb *client.SandboxConn) {
	out := run(t, sb, "cat /proc/self/mountinfo /proc/1/mountinfo", client.ExecOptions{User: "root"}).Stdout
	if !strings.Contains(out, " /proc ") {
		t.Fatalf("no mountinfo read: %q", out)
	}
	sandboxDir := filepath.Join(env.DataDir, "sandboxes", sb.ID)
	for _, p := range []string{sandboxDir, env.DataDir, daemontest.CacheDir(), "/var/lib/cella"} {
		if strings.Contains(out, p) {
			t.Fatalf("mountinfo shows the host path %s:\n%s", p, out)
		}
	}
}
