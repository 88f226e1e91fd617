// Package oci turns a runtime.Spec into an OCI runtime-spec bundle
// (config.json) that both of cella's engines, runsc and crun, accept.
//
// The spec is deliberately conservative: a docker-like minimal capability
// set without SYS_ADMIN/NET_ADMIN/SYS_PTRACE/SYS_MODULE, no_new_privileges,
// a seccomp deny-list for the syscalls that open kernel attack surface or
// escape namespaces, an empty network namespace (loopback only), and
// cgroup limits under one parent (/cella/<id>). It never carries AppArmor or
// SELinux fields: neither LSM exists on cella's hosts and runtimes fail when
// asked to apply a profile that cannot be loaded.
package oci

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/cgroup"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// GuestRunDir is where Spec.RunDir appears inside the container. It must
// equal agentapi.GuestRunDir (not imported: the runtimes know nothing of the
// agent's contract; a test checks they agree).
const GuestRunDir = "/run/cella"

// ConfigName is the bundle's spec file.
const ConfigName = "config.json"

// IDMap is a contiguous uid and gid mapping for a user namespace:
// container ids [0, Size) are host ids [HostID, HostID+Size).
type IDMap struct {
	HostID uint32
	Size   uint32
}

// DefaultIDMap maps container 0..65535 to host 100000..165535.
var DefaultIDMap = IDMap{HostID: 100000, Size: 65536}

// Options are the engine-specific parts of the spec.
type Options struct {
	// UserNS puts the container in a new user namespace with this mapping;
	// nil keeps the host's (gVisor: its sentry is the boundary and ignores
	// the mapping anyway).
	UserNS *IDMap
	// CgroupNS gives the container its own cgroup namespace.
	CgroupNS bool
	// HostKernel says the container's processes talk to the host kernel
	// (crun), so host /proc and /sys files that leak information or allow
	// writes are masked or made read-only. gVisor synthesizes those files.
	HostKernel bool
	// RootPath overrides Spec.RootFS as the bundle's root (crun's
	// idmapped view of the rootfs).
	RootPath string
	// ExtraMounts are appended after the standard ones (e.g. idmapped
	// views of RunDir).
	ExtraMounts []specs.Mount
	// ReplaceRunDir, if set, is bound at GuestRunDir instead of Spec.RunDir.
	ReplaceRunDir string
	// SysfsSource, if set, is a sysfs already mounted (read-only) in the
	// container's network namespace, bound at /sys instead of a sysfs
	// mount. A container in a user namespace cannot mount a sysfs for a
	// network namespace that the host's user namespace owns (the network
	// slot), and crun then falls back to binding the host's whole /sys:
	// the host's interfaces, cgroup hierarchies, read-write.
	SysfsSource string
	// SetuidElevates leaves no_new_privs off, so that setuid binaries
	// (sudo, as in E2B's images) elevate. Only for gVisor: its sentry
	// implements setuid itself, so a process elevates to the sandbox's own
	// root, which the API's commands can run as anyway, and never reaches
	// the host kernel.
	SetuidElevates bool
	// ContainerEngine gives PID 1 EngineCapabilities on top of the default
	// ones and EngineSeccomp instead of Seccomp (Spec.ContainerEngine).
	// Only for gVisor: the sentry implements every call they let through,
	// so they widen what the sandbox's root can do inside the sandbox, never
	// what reaches the host kernel.
	ContainerEngine bool
	// OCIVersion overrides the spec's ociVersion: crun 1.8 rejects
	// anything but 1.0.x ("unknown version specified"), though it
	// implements every field used here.
	OCIVersion string
}

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ValidateSpec checks the parts of a runtime.Spec that every engine relies on.
func ValidateSpec(s *runtime.Spec) error {
	if !idRE.MatchString(s.ID) {
		return fmt.Errorf("invalid container id %q: want [a-z0-9-], at most 63 characters", s.ID)
	}
	for name, p := range map[string]string{"BundleDir": s.BundleDir, "RootFS": s.RootFS, "AgentBinary": s.AgentBinary, "RunDir": s.RunDir, "LogPath": s.LogPath} {
		if p == "" {
			return fmt.Errorf("spec %s: %s is empty", s.ID, name)
		}
		if !filepath.IsAbs(p) {
			return fmt.Errorf("spec %s: %s %q is not absolute", s.ID, name, p)
		}
	}
	if len(s.Args) == 0 {
		return fmt.Errorf("spec %s: no args", s.ID)
	}
	if s.Limits.CPUs < 0 || s.Limits.MemoryBytes < 0 || s.Limits.Pids < 0 {
		return fmt.Errorf("spec %s: negative limit %+v", s.ID, s.Limits)
	}
	for _, m := range s.Mounts {
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Destination) {
			return fmt.Errorf("spec %s: mount %s -> %s: paths must be absolute", s.ID, m.Source, m.Destination)
		}
	}
	return nil
}

