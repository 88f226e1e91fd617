package rootfs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// manyLowers makes n layer dirs with long paths (like a layer store's
// <cache>/layers/sha256/<64 hex>/fs), each holding its own file plus a
// file all of them have (the top one must win).
func manyLowers(t *testing.T, n int) []string {
	t.Helper()
	base := t.TempDir()
	lowers := make([]string, n)
	for i := range lowers {
		d := filepath.Join(base, "sha256", fmt.Sprintf("%064x", i), "fs")
		must(t, os.MkdirAll(d, 0o755))
		must(t, os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d", i)), []byte("x"), 0o644))
		must(t, os.WriteFile(filepath.Join(d, "who"), []byte(fmt.Sprint(i)), 0o644))
		lowers[i] = d
	}
	return lowers
}

// An image's layers plus snapshots stack to overlayfs's own limit, far
// past what one mount(2) option string (a 4 KiB page) could name.
func TestMountStackManyLowers(t *testing.T) {
	needRoot(t)
	lowers := manyLowers(t, MaxLowers+1)
	if n := len(strings.Join(lowers[:MaxLowers], ":")); n < 4096*4 {
		t.Fatalf("test paths too short to show the point: %d bytes", n)
	}
	sbx := t.TempDir()
	l, err := MountStack(lowers[:MaxLowers], sbx, 4<<20)
	must(t, err)
	defer l.Unmount()
	for _, f := range []string{"f0", fmt.Sprintf("f%d", MaxLowers-1)} {
		if _, err := os.Stat(filepath.Join(l.Root, f)); err != nil {
			t.Fatalf("file of a layer missing: %v", err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(l.Root, "who")); string(b) != "0" {
		t.Fatalf("top layer does not win: %q", b)
	}
	must(t, os.WriteFile(filepath.Join(l.Root, "new"), []byte("w"), 0o644))
	l.Unmount()

	_, err = MountStack(lowers, t.TempDir(), 4<<20)
	if err == nil || !strings.Contains(err.Error(), "limit of 500") {
		t.Fatalf("%d lowers: %v", len(lowers), err)
	}

	// What the old single-string mount could hold, for comparison.
	legacy := 0
	for n := 1; n <= MaxLowers; n++ {
		opts := "lowerdir=" + strings.Join(lowers[:n], ":")
		if len(opts) > 4095 {
			break
		}
		legacy = n
	}
	t.Logf("stacked %d lowers by fd; a mount(2) option string holds %d such paths", MaxLowers, legacy)
}

// The namespaces runtime rebuilds the overlay on idmapped views of every
// lower.
func TestIDMapOverlayManyLowers(t *testing.T) {
	needRoot(t)
	lowers := manyLowers(t, 3)
	for _, l := range lowers {
		for d := l; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
			must(t, os.Chmod(d, 0o755))
		}
	}
	sbx := t.TempDir()
	must(t, os.Chmod(sbx, 0o755))
	l, err := MountStack(lowers, sbx, 4<<20)
	must(t, err)
	defer l.Unmount()
	fd := testUserns(t)
	must(t, IDMapOverlay(l.Root, fd, 100000))
	for i := range lowers {
		if _, err := os.Stat(filepath.Join(l.Root, fmt.Sprintf("f%d", i))); err != nil {
			t.Fatalf("layer %d lost by the idmapped overlay: %v", i, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(l.Root, "who")); string(b) != "0" {
		t.Fatalf("top layer does not win: %q", b)
	}
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(l.Root, "who"), &st))
	if st.Uid != 100000 {
		t.Fatalf("owner seen from the host %d, want 100000", st.Uid)
	}
}

// A read-only overlay of layers (no upper): what the template store
// reads an image's merged files through.
func TestMountOverlayReadOnly(t *testing.T) {
	needRoot(t)
	lowers := manyLowers(t, 2)
	mnt := t.TempDir()
	must(t, MountOverlay(mnt, lowers, "", "", 0))
	defer detach(mnt)
	if b, _ := os.ReadFile(filepath.Join(mnt, "who")); string(b) != "0" {
		t.Fatalf("who = %q", b)
	}
	if err := os.WriteFile(filepath.Join(mnt, "x"), nil, 0o644); err == nil {
		t.Fatal("read-only overlay is writable")
	}
}
