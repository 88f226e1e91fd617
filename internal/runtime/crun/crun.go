// Package crun runs cella sandboxes as Linux namespace containers through
// crun (runtime name "namespaces"): native speed and ~10 ms starts, but the
// sandbox shares the host kernel, so it stacks every kernel-side barrier
// available: pid, mount, network (loopback only), ipc, uts, user and cgroup
// namespaces; cgroup v1 limits under /cella/<id>; a seccomp deny-list;
// no_new_privileges; a docker-like minimal capability set; masked /proc
// files. Landlock is applied by the agent inside.
//
// User namespace: container ids 0..65535 are host ids 100000..165535, so
// even the container's root is an unprivileged nobody on the host. Template
// files are owned by host uid 0 and 1000 (shared with gVisor, which maps
// nothing), so through a plain user namespace they would all appear as
// "nobody" and user 1000 could not write /home/user. So the container sees
// its files through idmapped mounts (mount_setattr MOUNT_ATTR_IDMAP with a
// user namespace of the same mapping): inside, files keep their owners
// 0/1000, and what uid 1000 writes lands on disk as uid 1000 in the
// overlay's upper layer, exactly as with gVisor. An overlay mount itself
// cannot be idmapped (EINVAL), so Start rebuilds the sandbox's overlay in
// place on idmapped views of its own layers (rootfs.IDMapOverlay: same
// upper, same template lower). After Start, the host's view of Spec.RootFS
// shows owners shifted by +100000 and host root cannot create files through
// it (EOVERFLOW); the upper dir and Layer.Usage/Unmount are unaffected. A
// RootFS that is a plain directory gets an idmapped bind instead. RunDir and
// directory Mounts are idmapped binds, so the container's root owns the
// daemon's socket and files there. If the kernel or filesystem cannot idmap,
// New fails unless Config.NoUserNS is set, which keeps every other
// namespace but runs the container's root as host root.
//
// Hybrid cgroups: crun 1.8 refuses a host whose cgroup2 hierarchy holds
// controllers next to v1 ones. Each crun call therefore runs in a private
// mount namespace where /sys/fs/cgroup/unified is hidden under a small
// writable tmpfs, so crun sees a legacy v1 host and uses the v1 controllers
// (no host change needed; see runtime-notes §2). The idmapped binds (root,
// RunDir, mounts) are made in that same namespace under a tmpfs over
// Config.MountDir and never appear in the host's; only the rebuilt overlay
// does, at Spec.RootFS where the old one was.
package crun

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/cgroup"
	"github.com/cella-sandbox/cella/internal/rootfs"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/oci"
	"github.com/cella-sandbox/cella/internal/runtime/ocicli"
)

// Config configures the namespaces runtime.
type Config struct {
	// CrunPath is the crun binary; "" means "crun" from $PATH.
	CrunPath string
	// RootDir is crun's state directory (--root), under the daemon's data
	// dir so that List finds exactly cella's containers.
	RootDir string
	// IDMap is the user namespace mapping; nil means oci.DefaultIDMap.
	IDMap *oci.IDMap
	// NoUserNS runs containers without a user namespace (their root is
	// host root, only the other namespaces, capabilities and seccomp
	// contain it). Only for hosts without idmapped mount support.
	NoUserNS bool
	// MountDir is an existing host directory that each crun call's private
	// mount namespace covers with a tmpfs holding the container's root and
	// RunDir mount points; "" means /run/cella-crun. Nothing is ever
	// mounted on it in the host's namespace.
	MountDir string
	// CommandTimeout bounds each crun call; 0 means 30s.
	CommandTimeout time.Duration
}

// Validate fills defaults and checks the configuration.
func (c *Config) Validate() error {
	if c.CrunPath == "" {
		c.CrunPath = "crun"
	}
	if c.RootDir == "" || !filepath.IsAbs(c.RootDir) {
		return fmt.Errorf("crun: RootDir %q must be an absolute path", c.RootDir)
	}
	if c.IDMap == nil {
		m := oci.DefaultIDMap
		c.IDMap = &m
	}
	if c.IDMap.Size == 0 || uint64(c.IDMap.HostID)+uint64(c.IDMap.Size) > 1<<32-1 {
		return fmt.Errorf("crun: invalid id map %+v", *c.IDMap)
	}
	if c.IDMap.HostID == 0 {
		return errors.New("crun: id map must not start at host id 0 (that is no user namespace at all)")
	}
	if c.CommandTimeout == 0 {
		c.CommandTimeout = 30 * time.Second
	}
	if c.MountDir == "" {
		c.MountDir = "/run/cella-crun"
	}
	if !filepath.IsAbs(c.MountDir) {
		return fmt.Errorf("crun: MountDir %q must be an absolute path", c.MountDir)
	}
	return nil
}