// DefaultCapabilities is the capability set of PID 1. It is docker's
// default minus MKNOD (no devices to create), NET_RAW (no network) and
// AUDIT_WRITE: the agent needs SETUID/SETGID to start processes as the
// template user, CHOWN/FOWNER/DAC_OVERRIDE/FSETID to manage files on its
// behalf, KILL to signal them, SYS_CHROOT and SETPCAP/SETFCAP for
// ordinary package installs. Never SYS_ADMIN, NET_ADMIN, SYS_PTRACE,
// SYS_MODULE.
var DefaultCapabilities = []string{
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FOWNER",
	"CAP_FSETID",
	"CAP_KILL",
	"CAP_SETGID",
	"CAP_SETUID",
	"CAP_SETPCAP",
	"CAP_SETFCAP",
	"CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT",
}

// EngineCapabilities are added to DefaultCapabilities in a sandbox that
// runs a container engine: dockerd, containerd and runc make namespaces and
// mounts (SYS_ADMIN) and the engine's bridge, addresses and routes
// (NET_ADMIN), and a bounding set without Docker's default container
// capabilities (MKNOD, NET_RAW, AUDIT_WRITE) could not give them to the
// containers. gVisor's Docker tutorial lists these and SYS_PTRACE, which no
// engine needs for its default containers and which cella leaves out
// (ptrace stays denied).
var EngineCapabilities = []string{
	"CAP_AUDIT_WRITE",
	"CAP_MKNOD",
	"CAP_NET_ADMIN",
	"CAP_NET_RAW",
	"CAP_SYS_ADMIN",
	"CAP_SYS_RESOURCE",
}

// engineAllowed are the DeniedSyscalls a container engine makes containers
// with: namespaces, mounts (the old and the new mount API), runc's session
// keyring per container, and bpf, with which runc confines a container's
// devices under cgroup v2 (BPF_PROG_TYPE_CGROUP_DEVICE). gVisor's bpf(2)
// loads only that program type, into an interpreter of its own in the
// sentry (pkg/sentry/syscalls/linux/sys_ebpf.go): the host kernel never sees
// a program.
var engineAllowed = []string{
	"unshare", "setns", "mount", "umount2", "pivot_root",
	"open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
	"keyctl", "add_key", "request_key",
	"bpf",
}

// DeniedSyscalls fail with EPERM inside every container: they manipulate
// namespaces and mounts, trace other processes, load code into the kernel,
// or reach rarely-audited kernel surface.
var DeniedSyscalls = []string{
	// namespaces and mounts
	"unshare", "setns", "mount", "umount2", "pivot_root",
	"open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
	// tracing and cross-process access (pidfd_getfd: another process's
	// fds, the agent's channel among them)
	"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
	// kernel keyring
	"keyctl", "add_key", "request_key",
	// kernel code and surface
	"bpf", "perf_event_open", "kexec_load", "kexec_file_load",
	"init_module", "finit_module", "delete_module",
	"open_by_handle_at", "userfaultfd",
	// io_uring: its operations run in kernel workers that seccomp never
	// sees (an openat through io_uring is not an openat(2)), and it has
	// been a steady source of kernel escalations; Docker's default profile
	// blocks it too. Programs fall back to ordinary syscalls on EPERM.
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	// host-wide state
	"swapon", "swapoff", "reboot", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
	"acct", "quotactl", "syslog", "iopl", "ioperm", "lookup_dcookie",
}

