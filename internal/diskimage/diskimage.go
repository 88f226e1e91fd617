// Package diskimage keeps ext4 filesystems in sparse image files on the host
// and mounts them through loop devices: a filesystem whose size is a hard
// limit (a writer gets ENOSPC when it is full, whatever the host filesystem
// is) and whose data is on disk, not in RAM. cella uses it for named volumes
// (internal/volume) and for every sandbox's writable layer (internal/rootfs).
//
// Loop devices are attached with LO_FLAGS_AUTOCLEAR, so a device goes away
// with the last unmount of its filesystem (and, if a crash stops a mount
// between attach and mount, with the last close), and with
// LO_FLAGS_DIRECT_IO, so the image's blocks are not cached a second time in
// the host's page cache: what a sandbox writes is cached once, as the
// filesystem's own (reclaimable) page cache.
package diskimage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// BlockSize is the filesystem block size of every image.
const BlockSize = 4096

// Spec says what Format makes.
type Spec struct {
	// Size is the image's size in bytes; with Usable, the space files get
	// instead: the image is grown by the filesystem's own overhead (journal,
	// inode tables, the blocks ext4 keeps back for itself) until at least
	// Size bytes are free for an unprivileged writer.
	Size   int64
	Usable bool
	// Lazy leaves the inode tables and the journal unzeroed (mke2fs
	// lazy_itable_init, lazy_journal_init): mkfs writes a few hundred KiB
	// instead of zeroing tens of MiB. The filesystem is as sound; mount it
	// with "noinit_itable" so the kernel does not zero them in the
	// background either.
	Lazy bool
	// BytesPerInode sets the inode count (mke2fs -i); 0 is mke2fs's default.
	BytesPerInode int
}

// Format makes path (created, must not exist) a sparse image holding an
// empty ext4 filesystem as spec says. On error nothing is left at path.
func Format(ctx context.Context, path string, spec Spec) error {
	if spec.Size < 1<<20 {
		return fmt.Errorf("format %s: size %d is below 1 MiB", path, spec.Size)
	}
	size := roundUp(spec.Size, BlockSize)
	// Usable: the overhead grows a little with the image, so grow until it
	// fits (twice in practice).
	for range 5 {
		if err := format(ctx, path, size, spec); err != nil {
			return err
		}
		if !spec.Usable {
			return nil
		}
		free, err := UsableBytes(path)
		if err != nil {
			os.Remove(path)
			return err
		}
		if free >= spec.Size {
			return nil
		}
		os.Remove(path)
		size = roundUp(size+spec.Size-free, BlockSize)
	}
	return fmt.Errorf("format %s: cannot fit %d usable bytes", path, spec.Size)
}

func format(ctx context.Context, path string, size int64, spec Spec) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("format %s: %w", path, err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("format %s: %w", path, err)
	}
	// -m 0: no blocks reserved for root, the whole size is the user's.
	// No resize_inode: images are never grown online, and its reserved GDT
	// blocks would only be overhead.
	args := []string{"-q", "-F", "-t", "ext4", "-b", strconv.Itoa(BlockSize), "-m", "0", "-O", "^resize_inode"}
	if spec.BytesPerInode > 0 {
		args = append(args, "-i", strconv.Itoa(spec.BytesPerInode))
	}
	if spec.Lazy {
		args = append(args, "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard")
	} else {
		args = append(args, "-E", "lazy_itable_init=0,lazy_journal_init=0")
	}
	out, err := exec.CommandContext(ctx, "mkfs.ext4", append(args, path)...).CombinedOutput()
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("format %s: mkfs.ext4: %v: %s", path, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// UsableBytes reads an unmounted image's superblock and returns the bytes an
// unprivileged writer can fill: the free blocks minus the clusters ext4
// keeps back for metadata at delayed allocation (min(2 %, 4096 clusters),
// fs/ext4/super.c ext4_calculate_resv_clusters), which statfs leaves out of
// f_bavail too.
func UsableBytes(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return 0, fmt.Errorf("read superblock of %s: %w", path, err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[0x38:]) != unix.EXT4_SUPER_MAGIC {
		return 0, fmt.Errorf("%s holds no ext4 filesystem", path)
	}
	bsize := int64(1024) << le.Uint32(sb[0x18:])
	blocks := int64(le.Uint32(sb[0x04:])) | int64(le.Uint32(sb[0x150:]))<<32
	free := int64(le.Uint32(sb[0x0c:])) | int64(le.Uint32(sb[0x158:]))<<32
	resv := min(blocks/50, 4096)
	return (free - resv) * bsize, nil
}

// Clone copies the image src to dst (created, must not exist) keeping its
// holes: a formatted empty image costs its few hundred KiB of metadata to
// copy instead of a mkfs (0.2 ms against about 4 ms here). The copies share
// the filesystem UUID, which ext4 does not mind.
func Clone(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if err := out.Truncate(st.Size()); err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	fd := int(in.Fd())
	for off := int64(0); off < st.Size(); {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("clone %s: %w", src, err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("clone %s: %w", src, err)
		}
		if _, err := io.Copy(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, hole-data)); err != nil {
			return fmt.Errorf("clone %s: %w", src, err)
		}
		off = hole
	}
	return nil
}

