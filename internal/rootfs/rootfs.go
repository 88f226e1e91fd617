// Package rootfs gives each sandbox its own copy-on-write root filesystem:
// an overlay whose lower layers are the (shared, read-only) template and,
// for sandboxes made from snapshots, the snapshot's frozen layers, and whose
// upper layer is the sandbox's own ext4 filesystem in a sparse image file
// on the host's disk (internal/diskimage), sized to the sandbox's disk
// limit. Because the limit is that filesystem's size, a process that fills
// the disk gets ENOSPC at the limit and nothing else on the host is
// affected; because the filesystem is on disk, what a sandbox writes is
// host disk (plus reclaimable page cache), not memory charged to it, and it
// survives daemon restarts and host reboots; because the template is only
// ever a lower layer, no sandbox can change it.
//
// Layout under the sandbox directory:
//
//	<sandboxDir>/layer.img             the image (sparse: only written blocks use disk)
//	<sandboxDir>/layer/                the image's filesystem (nosuid, nodev, noatime; root 0700)
//	<sandboxDir>/layer/upper/          overlay upper dir
//	<sandboxDir>/layer/work/           overlay work dir
//	<sandboxDir>/layer/layer.json      what the overlay is made of, to mount it again after a host reboot
//	<sandboxDir>/rootfs/               the merged overlay: the sandbox's /
//
// Everything is done with mount(2) directly: mount(8) costs a process start
// (~3 ms) for a 0.07 ms syscall.
package rootfs

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/diskimage"
)

// Names of the files and directories under a sandbox directory.
const (
	LayerDir   = "layer"
	RootFSDir  = "rootfs"
	LayerImage = "layer.img"
	layerMeta  = "layer.json"
)

// loopMajor is the block device major of loop devices.
const loopMajor = 7

// MinDiskBytes is the smallest writable layer Mount accepts; overlayfs needs
// a little room for its work dir and whiteouts.
const MinDiskBytes = 1 << 20

// Layer is one mounted sandbox root filesystem.
type Layer struct {
	// Root is the merged overlay, to be used as the container's root.
	Root string
	// Upper is the overlay's upper dir: everything the sandbox wrote.
	Upper string

	template  string
	layer     string // the image's mount point
	image     string
	diskBytes int64
}

// meta is layer.json, in the layer's filesystem: enough to mount the
// overlay again where nothing is mounted any more (a host reboot), and the
// layer's size.
type meta struct {
	Lowers    []string `json:"lowers"` // top first, the template last
	DiskBytes int64    `json:"disk_bytes"`
}

func layout(dir string) *Layer {
	l := &Layer{Root: filepath.Join(dir, RootFSDir), layer: filepath.Join(dir, LayerDir), image: filepath.Join(dir, LayerImage)}
	l.Upper = filepath.Join(l.layer, "upper")
	return l
}

func (l *Layer) readMeta() (meta, error) {
	var md meta
	p := filepath.Join(l.layer, layerMeta)
	b, err := os.ReadFile(p)
	if err != nil {
		return md, err
	}
	if err := json.Unmarshal(b, &md); err != nil {
		return md, fmt.Errorf("%s: %w", p, err)
	}
	if len(md.Lowers) == 0 {
		return md, fmt.Errorf("%s names no lower layer", p)
	}
	l.diskBytes, l.template = md.DiskBytes, md.Lowers[len(md.Lowers)-1]
	return md, nil
}

// Mount creates the writable layer and the overlay for one sandbox,
// formatting its image on the spot (Layers.Mount clones a blank one
// instead). The sandbox directory is created if needed. On error nothing
// stays mounted.
func Mount(templateRootFS, sandboxDir string, diskBytes int64) (*Layer, error) {
	return MountStack([]string{templateRootFS}, sandboxDir, diskBytes)
}

// MountStack is Mount with several lowers, top first (Layers.MountStack
// without ready layers).
func MountStack(lowers []string, sandboxDir string, diskBytes int64) (*Layer, error) {
	return (&Layers{}).MountStack(lowers, sandboxDir, diskBytes)
}

// Open returns the Layer of a sandbox directory whose rootfs is already
// mounted (after a daemon restart). It fails if nothing is mounted there.
func Open(sandboxDir string) (*Layer, error) {
	dir, err := filepath.Abs(sandboxDir)
	if err != nil {
		return nil, err
	}
	l := layout(dir)
	if !isMountPoint(l.Root) {
		return nil, fmt.Errorf("open rootfs: nothing mounted at %s", l.Root)
	}
	_, _ = l.readMeta() // a tmpfs layer of an older daemon has none
	return l, nil
}

