package rootfs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// EnsureTmpfs makes dir (created if missing) the mount point of a tmpfs of
// its own with the given size and mode, unless something is mounted there
// already. It returns whether it mounted one.
//
// What sandboxes bind from the host lives on such small filesystems (the
// agent binary, each sandbox's run directory): a bind mount's root appears
// in the sandbox's /proc/self/mountinfo as its path inside its filesystem,
// which is "/" or "/cella" on a tmpfs of its own but the daemon's whole
// data dir path on the host's disk.
func EnsureTmpfs(dir string, size int64, mode os.FileMode) (bool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("tmpfs at %s: %w", dir, err)
	}
	// The path as mountinfo spells it, or a mount already there is missed.
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return false, fmt.Errorf("tmpfs at %s: %w", dir, err)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return false, err
	}
	mounts, err := FindMounts(dir)
	if err != nil {
		return false, err
	}
	if slices.Contains(mounts, dir) {
		return false, nil
	}
	data := fmt.Sprintf("size=%d,nr_inodes=1024,mode=%o", size, mode.Perm())
	if err := unix.Mount("cella", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return false, fmt.Errorf("tmpfs at %s: %w", dir, err)
	}
	return true, nil
}
