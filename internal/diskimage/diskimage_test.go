package diskimage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

// noLoops waits for the loop devices under prefix to go: the kernel
// detaches an AUTOCLEAR device asynchronously after its last user.
func noLoops(t *testing.T, prefix string) {
	t.Helper()
	if l := WaitLoopsGone(prefix, 10*time.Second); len(l) != 0 {
		t.Fatalf("loop devices left under %s: %+v", prefix, l)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// fill writes into dir/fill until the filesystem refuses, and returns how
// much it took.
func fill(t *testing.T, dir string) int64 {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "fill"))
	must(t, err)
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		k, err := f.Write(buf)
		n += int64(k)
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("write error %v, want ENOSPC", err)
			}
			return n
		}
		if n > 1<<30 {
			t.Fatal("no ENOSPC after 1 GiB")
		}
	}
}

// A Usable image gives a writer its size, not less (the filesystem's own
// overhead is on top) and not more than a block of rounding; the image
// itself stays sparse.
func TestFormatUsable(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	for _, size := range []int64{16 << 20, 100 << 20} {
		img := filepath.Join(dir, "usable.img")
		must(t, Format(context.Background(), img, Spec{Size: size, Usable: true, Lazy: true, BytesPerInode: 4096}))
		var st unix.Stat_t
		must(t, unix.Stat(img, &st))
		if st.Size <= size || st.Blocks*512 > 4<<20 {
			t.Fatalf("%d MiB: image of %d bytes, %d allocated: want larger than the size and sparse", size>>20, st.Size, st.Blocks*512)
		}
		mnt := filepath.Join(dir, "mnt")
		must(t, os.Mkdir(mnt, 0o755))
		must(t, Mount(img, mnt, 0, "noinit_itable"))
		n := fill(t, mnt)
		must(t, Discard(mnt, img))
		must(t, unix.Unmount(mnt, 0))
		if n < size-BlockSize || n > size+16*BlockSize {
			t.Fatalf("%d MiB usable image: ENOSPC after %d bytes", size>>20, n)
		}
		noLoops(t, dir)
		must(t, os.Remove(img))
		must(t, os.Remove(mnt))
	}
	// Not Usable: the size is the image's.
	img := filepath.Join(dir, "exact.img")
	must(t, Format(context.Background(), img, Spec{Size: 32 << 20}))
	if st, err := os.Stat(img); err != nil || st.Size() != 32<<20 {
		t.Fatalf("exact image: %v %v", st, err)
	}
	if err := Format(context.Background(), img, Spec{Size: 32 << 20}); err == nil {
		t.Fatal("Format over an existing image succeeded")
	}
}

// A clone is a separate filesystem with the original's content, as sparse
// as the original.
func TestCloneAndDetached(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src.img")
	must(t, Format(context.Background(), src, Spec{Size: 64 << 20, Lazy: true}))
	dst := filepath.Join(dir, "dst.img")
	must(t, Clone(src, dst))
	var a, b unix.Stat_t
	must(t, unix.Stat(src, &a))
	must(t, unix.Stat(dst, &b))
	if a.Size != b.Size || b.Blocks > a.Blocks+8 {
		t.Fatalf("clone: size %d/%d, blocks %d/%d", b.Size, a.Size, b.Blocks, a.Blocks)
	}
	if err := Clone(src, dst); err == nil {
		t.Fatal("Clone over an existing file succeeded")
	}

	// Mounted detached, it is nowhere until attached; then it is the clone.
	d, err := MountDetached(dst, unix.MOUNT_ATTR_NODEV, "noinit_itable")
	must(t, err)
	if l := Loops(dst); len(l) != 1 || FindLoop(dst) != l[0].Device {
		t.Fatalf("loops of the detached mount: %+v", l)
	}
	must(t, unix.Mkdirat(d.Fd(), "made-detached", 0o755))
	mnt := filepath.Join(dir, "mnt")
	must(t, os.Mkdir(mnt, 0o755))
	must(t, d.Attach(mnt))
	must(t, d.Close())
	if _, err := os.Stat(filepath.Join(mnt, "made-detached")); err != nil {
		t.Fatal(err)
	}
	must(t, unix.Unmount(mnt, 0))
	noLoops(t, dir)
	// Closed without attaching: unmounted, its loop device freed.
	d, err = MountDetached(src, 0)
	must(t, err)
	must(t, d.Close())
	noLoops(t, dir)
}