// Mount mounts the ext4 filesystem in img at target (which must exist),
// with the given mount flags and ext4 options. A loop device already
// backing img is used again (the same superblock: a frozen sandbox may
// still hold the filesystem after the daemon that mounted it is gone);
// otherwise a free one is attached.
func Mount(img, target string, flags uintptr, data string) error {
	if dev := FindLoop(img); dev != "" {
		if err := unix.Mount(dev, target, "ext4", flags, data); err != nil {
			return fmt.Errorf("mount %s (already on %s) at %s: %w", img, dev, target, err)
		}
		return nil
	}
	return attach(img, func(dev string) error {
		if err := unix.Mount(dev, target, "ext4", flags, data); err != nil {
			return fmt.Errorf("mount %s (%s) at %s: %w", img, dev, target, err)
		}
		return nil
	})
}

// Detached is an ext4 filesystem mounted nowhere yet (fsmount(2)): what a
// pool keeps ready. Attach puts it in place in microseconds; closing it
// before that unmounts it, and so does the daemon's death, which closes
// its descriptor: a detached mount cannot outlive its holder.
type Detached struct {
	f *os.File
}

// MountDetached mounts img's filesystem without attaching it anywhere, with
// the given MOUNT_ATTR_* attributes and ext4 flag options (e.g.
// "noinit_itable"), on a loop device of its own.
func MountDetached(img string, attrs int, options ...string) (*Detached, error) {
	var d *Detached
	err := attach(img, func(dev string) error {
		fs, err := unix.Fsopen("ext4", unix.FSOPEN_CLOEXEC)
		if err != nil {
			return fmt.Errorf("fsopen ext4: %w", err)
		}
		defer unix.Close(fs)
		if err := unix.FsconfigSetString(fs, "source", dev); err != nil {
			return fmt.Errorf("mount %s: source %s: %w", img, dev, err)
		}
		for _, o := range options {
			if err := unix.FsconfigSetFlag(fs, o); err != nil {
				return fmt.Errorf("mount %s: option %s: %w", img, o, err)
			}
		}
		if err := unix.FsconfigCreate(fs); err != nil {
			return fmt.Errorf("mount %s (%s): %w", img, dev, err)
		}
		mfd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, attrs)
		if err != nil {
			return fmt.Errorf("fsmount %s: %w", img, err)
		}
		d = &Detached{f: os.NewFile(uintptr(mfd), img)}
		return nil
	})
	return d, err
}

// Attach mounts d at target (move_mount(2)); d is then an ordinary mount
// and Close only releases the descriptor.
func (d *Detached) Attach(target string) error {
	if err := unix.MoveMount(int(d.f.Fd()), "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach %s at %s: %w", d.f.Name(), target, err)
	}
	return nil
}

// Fd is a descriptor of d's root directory, for *at(2) calls into it.
func (d *Detached) Fd() int { return int(d.f.Fd()) }

// Close releases d: unmounts it if it was never attached.
func (d *Detached) Close() error { return d.f.Close() }

// loopMu serializes this process's claims of a free loop device: between
// LOOP_CTL_GET_FREE and LOOP_CONFIGURE every concurrent caller is told the
// same free device and all but one lose it (EBUSY); under a burst of creates
// a loser could lose every round. Other processes (other daemons, the cella
// CLI) can still take a device in between, which the retries absorb.
var loopMu sync.Mutex

// attach attaches img to a free loop device and runs use with the device's
// path while the device is held open: with AUTOCLEAR, a device that is
// neither mounted nor open is detached again.
func attach(img string, use func(dev string) error) error {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loop devices: %w", err)
	}
	defer ctl.Close()
	backing, err := os.OpenFile(img, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer backing.Close()
	lf, dev, err := claimLoop(ctl, backing, img)
	if err != nil {
		return err
	}
	err = use(dev)
	lf.Close()
	return err
}

