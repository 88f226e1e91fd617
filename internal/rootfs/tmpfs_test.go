package rootfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestEnsureTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	base := t.TempDir()
	dir := filepath.Join(base, "real", "t")
	// Reached through a symlink: the second call still finds the mount.
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	via := filepath.Join(base, "link", "t")
	t.Cleanup(func() { _ = Detach(dir) })
	for i, want := range []bool{true, false} {
		mounted, err := EnsureTmpfs(via, 1<<20, 0o700)
		if err != nil || mounted != want {
			t.Fatalf("call %d: mounted %v, %v; want %v", i+1, mounted, err, want)
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		t.Fatalf("statfs %s: %v type %x", dir, err, st.Type)
	}
	if mounts, _ := FindMounts(base); len(mounts) != 1 {
		t.Fatalf("mounts below %s: %v, want one", base, mounts)
	}
}