// Discard shuts down only the filesystem of the image it is given: never
// the filesystem a plain directory is on, nor another image's.
func TestDiscardOnlyItsImage(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	// A directory on the host's filesystem: nothing happens.
	plain := filepath.Join(dir, "plain")
	must(t, os.Mkdir(plain, 0o755))
	must(t, Discard(plain, filepath.Join(dir, "a.img")))
	must(t, Discard(filepath.Join(dir, "missing"), filepath.Join(dir, "a.img")))
	must(t, os.WriteFile(filepath.Join(plain, "still-writable"), []byte("x"), 0o644))

	a, b := filepath.Join(dir, "a.img"), filepath.Join(dir, "b.img")
	must(t, Format(context.Background(), a, Spec{Size: 16 << 20, Lazy: true}))
	must(t, Format(context.Background(), b, Spec{Size: 16 << 20, Lazy: true}))
	ma, mb := filepath.Join(dir, "ma"), filepath.Join(dir, "mb")
	must(t, os.Mkdir(ma, 0o755))
	must(t, os.Mkdir(mb, 0o755))
	must(t, Mount(a, ma, 0, ""))
	defer unix.Unmount(ma, unix.MNT_DETACH)
	must(t, Mount(b, mb, 0, ""))
	defer unix.Unmount(mb, unix.MNT_DETACH)
	// The wrong image for the mount: a no-op.
	must(t, Discard(ma, b))
	must(t, os.WriteFile(filepath.Join(ma, "still-writable"), []byte("x"), 0o644))
	// Its own image: shut down, later writes fail.
	must(t, Discard(ma, a))
	if err := os.WriteFile(filepath.Join(ma, "after"), []byte("x"), 0o644); err == nil {
		t.Fatal("write after Discard succeeded")
	}
	must(t, os.WriteFile(filepath.Join(mb, "other-image"), []byte("x"), 0o644))
}

// Loops lists only the loop devices of files under the prefix, and FindLoop
// ignores a device whose backing file was deleted.
func TestLoops(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	one := filepath.Join(dir, "one")
	must(t, os.Mkdir(one, 0o755))
	img := filepath.Join(one, "x.img")
	must(t, Format(context.Background(), img, Spec{Size: 16 << 20, Lazy: true}))
	d, err := MountDetached(img, 0)
	must(t, err)
	defer d.Close()
	if l := Loops(one); len(l) != 1 || l[0].BackingFile != img || l[0].Deleted {
		t.Fatalf("Loops(%s) = %+v", one, l)
	}
	if l := Loops(one + "x"); len(l) != 0 {
		t.Fatalf("a sibling prefix matched: %+v", l)
	}
	must(t, os.Remove(img))
	if l := Loops(one); len(l) != 1 || !l[0].Deleted {
		t.Fatalf("after the image's removal: %+v", l)
	}
	if FindLoop(img) != "" {
		t.Fatal("FindLoop returned the device of a deleted image")
	}
}

// A burst of concurrent mounts in one process each gets a loop device of
// its own: every caller is told the same free device, and without the
// process's lock a loser could lose every retry (make soak saw "configure
// /dev/loopN: device or resource busy").
func TestConcurrentMounts(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src.img")
	must(t, Format(context.Background(), src, Spec{Size: 16 << 20, Lazy: true}))
	const n = 32
	imgs := make([]string, n)
	for i := range imgs {
		imgs[i] = filepath.Join(dir, fmt.Sprintf("%02d.img", i))
		must(t, Clone(src, imgs[i]))
	}
	errs := make(chan error, n)
	ds := make(chan *Detached, n)
	var wg sync.WaitGroup
	for _, img := range imgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := MountDetached(img, 0)
			errs <- err
			if err == nil {
				ds <- d
			}
		}()
	}
	wg.Wait()
	close(errs)
	close(ds)
	for d := range ds {
		defer d.Close()
	}
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if l := Loops(dir); len(l) != n {
		t.Fatalf("%d loop devices for %d mounts", len(l), n)
	}
}