// nsCloneFlags are the clone(2) flags that create namespaces: clone with any
// of them fails like unshare(2).
var nsCloneFlags = []uint64{
	unix.CLONE_NEWNS, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC, unix.CLONE_NEWUSER,
	unix.CLONE_NEWPID, unix.CLONE_NEWNET, unix.CLONE_NEWCGROUP,
}

// Seccomp returns the default profile: allow everything except
// DeniedSyscalls (EPERM), namespace-creating clone(2) flags (EPERM), and
// clone3 (ENOSYS, because its flags sit in memory where seccomp cannot
// look; libc then falls back to clone, which is filtered).
func Seccomp() *specs.LinuxSeccomp {
	eperm := uint(unix.EPERM)
	enosys := uint(unix.ENOSYS)
	sc := &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
		Syscalls: []specs.LinuxSyscall{
			{Names: DeniedSyscalls, Action: specs.ActErrno, ErrnoRet: &eperm},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
		},
	}
	for _, f := range nsCloneFlags {
		sc.Syscalls = append(sc.Syscalls, specs.LinuxSyscall{
			Names:    []string{"clone"},
			Action:   specs.ActErrno,
			ErrnoRet: &eperm,
			Args:     []specs.LinuxSeccompArg{{Index: 0, Value: f, ValueTwo: f, Op: specs.OpMaskedEqual}},
		})
	}
	return sc
}

// EngineSeccomp is the profile of a sandbox that runs a container engine:
// DeniedSyscalls except engineAllowed, and clone may make namespaces. What
// stays denied (tracing, perf, io_uring, kernel modules, kexec, host-wide
// clocks...) no engine needs for its containers.
func EngineSeccomp() *specs.LinuxSeccomp {
	eperm := uint(unix.EPERM)
	enosys := uint(unix.ENOSYS)
	var denied []string
	for _, n := range DeniedSyscalls {
		if !slices.Contains(engineAllowed, n) {
			denied = append(denied, n)
		}
	}
	return &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
		Syscalls: []specs.LinuxSyscall{
			{Names: denied, Action: specs.ActErrno, ErrnoRet: &eperm},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
		},
	}
}

