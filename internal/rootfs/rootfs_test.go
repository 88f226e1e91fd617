package rootfs

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

func lowerDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	must(t, os.MkdirAll(filepath.Join(dir, "home"), 0o755))
	must(t, os.Mkdir(filepath.Join(dir, "home/user"), 0o750))
	must(t, os.Chown(filepath.Join(dir, "home/user"), 1000, 1000))
	must(t, os.WriteFile(filepath.Join(dir, "etc/hostname"), []byte("template\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "home/user/.bashrc"), []byte("# rc\n"), 0o644))
	must(t, os.Chown(filepath.Join(dir, "home/user/.bashrc"), 1000, 1000))
	return dir
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func mounted(t *testing.T, prefix string) []string {
	t.Helper()
	m, err := FindMounts(prefix)
	must(t, err)
	return m
}

func TestMountWriteUnmount(t *testing.T) {
	needRoot(t)
	lower := lowerDir(t)
	sbx := t.TempDir()
	l, err := Mount(lower, sbx, 4<<20)
	must(t, err)
	t.Cleanup(func() { _ = UnmountAll(sbx) })

	if got := mounted(t, sbx); !slices.Equal(got, []string{filepath.Join(sbx, "layer"), filepath.Join(sbx, "rootfs")}) {
		t.Fatalf("mounts %v", got)
	}
	// Reads come from the template, writes land in the upper only.
	b, err := os.ReadFile(filepath.Join(l.Root, "etc/hostname"))
	must(t, err)
	if string(b) != "template\n" {
		t.Fatalf("read %q", b)
	}
	must(t, os.WriteFile(filepath.Join(l.Root, "etc/hostname"), []byte("sandbox\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(l.Root, "new"), []byte("x"), 0o644))
	must(t, os.Remove(filepath.Join(l.Root, "home/user/.bashrc")))
	if b, _ := os.ReadFile(filepath.Join(lower, "etc/hostname")); string(b) != "template\n" {
		t.Fatalf("template changed: %q", b)
	}
	if _, err := os.Stat(filepath.Join(lower, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("new file leaked into the template")
	}
	if _, err := os.Stat(filepath.Join(lower, "home/user/.bashrc")); err != nil {
		t.Fatal("delete reached the template")
	}
	if b, _ := os.ReadFile(filepath.Join(l.Upper, "etc/hostname")); string(b) != "sandbox\n" {
		t.Fatalf("upper has %q", b)
	}
	// The merged root keeps the template root's mode.
	st, err := os.Stat(l.Root)
	must(t, err)
	if st.Mode().Perm() != 0o700 && st.Mode().Perm() != 0o755 { // t.TempDir is 0700
		t.Fatalf("root mode %v", st.Mode())
	}

	used, size, err := l.Usage()
	must(t, err)
	if size != 4<<20 || used <= 0 || used > size {
		t.Fatalf("usage %d/%d", used, size)
	}

	// A second Layer view of the same dir (daemon restart) finds it.
	if _, err := Open(sbx); err != nil {
		t.Fatal(err)
	}

	must(t, l.Unmount())
	must(t, l.Unmount()) // idempotent
	if got := mounted(t, sbx); len(got) != 0 {
		t.Fatalf("still mounted: %v", got)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if bytes.Contains(mi, []byte(sbx)) {
		t.Fatalf("mountinfo still mentions %s", sbx)
	}
	if _, err := os.Stat(filepath.Join(sbx, "rootfs")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("mount point not removed")
	}
	if _, err := Open(sbx); err == nil {
		t.Fatal("Open succeeded after unmount")
	}
}

func TestDiskLimit(t *testing.T) {
	needRoot(t)
	sbx := t.TempDir()
	l, err := Mount(lowerDir(t), sbx, 2<<20)
	must(t, err)
	defer l.Unmount()
	f, err := os.Create(filepath.Join(l.Root, "fill"))
	must(t, err)
	defer f.Close()
	buf := make([]byte, 64<<10)
	var n int64
	for {
		k, err := f.Write(buf)
		n += int64(k)
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("write error %v, want ENOSPC", err)
			}
			break
		}
		if n > 8<<20 {
			t.Fatal("wrote past the disk limit")
		}
	}
	if n > 2<<20 || n < 1<<20 {
		t.Fatalf("ENOSPC after %d bytes, limit 2 MiB", n)
	}
	used, size, err := l.Usage()
	must(t, err)
	if used < size-64<<10 {
		t.Fatalf("usage %d/%d after filling", used, size)
	}
}

// Files of uid 1000 in the template stay writable for uid 1000 through the
// overlay (copy-up keeps owners).
func TestUserWritable(t *testing.T) {
	needRoot(t)
	sbx := t.TempDir()
	// uid 1000 must be able to traverse to the merged root.
	must(t, os.Chmod(sbx, 0o755))
	must(t, os.Chmod(filepath.Dir(sbx), 0o755))
	lower := lowerDir(t)
	must(t, os.Chmod(lower, 0o755))
	l, err := Mount(lower, sbx, 4<<20)
	must(t, err)
	defer l.Unmount()
	cmd := exec.Command("/bin/sh", "-c", `echo hi >> "$1/home/user/.bashrc" && echo new > "$1/home/user/new" && stat -c %u:%g "$1/home/user/new"`, "sh", l.Root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("uid 1000 cannot write its home: %v\n%s", err, out)
	}
	if strings.TrimSpace(string(out)) != "1000:1000" {
		t.Fatalf("owner %s", out)
	}
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(l.Upper, "home/user/new"), &st))
	if st.Uid != 1000 {
		t.Fatalf("upper file uid %d", st.Uid)
	}
	// But uid 1000 cannot write root-owned template dirs.
	cmd = exec.Command("/bin/sh", "-c", `echo x > "$1/etc/evil"`, "sh", l.Root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	if err := cmd.Run(); err == nil {
		t.Fatal("uid 1000 wrote /etc")
	}
}

func TestFindMountsLeaked(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	sbx := filepath.Join(base, "sbx-1")
	_, err := Mount(lowerDir(t), sbx, 2<<20)
	must(t, err)
	// "Crash": forget the Layer, then find and clean by prefix.
	got := mounted(t, base)
	if len(got) != 2 || !strings.HasPrefix(got[0], sbx) {
		t.Fatalf("FindMounts(%s) = %v", base, got)
	}
	// A sibling with a common string prefix must not match.
	if m := mounted(t, filepath.Join(base, "sbx")); len(m) != 0 {
		t.Fatalf("prefix matched a sibling: %v", m)
	}
	// Busy: hold a file open in the overlay; UnmountAll detaches lazily.
	f, err := os.Open(filepath.Join(sbx, "rootfs/etc/hostname"))
	must(t, err)
	defer f.Close()
	must(t, UnmountAll(sbx))
	if m := mounted(t, base); len(m) != 0 {
		t.Fatalf("left %v", m)
	}
}

func TestMountErrors(t *testing.T) {
	needRoot(t)
	if _, err := Mount("/nonexistent-template", t.TempDir(), 4<<20); err == nil {
		t.Fatal("missing template accepted")
	}
	if _, err := Mount(lowerDir(t), t.TempDir(), 100); err == nil {
		t.Fatal("tiny disk accepted")
	}
	if _, err := Mount(lowerDir(t), filepath.Join(t.TempDir(), "a,b"), 4<<20); err == nil {
		t.Fatal("comma in path accepted")
	}
}

func TestUnescape(t *testing.T) {
	if got := unescapeOctal(`/a\040b\134c`); got != `/a b\c` {
		t.Fatal(got)
	}
	r := strings.NewReader("1 0 0:1 / /x\\040y rw - tmpfs t rw\n2 0 0:2 / /x rw - tmpfs t rw\n3 0 0:3 / /xy rw - tmpfs t rw\n")
	got, err := parseMountInfo(r, "/x")
	must(t, err)
	if !slices.Equal(got, []string{"/x"}) {
		t.Fatal(got)
	}
}
