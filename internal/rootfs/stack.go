package rootfs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// MountStack is Mount with any number of read-only layers: lowers are
// stacked top first (e.g. a snapshot's frozen layer, then the layers it was
// itself stacked on, then the template), under a fresh tmpfs upper. Nothing
// is copied: every sandbox mounted on the same lowers shares their files
// copy-on-write through the page cache (runtime-notes §7: 0.2 ms).
func MountStack(lowers []string, sandboxDir string, diskBytes int64) (*Layer, error) {
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
	l := &Layer{
		Root:     filepath.Join(dir, RootFSDir),
		layer:    filepath.Join(dir, LayerDir),
		template: abs[len(abs)-1],
	}
	l.Upper = filepath.Join(l.layer, "upper")
	for _, d := range []string{l.layer, l.Root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("mount rootfs: %w", err)
		}
	}
	// The tmpfs root is 0700 so nothing but root on the host can reach into
	// the upper layer; the sandbox sees it only through the overlay.
	// nr_inodes bounds inode use too (tmpfs's default is half the RAM pages).
	inodes := max(diskBytes/4096, 16384)
	data := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700", diskBytes, inodes)
	if err := unix.Mount("cella-layer", l.layer, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return nil, fmt.Errorf("mount rootfs: tmpfs at %s: %w", l.layer, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = detach(l.Root)
			_ = detach(l.layer)
		}
	}()
	work := filepath.Join(l.layer, "work")
	for _, d := range []string{l.Upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, fmt.Errorf("mount rootfs: %w", err)
		}
	}
	// The upper dir's root becomes the merged root's inode: give it the top
	// layer's owner and mode, or "/" would turn 0755 root:root whatever the
	// template says.
	if err := copyOwnerMode(abs[0], l.Upper); err != nil {
		return nil, fmt.Errorf("mount rootfs: %w", err)
	}
	// overlay.go: each layer by fd, so long stacks of image layers fit.
	if err := MountOverlay(l.Root, abs, l.Upper, work, unix.MOUNT_ATTR_NODEV); err != nil {
		return nil, fmt.Errorf("mount rootfs: %w", err)
	}
	ok = true
	return l, nil
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