// claimLoop configures a free loop device onto backing and returns it open.
func claimLoop(ctl, backing *os.File, img string) (*os.File, string, error) {
	loopMu.Lock()
	defer loopMu.Unlock()
	var lastErr error
	for attempt := range 50 {
		if attempt > 0 {
			// Another process took the device: let it finish configuring.
			time.Sleep(time.Duration(attempt) * time.Millisecond)
		}
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, "", fmt.Errorf("find a free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		if _, err := os.Stat(dev); errors.Is(err, os.ErrNotExist) {
			_ = unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n))))
		}
		lf, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, "", fmt.Errorf("open %s: %w", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		copy(cfg.Info.File_name[:], img)
		if err := unix.IoctlLoopConfigure(int(lf.Fd()), &cfg); err != nil {
			lf.Close()
			lastErr = fmt.Errorf("configure %s: %w", dev, err)
			if errors.Is(err, unix.EBUSY) {
				continue // another process took it first
			}
			return nil, "", lastErr
		}
		return lf, dev, nil
	}
	return nil, "", lastErr
}

// FindLoop returns the loop device whose backing file is img, or "".
func FindLoop(img string) string {
	for _, l := range Loops(img) {
		if l.BackingFile == img && !l.Deleted {
			return l.Device
		}
	}
	return ""
}

// Loop is an attached loop device.
type Loop struct {
	Device      string // /dev/loopN
	BackingFile string // as the kernel reports it, " (deleted)" cut off
	Deleted     bool   // the backing file was removed while attached
}

// Loops lists the loop devices whose backing file is prefix or lies below
// it, e.g. one data dir's images: what a daemon may clean up, leaving any
// other daemon's alone.
func Loops(prefix string) []Loop {
	prefix = filepath.Clean(prefix)
	matches, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []Loop
	for _, p := range matches {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		l := Loop{Device: "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(p)))}
		l.BackingFile, l.Deleted = strings.CutSuffix(strings.TrimSuffix(string(b), "\n"), " (deleted)")
		if l.BackingFile == prefix || strings.HasPrefix(l.BackingFile, prefix+"/") {
			out = append(out, l)
		}
	}
	return out
}

// Detach detaches a loop device from its backing file (LOOP_CLR_FD). A
// device whose filesystem is still mounted is only marked to detach once
// that goes, which AUTOCLEAR devices are already.
func Detach(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("detach %s: %w", dev, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detach %s: %w", dev, err)
	}
	return nil
}

// WaitLoopsGone waits up to d for the loop devices under prefix to be
// detached and returns those still attached. The kernel detaches an
// AUTOCLEAR device asynchronously, shortly after its filesystem is
// unmounted.
func WaitLoopsGone(prefix string, d time.Duration) []Loop {
	deadline := time.Now().Add(d)
	for {
		l := Loops(prefix)
		if len(l) == 0 || time.Now().After(deadline) {
			return l
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ext4's shutdown ioctl (EXT4_IOC_SHUTDOWN, _IOR('X', 125, __u32)) and its
// flag that drops the journal and dirty data instead of writing them.
const (
	ext4IocShutdown          = 0x8004587d
	ext4GoingFlagsNoLogFlush = 0x2
)

// Discard shuts the ext4 filesystem mounted at target down without writing
// back anything: dirty pages and the journal are dropped, every later
// operation on it fails, and unmounting it takes no time whatever it held
// (a 64 MiB write dirty in the page cache made the unmount 60 ms instead of
// 3). Use it only on a filesystem about to be unmounted and deleted. It
// acts only when target's filesystem is the one in img, on a loop device:
// never on the host's own filesystem if target turns out not to be
// mounted. A target that is not so mounted is not an error.
func Discard(target, img string) error {
	fd, err := unix.Open(target, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("discard %s: %w", target, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("discard %s: %w", target, err)
	}
	if unix.Major(st.Dev) != 7 || st.Ino != 2 { // loop devices; ext4's root inode
		return nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/loop/backing_file", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		return nil
	}
	if backing, _ := strings.CutSuffix(strings.TrimSuffix(string(b), "\n"), " (deleted)"); backing != img {
		return nil
	}
	if err := unix.IoctlSetPointerInt(fd, ext4IocShutdown, ext4GoingFlagsNoLogFlush); err != nil {
		return fmt.Errorf("discard %s: shut down its filesystem: %w", target, err)
	}
	return nil
}
