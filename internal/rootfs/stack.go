package rootfs

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// MountStack makes a sandbox's writable layer and its overlay with any
// number of read-only layers: lowers are stacked top first (e.g. a
// snapshot's frozen layer, then the layers it was itself stacked on, then
// the template), under a fresh, empty filesystem of diskBytes. Nothing is
// copied: every sandbox mounted on the same lowers shares their files
// copy-on-write through the page cache (runtime-notes §7: 0.2 ms). On error
// nothing stays mounted and the image is gone.
func (ls *Layers) MountStack(lowers []string, sandboxDir string, diskBytes int64) (*Layer, error) {
	if len(lowers) == 0 {
		return nil, fmt.Errorf("mount rootfs: no lower layer")
	}
	if diskBytes < MinDiskBytes {
		return nil, fmt.Errorf("mount rootfs: disk size %d below the minimum %d", diskBytes, MinDiskBytes)
	}
	abs := make([]string, len(lowers))
	for i, p := range lowers {
		a, err := filepath.Abs(p)
		if err != nil {
			return nil, fmt.Errorf("mount rootfs: %w", err)
		}
		if st, err := os.Stat(a); err != nil {
			return nil, fmt.Errorf("mount rootfs: layer: %w", err)
		} else if !st.IsDir() {
			return nil, fmt.Errorf("mount rootfs: layer %s is not a directory", a)
		}
		abs[i] = a
	}
	dir, err := filepath.Abs(sandboxDir)
	if err != nil {
		return nil, fmt.Errorf("mount rootfs: %w", err)
	}
	for _, p := range append([]string{dir}, abs...) {
		if strings.ContainsAny(p, ",:\\\n") {
			return nil, fmt.Errorf("mount rootfs: path %q contains a character overlayfs options cannot carry", p)
		}
	}
	l := layout(dir)
	l.template, l.diskBytes = abs[len(abs)-1], diskBytes
	if _, err := os.Lstat(l.image); err == nil {
		return nil, fmt.Errorf("mount rootfs: %s already has a writable layer", dir)
	}
	for _, d := range []string{l.layer, l.Root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("mount rootfs: %w", err)
		}
	}
	ok := false
	defer func() {
		if !ok {
			_ = UnmountAll(dir)
		}
	}()
	if err := ls.mountLayer(l, diskBytes); err != nil {
		return nil, fmt.Errorf("mount rootfs: %w", err)
	}
	// What the overlay is made of is kept in the layer's own filesystem
	// (beside upper/, out of the sandbox's reach), for Remount.
	b, err := json.Marshal(meta{Lowers: abs, DiskBytes: diskBytes})
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(l.layer, layerMeta), b, 0o600); err != nil {
		return nil, fmt.Errorf("mount rootfs: %w", err)
	}
	// The upper dir's root becomes the merged root's inode: give it the top
	// layer's owner and mode, or "/" would turn 0755 root:root whatever the
	// template says.
	if err := copyOwnerMode(abs[0], l.Upper); err != nil {
		return nil, fmt.Errorf("mount rootfs: %w", err)
	}
	if err := mountOverlay(abs, l); err != nil {
		return nil, fmt.Errorf("mount rootfs: %w", err)
	}
	ok = true
	return l, nil
}

// mountOverlay mounts l's overlay of lowers over its upper dir.
//
// index=off and xino=off: the upper is never used with other lowers and
// the kernel has no index support. redirect_dir/metacopy stay at their
// (off) defaults: both would let a crafted upper point into other lower
// files. volatile: the sandbox's fsync and sync do not reach the layer's
// disk, as they did not when the layer was a tmpfs (on this machine 200
// fsyncs took 1 s through the loop device instead of 0.04 s). What a
// running sandbox wrote last may be lost when the host crashes, and a
// running sandbox is lost with its host anyway; a paused one, the state
// that survives a reboot, is synced at pause (Layer.Sync).
//
// Each layer goes to the kernel by file descriptor (overlay.go), so long
// stacks of image layers fit.
func mountOverlay(lowers []string, l *Layer) error {
	return mountOverlayFDs(l.Root, lowers, l.Upper, filepath.Join(l.layer, "work"), unix.MOUNT_ATTR_NODEV, true)
}

// clearVolatile removes the marker a volatile overlay leaves in its work
// dir (work/incompat/volatile), without which overlayfs refuses to mount
// the upper again: it cannot know whether the upper was synced. Callers
// know: the layer is still mounted (IDMapOverlay), or it was synced at
// pause (Remount).
func clearVolatile(workdir string) error {
	if err := os.RemoveAll(filepath.Join(workdir, "work", "incompat", "volatile")); err != nil {
		return fmt.Errorf("clear overlay's volatile marker: %w", err)
	}
	return nil
}

// Sync writes everything the sandbox wrote to the layer's disk (syncfs of
// its filesystem, under the volatile overlay that skips the sandbox's own
// syncs). Pause calls it once the sandbox has stopped writing, so a paused
// sandbox's files survive a host crash.
func (l *Layer) Sync() error {
	fd, err := unix.Open(l.layer, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sync layer: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("sync layer %s: %w", l.layer, err)
	}
	return nil
}

// Freeze copies a writable layer's upper dir into dst (created, must not
// exist), keeping what overlayfs needs to use it as a lower layer later:
// owners, modes, times, whiteouts (0:0 char devices) and the trusted.overlay.*
// xattrs of opaque directories. It reflinks where the filesystem can (btrfs,
// XFS) and copies otherwise; the sandbox should be frozen meanwhile.
func (l *Layer) Freeze(dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	out, err := exec.Command("cp", "-a", "--reflink=auto", "--", l.Upper, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy writable layer to %s: %w: %s", dst, err, strings.TrimSpace(string(out)))
	}
	return nil
}