// Build returns the OCI spec of s.
func Build(s *runtime.Spec, o Options) (*specs.Spec, error) {
	if err := ValidateSpec(s); err != nil {
		return nil, err
	}
	hostname := s.Hostname
	if hostname == "" {
		hostname = s.ID
	}
	caps := append([]string(nil), DefaultCapabilities...)
	seccomp := Seccomp()
	if o.ContainerEngine {
		caps = append(caps, EngineCapabilities...)
		seccomp = EngineSeccomp()
	}
	root := s.RootFS
	if o.RootPath != "" {
		root = o.RootPath
	}
	version := specs.Version
	if o.OCIVersion != "" {
		version = o.OCIVersion
	}
	sp := &specs.Spec{
		Version:  version,
		Hostname: hostname,
		Root:     &specs.Root{Path: root},
		Process: &specs.Process{
			Terminal: false,
			User:     specs.User{UID: 0, GID: 0},
			Args:     append([]string(nil), s.Args...),
			Env:      append([]string(nil), s.Env...),
			Cwd:      "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  caps,
				Effective: caps,
				Permitted: caps,
			},
			NoNewPrivileges: !o.SetuidElevates,
		},
		Mounts: baseMounts(s, o),
		Linux: &specs.Linux{
			CgroupsPath: cgroup.Path(s.ID),
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: s.NetNSPath}, // no path: a new, empty netns (loopback only)
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
			},
			Resources: resources(s.Limits),
			Seccomp:   seccomp,
		},
	}
	if o.UserNS != nil {
		sp.Linux.Namespaces = append(sp.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: o.UserNS.HostID, Size: o.UserNS.Size}}
		sp.Linux.UIDMappings = m
		sp.Linux.GIDMappings = m
	}
	if o.CgroupNS {
		sp.Linux.Namespaces = append(sp.Linux.Namespaces, specs.LinuxNamespace{Type: specs.CgroupNamespace})
	}
	if o.HostKernel {
		sp.Linux.MaskedPaths = []string{
			"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
			"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
			"/sys/firmware", "/sys/devices/virtual/powercap", "/sys/kernel/btf",
			// Block devices are not namespaced: a sysfs of the container's
			// own network namespace still lists the host's disks and loop
			// devices, whose loop/backing_file names the host's volume images.
			"/sys/block", "/sys/class/block", "/sys/dev/block", "/sys/devices/virtual/block",
		}
		sp.Linux.ReadonlyPaths = []string{
			"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
		}
	}
	return sp, nil
}

