package rootfs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// testUserns returns a user namespace fd mapping 0..65535 to 100000.
func testUserns(t *testing.T) int {
	t.Helper()
	idm := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 100000, Size: 65536}}
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: idm, GidMappings: idm, Ptrace: true}
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	must(t, cmd.Start())
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	must(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func TestIDMapOverlay(t *testing.T) {
	needRoot(t)
	lower := lowerDir(t)
	must(t, os.Chmod(lower, 0o755))
	sbx := t.TempDir()
	must(t, os.Chmod(sbx, 0o755))
	must(t, os.Chmod(filepath.Dir(sbx), 0o755))
	l, err := Mount(lower, sbx, 4<<20)
	must(t, err)
	defer l.Unmount()
	must(t, os.WriteFile(filepath.Join(l.Root, "before"), []byte("kept"), 0o644))

	fd := testUserns(t)
	if err := IDMapOverlay(t.TempDir(), fd, 100000); !errors.Is(err, ErrNotOverlay) {
		t.Fatalf("plain dir: %v, want ErrNotOverlay", err)
	}
	must(t, IDMapOverlay(l.Root, fd, 100000))
	if !IsIDMapped(l.Root) {
		t.Fatal("not idmapped")
	}
	// Still volatile: the sandbox's syncs do not reach the disk.
	if mi, err := findMount(l.Root); err != nil || mi == nil || !strings.Contains(mi.superOpts, "volatile") {
		t.Fatalf("the idmapped overlay lost volatile: %+v %v", mi, err)
	}
	must(t, IDMapOverlay(l.Root, fd, 100000)) // no-op
	if m := mounted(t, sbx); len(m) != 2 {
		t.Fatalf("mounts after remount: %v", m)
	}
	// Earlier writes survive (same upper); owners appear shifted on the host.
	if b, _ := os.ReadFile(filepath.Join(l.Root, "before")); string(b) != "kept" {
		t.Fatalf("upper lost: %q", b)
	}
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(l.Root, "home/user"), &st))
	if st.Uid != 101000 {
		t.Fatalf("home/user appears as uid %d on the host, want 101000", st.Uid)
	}
	// Host uid 101000 (container uid 1000) writes its home; on disk it is 1000.
	cmd := exec.Command("/bin/sh", "-c", `echo hi > "$1/home/user/new" && mkdir "$1/home/user/d"`, "sh", l.Root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 101000, Gid: 101000}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("container user cannot write: %v %s", err, out)
	}
	for _, p := range []string{"home/user/new", "home/user/d", "home/user"} {
		must(t, unix.Stat(filepath.Join(l.Upper, p), &st))
		if st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("upper %s on-disk %d:%d, want 1000:1000", p, st.Uid, st.Gid)
		}
	}
	// Container root (host 100000) writes /etc as on-disk root.
	cmd = exec.Command("/bin/sh", "-c", `echo x > "$1/etc/new"`, "sh", l.Root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 100000, Gid: 100000}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("container root cannot write /etc: %v %s", err, out)
	}
	must(t, unix.Stat(filepath.Join(l.Upper, "etc/new"), &st))
	if st.Uid != 0 {
		t.Errorf("etc/new on-disk uid %d", st.Uid)
	}
	// The template is untouched.
	if _, err := os.Stat(filepath.Join(lower, "home/user/new")); err == nil {
		t.Fatal("write reached the template")
	}
	// Usage and Unmount work as before.
	if used, _, err := l.Usage(); err != nil || used == 0 {
		t.Fatalf("usage %d %v", used, err)
	}
	must(t, l.Unmount())
	if m := mounted(t, sbx); len(m) != 0 {
		t.Fatalf("left: %v", m)
	}
	// Only this test's mounts: sandboxes of other tests running beside it
	// have idmapped overlays of their own.
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for line := range strings.Lines(string(mi)) {
		if strings.Contains(line, idmapSourcePrefix) && strings.Contains(line, sbx) {
			t.Fatalf("idmapped overlay left in mountinfo: %s", line)
		}
	}
}

func TestOnThrowawayThread(t *testing.T) {
	for range 20 {
		tid := 0
		must(t, OnThrowawayThread(func() error { tid = unix.Gettid(); return nil }))
		if tid == unix.Getpid() {
			t.Fatal("ran on the main thread")
		}
	}
}