// Runtime is the crun implementation of runtime.Runtime.
type Runtime struct {
	cfg         Config
	hideUnified bool
	cli         *ocicli.CLI

	mu       sync.Mutex
	usernsFD int // -1 without a user namespace or after Close
}

var _ runtime.Runtime = (*Runtime)(nil)

// New checks cfg, finds crun, and prepares the user namespace used for
// idmapped mounts, verifying that idmapped mounts work for RootDir's
// filesystem.
func New(cfg Config) (*Runtime, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p, err := exec.LookPath(cfg.CrunPath)
	if err != nil {
		return nil, fmt.Errorf("crun: binary %q not found (apt-get install crun): %w", cfg.CrunPath, err)
	}
	cfg.CrunPath = p
	if err := os.MkdirAll(cfg.RootDir, 0o700); err != nil {
		return nil, fmt.Errorf("crun: create root dir: %w", err)
	}
	if err := os.MkdirAll(cfg.MountDir, 0o711); err != nil {
		return nil, fmt.Errorf("crun: create mount dir: %w", err)
	}
	r := &Runtime{cfg: cfg, hideUnified: hybridCgroups(), usernsFD: -1}
	r.cli = &ocicli.CLI{
		Name:     "crun",
		Path:     cfg.CrunPath,
		Flags:    []string{"--root=" + cfg.RootDir, "--cgroup-manager=cgroupfs"},
		LogFlags: func(path string) []string { return []string{"--log=file:" + path, "--log-format=json"} },
		Timeout:  cfg.CommandTimeout,
		// Every crun call, short ones included, needs the hybrid cgroup
		// layout hidden.
		Exec: func(cmd *exec.Cmd) error { return runInPrivateMountNS(r.hideUnified, nil, cmd) },
	}
	if !cfg.NoUserNS {
		fd, err := newUsernsFD(*cfg.IDMap, cfg.CrunPath)
		if err != nil {
			return nil, fmt.Errorf("crun: %w", err)
		}
		r.usernsFD = fd
		if err := checkIdmap(cfg.RootDir, fd); err != nil {
			r.Close()
			return nil, fmt.Errorf("crun: %w (set NoUserNS to run without a user namespace)", err)
		}
	}
	return r, nil
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return runtime.Namespaces }

// Close implements runtime.Runtime. Containers keep running.
func (r *Runtime) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.usernsFD >= 0 {
		unix.Close(r.usernsFD)
		r.usernsFD = -1
	}
	return nil
}

// UserNS reports whether containers get a user namespace.
func (r *Runtime) UserNS() bool { return !r.cfg.NoUserNS }

// bundle is a prepared bundle: the spec plus the mounts to make in the
// private mount namespace before crun runs.
type bundle struct {
	dir   string
	binds []bind
	// sysfsNetNS is the network namespace whose sysfs is mounted at
	// MountDir/sys for the container's /sys ("" = crun mounts it).
	sysfsNetNS string
}

type bind struct {
	src, dst string // dst is relative to MountDir
	idmap    bool
	ro       bool
}

