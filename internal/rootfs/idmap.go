package rootfs

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNotOverlay is returned by IDMapOverlay for a path that is not an
// overlay mount point.
var ErrNotOverlay = errors.New("not an overlay mount")

// idmapSourcePrefix marks an overlay that IDMapOverlay built, in the
// mount's source field, so a second call is a no-op.
const idmapSourcePrefix = "cella-idmap:"

// IDMapOverlay rebuilds the overlay mounted at root on idmapped views of
// its own layers, for a container whose user namespace maps container id N
// to host id hostID+N (usernsFD is such a namespace). It exists because an
// overlay mount itself cannot be idmapped (mount_setattr MOUNT_ATTR_IDMAP
// returns EINVAL on overlayfs), while its layers can.
//
// Afterwards:
//   - the container sees the template's owners unchanged (root is 0, the
//     template user is 1000), and what it writes lands in the upper dir with
//     the same on-disk ids as under gVisor (uid 1000 writes on-disk 1000);
//   - the host's view of root shows every owner shifted by hostID, and host
//     root cannot create files through it (EOVERFLOW: host uid 0 has no
//     mapping); read/write the upper dir, or go through the sandbox, instead.
//
// The same upper and work dirs are reused; the old overlay is unmounted
// (lazily if busy) once the new one exists, so a failure leaves the old
// mount in place. Calling it again on a rebuilt overlay does nothing.
// It returns ErrNotOverlay if root is not an overlay mount.
func IDMapOverlay(root string, usernsFD int, hostID uint32) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	mi, err := findMount(root)
	if err != nil {
		return fmt.Errorf("idmap overlay %s: %w", root, err)
	}
	if mi == nil || mi.fstype != "overlay" {
		return fmt.Errorf("idmap overlay %s: %w", root, ErrNotOverlay)
	}
	if strings.HasPrefix(mi.source, idmapSourcePrefix) {
		return nil
	}
	var lowers []string
	var upper, work string
	volatile := false
	for _, o := range strings.Split(mi.superOpts, ",") {
		k, v, _ := strings.Cut(o, "=")
		v = unescapeOctal(v)
		switch k {
		case "lowerdir":
			lowers = append(lowers, strings.Split(v, ":")...)
		case "lowerdir+":
			lowers = append(lowers, v)
		case "upperdir":
			upper = v
		case "workdir":
			work = v
		case "volatile": // shown as fsync=volatile since Linux 6.12
			volatile = true
		case "fsync":
			volatile = v == "volatile"
		}
	}
	if len(lowers) == 0 || upper == "" || work == "" || filepath.Dir(upper) != filepath.Dir(work) {
		return fmt.Errorf("idmap overlay %s: cannot use layers lower=%v upper=%q work=%q", root, lowers, upper, work)
	}

	// Credentials changed on the way are per-thread; the thread is thrown
	// away so no other goroutine ever runs with them.
	err = OnThrowawayThread(func() error {
		return mountIDMappedOverlay(root, lowers, upper, work, volatile, usernsFD, hostID)
	})
	if err != nil {
		return fmt.Errorf("idmap overlay %s: %w", root, err)
	}
	return nil
}

