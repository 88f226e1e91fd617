package crun

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/rootfs"
	"github.com/cella-sandbox/cella/internal/runtime/oci"
)

// unifiedDir is the cgroup2 mount of a hybrid host.
const unifiedDir = "/sys/fs/cgroup/unified"

// hybridCgroups reports whether the host mounts cgroup2 next to v1
// hierarchies with controllers in it, the layout crun 1.8 refuses
// ("cgroups in hybrid mode not supported, drop all controllers from
// cgroupv2"), even with --cgroup-manager=disabled.
func hybridCgroups() bool {
	b, err := os.ReadFile(unifiedDir + "/cgroup.controllers")
	return err == nil && len(strings.TrimSpace(string(b))) > 0
}

// runInPrivateMountNS runs cmd (Start and Wait) from a thread that has its
// own private mount namespace, after calling prepare in that namespace.
// Everything mounted there (the tmpfs that hides the hybrid cgroup2
// hierarchy from crun, the idmapped views of the rootfs and RunDir) lives
// only as long as that namespace and its copies in the container: a crash
// of the daemon cannot leak a mount into the host namespace.
//
// How: a goroutine locks itself to its OS thread, unshares CLONE_FS (Go
// threads share one fs_struct, which unshare(CLONE_NEWNS) refuses) and
// CLONE_NEWNS, makes every mount private so nothing propagates back to the
// host, and forks cmd from that thread, so the child inherits the
// namespace. The goroutine then exits still locked, which makes the Go
// runtime destroy the thread instead of reusing it.
func runInPrivateMountNS(hideUnified bool, prepare func() error, cmd *exec.Cmd) error {
	return rootfs.OnThrowawayThread(func() error {
		if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("unshare mount namespace: %w", err)
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make mounts private: %w", err)
		}
		if hideUnified {
			// Writable, because crun creates its (fake, unused) v2 cgroup
			// dir in it; 4k is plenty for one container's empty dirs.
			if err := unix.Mount("cella", unifiedDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0755"); err != nil {
				return fmt.Errorf("hide %s from crun: %w", unifiedDir, err)
			}
		}
		if prepare != nil {
			if err := prepare(); err != nil {
				return err
			}
		}
		return cmd.Run()
	})
}

// mountSysfs mounts at dir (created) a read-only sysfs of the network
// namespace at netnsPath: a sysfs shows the interfaces of the namespace of
// the task that mounts it, so the calling thread joins netnsPath for the
// mount and then goes back to its own. The mount is read-only, nosuid,
// nodev and noexec from the start, so the container (whose user namespace
// then finds those flags locked) cannot make it writable.
func mountSysfs(netnsPath, dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	own, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sysfs: own network namespace: %w", err)
	}
	defer unix.Close(own)
	target, err := unix.Open(netnsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("sysfs: network namespace: %w", err)
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("sysfs: join %s: %w", netnsPath, err)
	}
	merr := unix.Mount("sysfs", dir, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	if err := unix.Setns(own, unix.CLONE_NEWNET); err != nil {
		// crun must not run in the sandbox's namespace; the caller's
		// thread is thrown away either way.
		return fmt.Errorf("sysfs: back to the own network namespace: %w", err)
	}
	if merr != nil {
		return fmt.Errorf("mount sysfs of %s: %w", netnsPath, merr)
	}
	return nil
}

// idmapMount makes dst an idmapped view of src: files owned by on-disk id
// N appear as owned by the user namespace's mapping of N (container id N =
// host id HostID+N), so the container's root and user 1000 own the same
// files on disk as in gVisor, where no mapping happens.
func idmapMount(src, dst string, usernsFD int, readOnly bool) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(usernsFD)}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("idmap %s: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move idmapped %s to %s: %w", src, dst, err)
	}
	return nil
}

// newUsernsFD returns an fd of a fresh user namespace with mapping m for
// uids and gids. The namespace lives as long as the fd; idmapped mounts
// keep their own reference.
//
// A user namespace can only be created by a single-threaded process, so a
// helper child does it: it is started under ptrace, which stops it at its
// execve before it runs a single instruction of helper, long enough to
// open /proc/<pid>/ns/user, and is then killed.
func newUsernsFD(m oci.IDMap, helper string) (int, error) {
	idm := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(m.HostID), Size: int(m.Size)}}
	cmd := exec.Command(helper)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: idm,
		GidMappings: idm,
		Ptrace:      true,
		Pdeathsig:   syscall.SIGKILL,
	}
	// The ptrace tracer is the forking thread; keep it for the whole dance.
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("start user namespace helper: %w", err)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err != nil {
		return -1, fmt.Errorf("open user namespace: %w", err)
	}
	return fd, nil
}

// checkIdmap verifies that dir's filesystem accepts idmapped mounts, from
// a throwaway private mount namespace.
func checkIdmap(dir string, usernsFD int) error {
	tmp, err := os.MkdirTemp("", "cella-idmap-check-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	err = rootfs.OnThrowawayThread(func() error {
		if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
			return err
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return err
		}
		return idmapMount(dir, tmp, usernsFD, true)
	})
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		return fmt.Errorf("idmapped mounts unsupported for %s: %w", dir, err)
	}
	return err
}