// prepare writes spec's bundle. With a user namespace, the root, RunDir
// and extra directory mounts are bound from mount points on a tmpfs that
// the private mount namespace puts over MountDir, so that the container's
// (unprivileged) root never has to traverse the daemon's 0700 dirs, and
// nothing is left in the host's mount table.
func (r *Runtime) prepare(spec *runtime.Spec) (*bundle, error) {
	if err := oci.ValidateSpec(spec); err != nil {
		return nil, err
	}
	if spec.ContainerEngine {
		// An engine needs mounts, namespaces and bridges, which here would
		// be the host kernel's: never granted to a sandbox.
		return nil, fmt.Errorf("a container engine inside the sandbox needs the gvisor runtime: %w", runtime.ErrNotSupported)
	}
	if err := checkRunDir(spec.RootFS); err != nil {
		return nil, err
	}
	b := &bundle{dir: spec.BundleDir}
	opts := oci.Options{CgroupNS: true, HostKernel: true, OCIVersion: "1.0.2"}
	s := *spec
	if !r.cfg.NoUserNS {
		opts.UserNS = r.cfg.IDMap
		// An overlay rootfs cannot be idmapped as a whole; rebuild it on
		// idmapped layers (once; it is a no-op afterwards) and bind it as is.
		// Any other directory is bound through an idmapped mount.
		r.mu.Lock()
		fd := r.usernsFD
		r.mu.Unlock()
		if fd < 0 {
			return nil, errors.New("runtime closed")
		}
		rootIDMap := false
		err := rootfs.IDMapOverlay(spec.RootFS, fd, r.cfg.IDMap.HostID)
		switch {
		case errors.Is(err, rootfs.ErrNotOverlay):
			rootIDMap = true
		case err != nil:
			return nil, err
		}
		opts.RootPath = filepath.Join(r.cfg.MountDir, "rootfs")
		opts.ReplaceRunDir = filepath.Join(r.cfg.MountDir, "run")
		if spec.NetNSPath != "" {
			// The slot's namespace belongs to the host's user namespace, so
			// the container cannot mount its sysfs: mount it from here.
			b.sysfsNetNS = spec.NetNSPath
			opts.SysfsSource = filepath.Join(r.cfg.MountDir, "sys")
		}
		b.binds = append(b.binds,
			bind{src: spec.RootFS, dst: "rootfs", idmap: rootIDMap},
			bind{src: spec.RunDir, dst: "run", idmap: true})
		s.Mounts = slices.Clone(spec.Mounts)
		for i, m := range s.Mounts {
			st, err := os.Stat(m.Source)
			if err != nil {
				return nil, fmt.Errorf("mount %s: %w", m.Source, err)
			}
			if !st.IsDir() {
				continue // files keep host owners; bind them as they are
			}
			dst := "mnt" + strconv.Itoa(i)
			b.binds = append(b.binds, bind{src: m.Source, dst: dst, idmap: true, ro: m.ReadOnly})
			s.Mounts[i].Source = filepath.Join(r.cfg.MountDir, dst)
		}
	}
	sp, err := oci.Build(&s, opts)
	if err != nil {
		return nil, err
	}
	if err := oci.WriteBundle(spec.BundleDir, sp); err != nil {
		return nil, err
	}
	return b, nil
}

// mounts returns the function that makes b's mounts inside the private
// mount namespace.
func (r *Runtime) mounts(b *bundle) func() error {
	return func() error {
		if len(b.binds) == 0 {
			return nil
		}
		r.mu.Lock()
		fd := r.usernsFD
		r.mu.Unlock()
		if fd < 0 {
			return errors.New("runtime closed")
		}
		if err := unix.Mount("cella", r.cfg.MountDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=16k,mode=0711"); err != nil {
			return fmt.Errorf("mount tmpfs at %s: %w", r.cfg.MountDir, err)
		}
		if b.sysfsNetNS != "" {
			if err := mountSysfs(b.sysfsNetNS, filepath.Join(r.cfg.MountDir, "sys")); err != nil {
				return err
			}
		}
		for _, m := range b.binds {
			dst := filepath.Join(r.cfg.MountDir, m.dst)
			if err := os.Mkdir(dst, 0o755); err != nil {
				return err
			}
			if m.idmap {
				if err := idmapMount(m.src, dst, fd, m.ro); err != nil {
					return err
				}
				continue
			}
			if err := unix.Mount(m.src, dst, "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind %s: %w", m.src, err)
			}
		}
		return nil
	}
}

// Start implements runtime.Runtime: `crun run --detach` returns once the
// container's PID 1 has been executed.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) error {
	b, err := r.prepare(&spec)
	if err != nil {
		return fmt.Errorf("crun start %s: %w", spec.ID, err)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	err = r.cli.Launch(ctx, &spec, ocicli.Launch{
		What:       "start",
		Args:       []string{"run"},
		RuntimeLog: filepath.Join(spec.BundleDir, "crun.log"),
		Exec:       func(cmd *exec.Cmd) error { return runInPrivateMountNS(r.hideUnified, r.mounts(b), cmd) },
		Destroy:    r.Destroy,
	})
	if err != nil {
		return fmt.Errorf("crun start %s: %w", spec.ID, err)
	}
	return nil
}