// Remount is Open for a layer that may have been unmounted behind the
// daemon's back, by a host reboot: what is missing of its filesystem and
// overlay is mounted again from its image, with everything the sandbox
// wrote. Use it only for a layer no container runs on and that was synced
// (Layer.Sync) once its sandbox stopped writing.
func Remount(sandboxDir string) (*Layer, error) {
	if l, err := Open(sandboxDir); err == nil {
		return l, nil
	}
	dir, err := filepath.Abs(sandboxDir)
	if err != nil {
		return nil, err
	}
	l := layout(dir)
	if _, err := os.Stat(l.image); err != nil {
		return nil, fmt.Errorf("remount rootfs: %w", err)
	}
	mounted := false
	if !isMountPoint(l.layer) {
		if err := diskimage.Mount(l.image, l.layer, layerMountFlags, layerMountData); err != nil {
			return nil, fmt.Errorf("remount rootfs: %w", err)
		}
		mounted = true
	}
	md, err := l.readMeta()
	if err == nil {
		for _, p := range md.Lowers {
			if _, err = os.Stat(p); err != nil {
				err = fmt.Errorf("lower layer: %w", err)
				break
			}
		}
	}
	if err == nil {
		// Only paused sandboxes are remounted, and Pause synced their layer.
		err = clearVolatile(filepath.Join(l.layer, "work"))
	}
	if err == nil {
		err = mountOverlay(md.Lowers, l)
	}
	if err != nil {
		if mounted { // leave it as it was found
			_ = unix.Unmount(l.layer, 0)
		}
		return nil, fmt.Errorf("remount rootfs: %w", err)
	}
	return l, nil
}

func isMountPoint(p string) bool {
	mounts, err := FindMounts(p)
	if err != nil {
		return false
	}
	for _, m := range mounts {
		if m == p {
			return true
		}
	}
	return false
}

// Usage reports the bytes used in and the size of the writable layer.
func (l *Layer) Usage() (used, size int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(l.layer, &st); err != nil {
		return 0, 0, fmt.Errorf("rootfs usage: %w", err)
	}
	var dev unix.Stat_t
	if err := unix.Stat(l.layer, &dev); err != nil {
		return 0, 0, fmt.Errorf("rootfs usage: %w", err)
	}
	switch {
	case st.Type == unix.EXT4_SUPER_MAGIC && unix.Major(dev.Dev) == loopMajor:
		used = int64(st.Blocks-st.Bfree) * st.Bsize
		size = l.diskBytes
		if size == 0 {
			size = used + int64(st.Bavail)*st.Bsize
		}
	case st.Type == unix.TMPFS_MAGIC:
		// A layer mounted by a daemon from before disk-backed layers.
		size = int64(st.Blocks) * st.Bsize
		used = size - int64(st.Bfree)*st.Bsize
	default:
		return 0, 0, fmt.Errorf("rootfs usage: %s is not a mounted layer", l.layer)
	}
	return used, size, nil
}

// Unmount unmounts the overlay and the writable layer and removes the
// mount points and the image; the sandbox's writes are gone afterwards. It
// is idempotent.
func (l *Layer) Unmount() error {
	return UnmountAll(filepath.Dir(l.Root))
}

// UnmountAll unmounts everything mounted at or below sandboxDir, deepest
// first, then removes the rootfs and layer mount points and the layer's
// image. Busy mounts are detached lazily (MNT_DETACH) so that a leftover
// process holding a file open cannot make cleanup fail forever. Missing
// mounts are not an error. The writable layer's filesystem is shut down
// first, discarding what it still had to write: it is about to be deleted,
// and its unmount would otherwise write it all to the image first.
func UnmountAll(sandboxDir string) error {
	dir, err := filepath.Abs(sandboxDir)
	if err != nil {
		return err
	}
	mounts, err := FindMounts(dir)
	if err != nil {
		return err
	}
	var errs []error
	l := layout(dir)
	if err := diskimage.Discard(l.layer, l.image); err != nil {
		errs = append(errs, err)
	}
	// FindMounts returns mount order; unmount in reverse so children go first.
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := detach(mounts[i]); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range []string{filepath.Join(dir, RootFSDir), filepath.Join(dir, LayerDir)} {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			// Still a mount point (a detach raced) or not empty: keep it, the
			// caller's RemoveAll of the sandbox dir will say so.
			slog.Debug("rootfs: keep mount point", "path", d, "err", err)
		}
	}
	// A filesystem still mounted (lazily detached, busy) keeps its image
	// open through its loop device; both go when it is released.
	if err := os.Remove(l.image); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Detach unmounts target and anything stacked on it, lazily if it is busy.
// A target that is not a mount point or does not exist counts as done.
// Other packages use it for the mounts runtimes leave behind.
func Detach(target string) error { return detach(target) }

func detach(target string) error {
	for range 8 { // mounts can be stacked on one point
		err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EBUSY):
			if err := unix.Unmount(target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("unmount %s: %w", target, err)
			}
			slog.Warn("rootfs: busy mount detached lazily", "path", target)
		default:
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
	return nil
}

// FindMounts returns the mount points at or below prefix (a path; "/" for
// all), in the order they were mounted, from /proc/self/mountinfo. Use it
// to find the layers a crashed daemon left behind.
func FindMounts(prefix string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("find mounts: %w", err)
	}
	defer f.Close()
	return parseMountInfo(f, filepath.Clean(prefix))
}

func parseMountInfo(r io.Reader, prefix string) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeOctal(fields[4])
		if prefix == "/" || mp == prefix || strings.HasPrefix(mp, prefix+"/") {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("find mounts: %w", err)
	}
	return out, nil
}

// unescapeOctal undoes mountinfo's \NNN escaping of space, tab, newline and
// backslash.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func copyOwnerMode(from, to string) error {
	var st unix.Stat_t
	if err := unix.Stat(from, &st); err != nil {
		return err
	}
	if err := os.Lchown(to, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	return unix.Chmod(to, st.Mode&0o7777)
}
