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
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/diskimage"
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
	// The layer is an ext4 filesystem on a loop device, under a volatile
	// overlay (the sandbox's fsyncs do not reach the disk).
	if mi, err := findMount(filepath.Join(sbx, "layer")); err != nil || mi == nil || mi.fstype != "ext4" || !strings.HasPrefix(mi.source, "/dev/loop") {
		t.Fatalf("layer mount %+v %v", mi, err)
	}
	if mi, err := findMount(l.Root); err != nil || mi == nil || !strings.Contains(mi.superOpts, "volatile") {
		t.Fatalf("overlay mount %+v %v", mi, err)
	}
	must(t, l.Sync())
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
	// The limit is the space files get: not less, and not more than a few
	// blocks of rounding.
	if n > 2<<20+64<<10 || n < 2<<20-64<<10 {
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

// Layers keeps layers ready for the sizes it is told to; a mount takes one
// (its image renamed into the sandbox dir, its loop device with it), the
// rest are unmounted and deleted at Close. A size without ready layers is
// cloned from its blank.
func TestLayersReady(t *testing.T) {
	needRoot(t)
	ls, err := NewLayers(filepath.Join(t.TempDir(), "layers"))
	must(t, err)
	closed := false
	t.Cleanup(func() {
		if !closed {
			ls.Close()
		}
	})
	const size = 8 << 20
	ls.Keep(size, 2)
	readyCount := func() int {
		ls.mu.Lock()
		defer ls.mu.Unlock()
		return len(ls.ready[size])
	}
	deadline := time.Now().Add(time.Minute)
	for readyCount() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no ready layers after a minute")
		}
		time.Sleep(5 * time.Millisecond)
	}
	lower := lowerDir(t)
	sbx := filepath.Join(t.TempDir(), "sbx")
	l, err := ls.Mount(lower, sbx, size)
	must(t, err)
	if n := readyCount(); n != 1 {
		t.Fatalf("the mount did not take a ready layer: %d left", n)
	}
	img := filepath.Join(sbx, LayerImage)
	if dev := diskimage.FindLoop(img); dev == "" {
		t.Fatalf("no loop device backs %s: %+v", img, diskimage.Loops("/"))
	}
	must(t, os.WriteFile(filepath.Join(l.Root, "etc/new"), []byte("x"), 0o644))
	if used, got, err := l.Usage(); err != nil || got != size || used <= 0 {
		t.Fatalf("usage %d/%d %v", used, got, err)
	}
	// Another size: cloned from its own blank.
	other, err := ls.Mount(lower, filepath.Join(t.TempDir(), "sbx2"), 4<<20)
	must(t, err)
	if _, got, _ := other.Usage(); got != 4<<20 {
		t.Fatalf("second size: %d", got)
	}
	must(t, other.Unmount())
	must(t, l.Unmount())
	if _, err := os.Stat(img); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("image after unmount: %v", err)
	}
	if loops := diskimage.WaitLoopsGone(sbx, 10*time.Second); len(loops) != 0 {
		t.Fatalf("loop devices after unmount: %+v", loops)
	}
	// Close releases the ready layers: no loop device, no image left but
	// the blanks.
	deadline = time.Now().Add(time.Minute)
	for readyCount() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	must(t, ls.Close())
	closed = true
	if loops := diskimage.WaitLoopsGone(ls.dir, 10*time.Second); len(loops) != 0 {
		t.Fatalf("loop devices after Close: %+v", loops)
	}
	left, _ := filepath.Glob(filepath.Join(ls.dir, "ready-*"))
	if len(left) != 0 {
		t.Fatalf("ready images after Close: %v", left)
	}
}

// A layer unmounted behind the daemon's back, as a host reboot does it, is
// mounted again by Remount with everything the sandbox wrote: files,
// deletions of template files (whiteouts), owners.
func TestRemountAfterReboot(t *testing.T) {
	needRoot(t)
	lower := lowerDir(t)
	sbx := t.TempDir()
	l, err := Mount(lower, sbx, 16<<20)
	must(t, err)
	t.Cleanup(func() { _ = UnmountAll(sbx) })
	must(t, os.WriteFile(filepath.Join(l.Root, "home/user/kept"), bytes.Repeat([]byte("k"), 1<<20), 0o600))
	must(t, os.Lchown(filepath.Join(l.Root, "home/user/kept"), 1000, 1000))
	must(t, os.Remove(filepath.Join(l.Root, "etc/hostname")))
	// Open refuses what is not mounted; Remount is not needed while it is.
	if _, err := Remount(sbx); err != nil {
		t.Fatal(err)
	}
	// The reboot: a clean unmount of both, the loop device goes with it.
	must(t, unix.Unmount(l.Root, 0))
	must(t, unix.Unmount(filepath.Join(sbx, LayerDir), 0))
	if loops := diskimage.WaitLoopsGone(sbx, 10*time.Second); len(loops) != 0 {
		t.Fatalf("loop device after the unmount: %+v", loops)
	}
	if _, err := Open(sbx); err == nil {
		t.Fatal("Open found an unmounted layer")
	}
	l2, err := Remount(sbx)
	must(t, err)
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(l2.Root, "home/user/kept"), &st))
	if st.Size != 1<<20 || st.Uid != 1000 {
		t.Fatalf("kept file after remount: size %d uid %d", st.Size, st.Uid)
	}
	if _, err := os.Stat(filepath.Join(l2.Root, "etc/hostname")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a deleted template file is back after remount: %v", err)
	}
	if used, size, err := l2.Usage(); err != nil || size != 16<<20 || used < 1<<20 {
		t.Fatalf("usage after remount %d/%d %v", used, size, err)
	}
	// Without its image there is nothing to remount.
	must(t, l2.Unmount())
	if _, err := Remount(sbx); err == nil {
		t.Fatal("Remount without an image succeeded")
	}
}
