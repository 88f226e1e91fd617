package rootfs

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// MaxLowers is overlayfs's limit on stacked lower layers (OVL_MAX_STACK).
// Templates from images stack one lower per image layer, snapshots add
// theirs on top; MountOverlay passes each layer as its own parameter, so
// no option string limits the stack below this.
const MaxLowers = 500

// MountOverlay mounts an overlay at target: lowers top first, each given
// to the kernel by file descriptor (fsconfig "lowerdir+"), so neither the
// 4 KiB page that mount(2)'s option string may fill nor fsconfig's
// 256-byte strings limit how many layers, of what path length, a root can
// stack. upper and work may both be empty for a read-only overlay, which
// needs at least two lowers. flags are MOUNT_ATTR_* flags (e.g.
// unix.MOUNT_ATTR_NODEV).
func MountOverlay(target string, lowers []string, upper, work string, flags int) error {
	return mountOverlayFDs(target, lowers, upper, work, flags, false)
}

// mountOverlayFDs is MountOverlay, volatile too when asked (sandbox layers:
// stack.go's mountOverlay says why).
func mountOverlayFDs(target string, lowers []string, upper, work string, flags int, volatile bool) error {
	if len(lowers) == 0 {
		return fmt.Errorf("overlay at %s: no lower layer", target)
	}
	if len(lowers) > MaxLowers {
		return fmt.Errorf("overlay at %s: %d layers, over overlayfs's limit of %d (an image with fewer layers, or fewer snapshots stacked, fits)", target, len(lowers), MaxLowers)
	}
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	open := func(p string) (int, error) {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("open layer %s: %w", p, err)
		}
		fds = append(fds, fd)
		return fd, nil
	}
	fs, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen overlay: %w", err)
	}
	fds = append(fds, fs)
	setFd := func(key, p string) error {
		fd, err := open(p)
		if err != nil {
			return err
		}
		if err := unix.FsconfigSetFd(fs, key, fd); err != nil {
			return fmt.Errorf("overlay %s %s: %w", key, p, err)
		}
		return nil
	}
	if err := unix.FsconfigSetString(fs, "source", "cella-rootfs"); err != nil {
		return fmt.Errorf("overlay source: %w", err)
	}
	for _, l := range lowers {
		if err := setFd("lowerdir+", l); err != nil {
			return err
		}
	}
	if upper != "" {
		if err := setFd("upperdir", upper); err != nil {
			return err
		}
		if err := setFd("workdir", work); err != nil {
			return err
		}
	}
	// index=off and xino=off: the upper is thrown away with the sandbox and
	// never reused with another lower, and the kernel has no index support.
	// redirect_dir/metacopy stay at their (off) defaults: both would let a
	// crafted layer point into other lower files.
	for _, kv := range [][2]string{{"index", "off"}, {"xino", "off"}} {
		if err := unix.FsconfigSetString(fs, kv[0], kv[1]); err != nil {
			return fmt.Errorf("overlay option %s=%s: %w", kv[0], kv[1], err)
		}
	}
	if volatile && upper != "" {
		if err := unix.FsconfigSetFlag(fs, "volatile"); err != nil {
			return fmt.Errorf("overlay option volatile: %w", err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return fmt.Errorf("create overlay of %d layers: %w", len(lowers), err)
	}
	if upper == "" {
		flags |= unix.MOUNT_ATTR_RDONLY
	}
	mfd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, flags)
	if err != nil {
		return fmt.Errorf("fsmount overlay: %w", err)
	}
	fds = append(fds, mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach overlay at %s: %w", target, err)
	}
	return nil
}