func mountIDMappedOverlay(root string, lowers []string, upper, work string, volatile bool, usernsFD int, hostID uint32) error {
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	idmapped := func(path string) (int, error) {
		fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return -1, fmt.Errorf("open_tree %s: %w", path, err)
		}
		fds = append(fds, fd)
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(usernsFD)}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return -1, fmt.Errorf("idmap %s: %w", path, err)
		}
		return fd, nil
	}
	var lowerFDs []int
	for _, l := range lowers {
		fd, err := idmapped(l)
		if err != nil {
			return err
		}
		lowerFDs = append(lowerFDs, fd)
	}
	// Upper and work must sit on one mount: idmap their common parent.
	rw, err := idmapped(filepath.Dir(upper))
	if err != nil {
		return err
	}
	upperFD, err := unix.Openat(rw, filepath.Base(upper), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open upper: %w", err)
	}
	fds = append(fds, upperFD)
	workFD, err := unix.Openat(rw, filepath.Base(work), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open work: %w", err)
	}
	fds = append(fds, workFD)

	// overlayfs does its internal work (work dir, copy-up) with the
	// creator's credentials, through the idmapped upper: the creator's
	// fsuid/fsgid must be mapped there, i.e. be the container's root
	// (hostID), or every such operation fails with EOVERFLOW. Changing the
	// fsuid clears the effective file capabilities, which copy-up needs:
	// raise them again from the permitted set.
	if _, _, e := unix.RawSyscall(unix.SYS_SETFSGID, uintptr(hostID), 0, 0); e != 0 {
		return fmt.Errorf("setfsgid: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETFSUID, uintptr(hostID), 0, 0); e != 0 {
		return fmt.Errorf("setfsuid: %w", e)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	caps[0].Effective, caps[1].Effective = caps[0].Permitted, caps[1].Permitted
	if err := unix.Capset(&hdr, &caps[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}

	fs, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen overlay: %w", err)
	}
	fds = append(fds, fs)
	set := func(k, v string) error {
		if err := unix.FsconfigSetString(fs, k, v); err != nil {
			return fmt.Errorf("overlay option %s=%s: %w", k, v, err)
		}
		return nil
	}
	if err := set("source", fmt.Sprintf("%s%d", idmapSourcePrefix, hostID)); err != nil {
		return err
	}
	for _, fd := range lowerFDs {
		if err := unix.FsconfigSetFd(fs, "lowerdir+", fd); err != nil {
			return fmt.Errorf("overlay lowerdir+ by fd (needs Linux 6.13+?): %w", err)
		}
	}
	if err := unix.FsconfigSetFd(fs, "upperdir", upperFD); err != nil {
		return fmt.Errorf("overlay upperdir by fd: %w", err)
	}
	if err := unix.FsconfigSetFd(fs, "workdir", workFD); err != nil {
		return fmt.Errorf("overlay workdir by fd: %w", err)
	}
	for _, kv := range [][2]string{{"index", "off"}, {"xino", "off"}} {
		if err := set(kv[0], kv[1]); err != nil {
			return err
		}
	}
	if volatile {
		// The old overlay left its volatile marker in the work dir, which
		// a new volatile mount refuses; it is the same upper, still live.
		if err := clearVolatile(work); err != nil {
			return err
		}
		if err := unix.FsconfigSetFlag(fs, "volatile"); err != nil {
			return fmt.Errorf("overlay option volatile: %w", err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return fmt.Errorf("create overlay: %w", err)
	}
	mfd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return fmt.Errorf("fsmount overlay: %w", err)
	}
	fds = append(fds, mfd)
	// Now swap: the old overlay goes, the new one takes its place.
	if err := unix.Unmount(root, unix.UMOUNT_NOFOLLOW); err != nil {
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("unmount old overlay: %w", err)
		}
		slog.Warn("rootfs: old overlay busy, detaching it lazily; do not use it", "path", root)
		if err := unix.Unmount(root, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
			return fmt.Errorf("detach old overlay: %w", err)
		}
	}
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, root, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach idmapped overlay: %w", err)
	}
	return nil
}

type mountEntry struct {
	mountPoint, fstype, source, superOpts string
}

// findMount returns the topmost mount at path, or nil.
func findMount(path string) (*mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var found *mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		i := slices.Index(fields, "-")
		if i < 5 || i+3 >= len(fields) {
			continue
		}
		if unescapeOctal(fields[4]) != path {
			continue
		}
		found = &mountEntry{
			mountPoint: path,
			fstype:     fields[i+1],
			source:     unescapeOctal(fields[i+2]),
			superOpts:  fields[i+3],
		}
	}
	return found, sc.Err()
}

// IsIDMapped reports whether root is an overlay rebuilt by IDMapOverlay.
func IsIDMapped(root string) bool {
	mi, err := findMount(filepath.Clean(root))
	return err == nil && mi != nil && mi.fstype == "overlay" && strings.HasPrefix(mi.source, idmapSourcePrefix)
}