func baseMounts(s *runtime.Spec, o Options) []specs.Mount {
	runDir := s.RunDir
	if o.ReplaceRunDir != "" {
		runDir = o.ReplaceRunDir
	}
	ms := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		sysfsMount(o.SysfsSource),
		{Destination: runtime.AgentGuestPath, Type: "bind", Source: s.AgentBinary, Options: []string{"bind", "ro", "nosuid", "nodev"}},
	}
	if o.HostKernel {
		// /run is a mount of its own (a tmpfs holding a copy of the image's
		// /run, as a booted system's is), so that no command can rename it:
		// the private dir's ancestors stay where the agent's Landlock rules
		// expect them. A /run the image lacks is made in the sandbox's
		// upper layer, where root could rename it and have the next
		// ruleset treat the moved directory, private dir inside, as an
		// ordinary one (review, 2026-12-08). Under gVisor no command runs
		// under Landlock.
		ms = append(ms, specs.Mount{Destination: "/run", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=755", "size=65536k", "tmpcopyup"}})
	}
	ms = append(ms,
		// Read-only: a host directory holding the daemon's socket and, until
		// the agent has read it, the agent's config. connect(2) on a socket
		// needs no write access to its mount, so the agent still dials out;
		// nothing in the sandbox can write, replace or fill anything there.
		specs.Mount{Destination: GuestRunDir, Type: "bind", Source: runDir, Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
	)
	// devpts gid=5 (tty) needs gid 5 to exist in the container's user
	// namespace.
	if o.UserNS == nil || o.UserNS.Size > 5 {
		ms[2].Options = append(ms[2].Options, "gid=5")
	}
	for _, m := range s.Mounts {
		opts := []string{"rbind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		} else {
			opts = append(opts, "rw")
		}
		ms = append(ms, specs.Mount{Destination: m.Destination, Type: "bind", Source: m.Source, Options: opts})
	}
	return append(ms, o.ExtraMounts...)
}

func sysfsMount(source string) specs.Mount {
	opts := []string{"nosuid", "noexec", "nodev", "ro"}
	if source != "" {
		return specs.Mount{Destination: "/sys", Type: "bind", Source: source, Options: append([]string{"bind"}, opts...)}
	}
	return specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: opts}
}

// cpuPeriod is the CFS period; 100 ms is the kernel's and docker's default.
const cpuPeriod = 100000

// CPUQuota is the CFS bandwidth a container limited to cpus cores gets:
// quota microseconds every period, the values both its OCI spec and
// cgroup.SetCPUQuota take.
func CPUQuota(cpus float64) (quota, period int64) {
	quota = int64(cpus * cpuPeriod)
	return max(quota, 1000), cpuPeriod // the kernel's minimum quota is 1 ms
}

func resources(l runtime.Limits) *specs.LinuxResources {
	r := &specs.LinuxResources{
		// Deny device access except the standard pseudo-devices and ptys.
		Devices: []specs.LinuxDeviceCgroup{
			{Allow: false, Access: "rwm"},
			{Allow: true, Type: "c", Major: ptr(int64(1)), Minor: ptr(int64(3)), Access: "rwm"}, // null
			{Allow: true, Type: "c", Major: ptr(int64(1)), Minor: ptr(int64(5)), Access: "rwm"}, // zero
			{Allow: true, Type: "c", Major: ptr(int64(1)), Minor: ptr(int64(7)), Access: "rwm"}, // full
			{Allow: true, Type: "c", Major: ptr(int64(1)), Minor: ptr(int64(8)), Access: "rwm"}, // random
			{Allow: true, Type: "c", Major: ptr(int64(1)), Minor: ptr(int64(9)), Access: "rwm"}, // urandom
			{Allow: true, Type: "c", Major: ptr(int64(5)), Minor: ptr(int64(0)), Access: "rwm"}, // tty
			{Allow: true, Type: "c", Major: ptr(int64(5)), Minor: ptr(int64(2)), Access: "rwm"}, // ptmx
			{Allow: true, Type: "c", Major: ptr(int64(136)), Access: "rwm"},                     // pts/* (nil minor: any)
		},
	}
	if l.MemoryBytes > 0 {
		r.Memory = &specs.LinuxMemory{Limit: ptr(l.MemoryBytes)}
		// Same ceiling for memory+swap: a container must not dodge its limit
		// by swapping. Only where swap accounting exists (memsw files).
		if _, err := os.Stat(filepath.Join(cgroup.Root, "memory", "memory.memsw.limit_in_bytes")); err == nil {
			r.Memory.Swap = ptr(l.MemoryBytes)
		}
	}
	if l.CPUs > 0 {
		quota, period := CPUQuota(l.CPUs)
		r.CPU = &specs.LinuxCPU{Quota: ptr(quota), Period: ptr(uint64(period))}
	}
	if l.Pids > 0 {
		r.Pids = &specs.LinuxPids{Limit: l.Pids}
	}
	return r
}

func ptr[T any](v T) *T { return &v }

// WriteBundle writes sp as dir/config.json (mode 0600: it names host paths).
func WriteBundle(dir string, sp *specs.Spec) error {
	b, err := json.MarshalIndent(sp, "", "  ")
	if err != nil {
		return fmt.Errorf("encode OCI spec: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ConfigName), b, 0o600); err != nil {
		return fmt.Errorf("write OCI spec: %w", err)
	}
	return nil
}

// HostPathsRootfs prepares dir as a minimal root filesystem made of the
// host's /usr and /etc (read-only binds) and the usual /bin, /lib...
// symlinks, for probes and tests that need a container without a template.
// It returns the mounts to add to the runtime.Spec.
func HostPathsRootfs(dir string) ([]runtime.Mount, error) {
	for _, d := range []string{"usr", "etc", "proc", "dev", "sys", "tmp", "run", "home"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("host rootfs: %w", err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return nil, fmt.Errorf("host rootfs: %w", err)
	}
	for _, l := range []string{"bin", "lib", "lib64", "sbin"} {
		target := "usr/" + l
		if _, err := os.Stat("/" + target); err != nil {
			continue
		}
		p := filepath.Join(dir, l)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.Symlink(target, p); err != nil {
			return nil, fmt.Errorf("host rootfs: %w", err)
		}
	}
	return []runtime.Mount{
		{Source: "/usr", Destination: "/usr", ReadOnly: true},
		{Source: "/etc", Destination: "/etc", ReadOnly: true},
	}, nil
}