// checkRunDir refuses a root whose /run or /run/cella is there but is no
// directory (a symlink, most likely): crun would follow it and mount the
// sandbox's /run tmpfs or its run dir where it leads, leaving a link that
// root can rename, while the agent's Landlock rules, which find the run
// dir's ancestors by path, would rule the real ones as ordinary
// directories. One that is missing crun makes, as a directory.
func checkRunDir(root string) error {
	for _, p := range []string{"run", "run/cella"} {
		fi, err := os.Lstat(filepath.Join(root, p))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("check the root's /%s: %w", p, err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("the image's /%s is a %s, not a directory: the namespaces runtime mounts the sandbox's own /%s there and keeps it in place only on a directory (use an image whose /%s is one, or the gvisor runtime): %w",
				p, fileKind(fi.Mode()), p, p, runtime.ErrNotSupported)
		}
	}
	return nil
}

// fileKind names a file type for an error message.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m.IsRegular():
		return "regular file"
	}
	return "special file"
}

// State implements runtime.Runtime.
func (r *Runtime) State(ctx context.Context, id string) (runtime.Status, error) {
	if !r.held(id) {
		return "", fmt.Errorf("crun state %s: %w", id, runtime.ErrNotFound)
	}
	st, err := r.cli.State(ctx, id)
	if err != nil {
		return "", fmt.Errorf("crun state %s: %w", id, err)
	}
	status, err := st.RuntimeStatus()
	if err != nil {
		return "", fmt.Errorf("crun state %s: %w", id, err)
	}
	return status, nil
}

// held reports whether crun holds container id: it keeps one directory
// per container in its root, with a status file once created.
func (r *Runtime) held(id string) bool {
	_, err := os.Stat(filepath.Join(r.cfg.RootDir, id, "status"))
	return !errors.Is(err, os.ErrNotExist)
}

// Destroy implements runtime.Runtime. Every step runs even if an earlier
// one fails; whatever survived crun's kill (a process that escaped it)
// sits in the container's cgroups, which go last with what is in them.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	exists := func(context.Context) bool {
		_, err := os.Stat(filepath.Join(r.cfg.RootDir, id))
		return err == nil
	}
	if err := r.cli.Remove(ctx, id, ocicli.Removal{Held: exists, OnlyHeld: true, ThawFirst: true}); err != nil {
		return fmt.Errorf("crun destroy %s: %w", id, err)
	}
	return nil
}

// Capabilities implements runtime.Runtime: without a working CRIU
// (runtime-notes §2) crun cannot save a container's memory, only freeze it.
func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{MemoryCheckpoint: false}
}

// Freeze implements runtime.Runtime (crun pause: the cgroup v1 freezer).
func (r *Runtime) Freeze(ctx context.Context, id string) error {
	if err := r.cli.Pause(ctx, id); err != nil {
		return fmt.Errorf("crun freeze %s: %w", id, err)
	}
	// crun returns once it asked; the pause is done when every task stopped.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := cgroup.WaitFrozen(wctx, id); err != nil {
		_ = r.cli.Resume(context.WithoutCancel(ctx), id)
		return fmt.Errorf("crun freeze %s: %w", id, err)
	}
	return nil
}

// Thaw implements runtime.Runtime (crun resume).
func (r *Runtime) Thaw(ctx context.Context, id string) error {
	if err := r.cli.Resume(ctx, id); err != nil {
		return fmt.Errorf("crun thaw %s: %w", id, err)
	}
	return nil
}

// Checkpoint implements runtime.Runtime: not available (no CRIU).
func (r *Runtime) Checkpoint(ctx context.Context, id, imageDir string) error {
	return fmt.Errorf("crun checkpoint %s: memory checkpoints need CRIU, which does not work on this kernel: %w", id, runtime.ErrNotSupported)
}

// Restore implements runtime.Runtime: not available (no CRIU).
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	return fmt.Errorf("crun restore %s: memory checkpoints need CRIU, which does not work on this kernel: %w", spec.ID, runtime.ErrNotSupported)
}

// List implements runtime.Runtime.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	// crun keeps one directory per container in its root; reading it is
	// what `crun list` does, minus a process start.
	ents, err := os.ReadDir(r.cfg.RootDir)
	if err != nil {
		return nil, fmt.Errorf("crun list: %w", err)
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// Stats implements runtime.Runtime from the container's cgroups.
func (r *Runtime) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	return ocicli.Stats(id)
}

// RemoveOrphans implements runtime.Runtime.
func (r *Runtime) RemoveOrphans(ctx context.Context, keep func(id string) bool) ([]string, error) {
	return ocicli.RemoveOrphans(ctx, keep)
}
