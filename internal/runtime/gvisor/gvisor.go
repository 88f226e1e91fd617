// Package gvisor runs cella sandboxes in gVisor (runsc): the sandbox's
// processes talk to gVisor's user-space kernel (the sentry), never to the
// host kernel directly, which makes it cella's strongest isolation here.
//
// Facts this package relies on (see runtime-notes §1b):
//   - runsc must be a static (CGO_ENABLED=0) build: a cgo build fails every
//     boot with "cannot read client sync file". Probe detects it from the
//     ELF header.
//   - --platform=systrap; kvm hangs on PVM hosts, ptrace is 20-50x slower.
//   - --network=none gives an empty network stack; --host-uds=open lets
//     the agent connect() to the daemon's socket in the bind-mounted RunDir.
//   - --overlay2=none: the rootfs is already a copy-on-write overlay on the
//     host whose writable layer is a size-limited tmpfs (the disk limit);
//     gVisor's own overlay would keep writes in sandbox memory instead.
//   - --oci-seccomp: without it runsc ignores the spec's seccomp profile.
//   - The container's stdout/stderr is the log file opened O_APPEND: runsc
//     writes donated files at its own offsets, and only O_APPEND keeps two
//     streams from overwriting each other.
//   - runsc can leave empty cgroup dirs behind and keeps a "null-netns"
//     nsfs bind mount in its root dir; Destroy removes both.
//   - An OOM kill inside takes down the whole sandbox (not one process).
package gvisor

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cella-sandbox/cella/internal/cgroup"
	"github.com/cella-sandbox/cella/internal/rootfs"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/oci"
	"github.com/cella-sandbox/cella/internal/runtime/ocicli"
)

// Config configures the gVisor runtime.
type Config struct {
	// RunscPath is the runsc binary (a CGO_ENABLED=0 build).
	RunscPath string
	// RootDir is runsc's state directory (--root), under the daemon's data
	// dir so that cella's containers are separate from any other runsc
	// user's and List finds exactly them.
	RootDir string
	// Platform is the gVisor platform; "" means "systrap".
	Platform string
	// DebugLogDir, if set, receives runsc's debug logs (--debug).
	DebugLogDir string
	// CommandTimeout bounds each runsc call except Start's; 0 means 30s.
	CommandTimeout time.Duration
}

// Validate fills defaults and checks the configuration.
func (c *Config) Validate() error {
	if c.Platform == "" {
		c.Platform = "systrap"
	}
	switch c.Platform {
	case "systrap", "ptrace", "kvm":
	default:
		return fmt.Errorf("gvisor: unknown platform %q (want systrap, ptrace or kvm)", c.Platform)
	}
	if c.RunscPath == "" {
		return errors.New("gvisor: RunscPath is empty")
	}
	if c.RootDir == "" || !filepath.IsAbs(c.RootDir) {
		return fmt.Errorf("gvisor: RootDir %q must be an absolute path", c.RootDir)
	}
	if c.DebugLogDir != "" && !filepath.IsAbs(c.DebugLogDir) {
		return fmt.Errorf("gvisor: DebugLogDir %q must be an absolute path", c.DebugLogDir)
	}
	if c.CommandTimeout == 0 {
		c.CommandTimeout = 30 * time.Second
	}
	return nil
}

// Runtime is the gVisor implementation of runtime.Runtime.
type Runtime struct {
	cfg Config
	cli *ocicli.CLI
}

var _ runtime.Runtime = (*Runtime)(nil)

// New checks cfg and the runsc binary and creates the root dir. It does not
// start anything: call Probe to know that sandboxes can boot.
func New(cfg Config) (*Runtime, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p, err := exec.LookPath(cfg.RunscPath)
	if err != nil {
		return nil, fmt.Errorf("gvisor: runsc binary: %w", err)
	}
	cfg.RunscPath, _ = filepath.Abs(p)
	if err := CheckBinary(cfg.RunscPath); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.RootDir, 0o700); err != nil {
		return nil, fmt.Errorf("gvisor: create root dir: %w", err)
	}
	if cfg.DebugLogDir != "" {
		if err := os.MkdirAll(cfg.DebugLogDir, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor: create debug log dir: %w", err)
		}
	}
	r := &Runtime{cfg: cfg, cli: &ocicli.CLI{
		Name:        "runsc",
		Path:        cfg.RunscPath,
		Flags:       globalFlags(&cfg),
		LogFlags:    func(path string) []string { return []string{"--log=" + path, "--log-format=json"} },
		ErrorLevels: []string{"error", "fatal"},
		Timeout:     cfg.CommandTimeout,
	}}
	// A daemon that crashed after its last sandbox died leaves runsc's
	// null-netns mounted; with no container state left, drop it now.
	if states, _ := filepath.Glob(filepath.Join(cfg.RootDir, "*.state")); len(states) == 0 {
		if err := rootfs.Detach(filepath.Join(cfg.RootDir, "null-netns")); err != nil {
			slog.Warn("gvisor: unmount leftover null-netns", "err", err)
		}
	}
	return r, nil
}

// CheckBinary fails if path is not a static executable: a dynamically
// linked (cgo) runsc cannot re-execute itself inside its empty chroot and
// every sandbox dies at boot.
func CheckBinary(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("gvisor: %s is not a runsc ELF binary: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("gvisor: %s is dynamically linked (a cgo build); runsc must be built with CGO_ENABLED=0 or every sandbox fails to boot", path)
		}
	}
	return nil
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return runtime.GVisor }

// Close implements runtime.Runtime. Containers keep running.
func (r *Runtime) Close() error { return nil }

// globalFlags are passed to every runsc command; runsc persists most of
// them in the container state, but create needs them all.
func globalFlags(cfg *Config) []string {
	f := []string{
		"--root=" + cfg.RootDir,
		"--platform=" + cfg.Platform,
		"--network=none",
		"--host-uds=open",
		"--oci-seccomp",
		"--overlay2=none",
		"--ignore-cgroups=false",
		// setuid binaries (sudo, as in E2B's images) elevate, inside the
		// sentry only: to the sandbox's own root, which commands can run
		// as anyway (the bundle leaves no_new_privs off for it).
		"--allow-suid",
	}
	if cfg.DebugLogDir != "" {
		// A trailing slash makes runsc name one file per command.
		f = append(f, "--debug", "--debug-log="+cfg.DebugLogDir+"/")
	}
	return f
}

// Start implements runtime.Runtime: it writes the bundle and runs
// `runsc run --detach`, which returns once PID 1 runs.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) error {
	return r.boot(ctx, &spec, "start", bootMounts{guestCgroup: true, tmpOnDisk: true}, "run")
}

// guestCgroup mounts the sentry's own cgroup v2 hierarchy in the guest at
// /sys/fs/cgroup (with runsc --in-sandbox-cgroup=v2). It is not the host's:
// its pids controller is what lets the agent cap a sandbox's commands at
// fork time (agent.commandCgroup), which the host pids ceiling cannot do
// without ending the whole sandbox.
var guestCgroup = specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup2", Source: "cgroup2", Options: []string{"nosuid", "noexec", "nodev"}}

// engineCgroup is the guest cgroup of a sandbox that runs a container
// engine (Spec.ContainerEngine): the sentry's cgroup v1 hierarchies, one
// per controller, at /sys/fs/cgroup (runsc's default, which its own Docker
// tests run on). Under v2 Debian's runc confines a container's devices
// with an eBPF program, and its library first probes BPF_PROG_ATTACH with
// a program type gVisor does not load, so every `docker run` fails; under
// v1 runc writes the devices controller's files. The agent's pids cap on
// commands needs v2, so such a sandbox has none: a fork bomb there is
// stopped by the host's pids ceiling, which ends the whole sandbox and
// names the limit.
var engineCgroup = specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev"}}

// guestCgroupMarker, in a checkpoint image, says that its sandbox ran with
// the guest cgroup (v2, or engineCgroup for a container engine: which one
// follows Spec.ContainerEngine, fixed for a sandbox's life). A restore must
// have the mounts of the saved sandbox, and sandboxes started before the
// guest cgroup existed (restored from their images ever since) have none.
const guestCgroupMarker = "cella-guest-cgroup-v2"

// checkpoint runs `runsc checkpoint` with args into imageDir and marks the
// image when container id runs with the guest cgroup (its bundle's spec
// says so).
func (r *Runtime) checkpoint(ctx context.Context, id, imageDir string, args ...string) error {
	st, err := r.cli.State(ctx, id)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(st.Bundle, "config.json"))
	if err != nil {
		return fmt.Errorf("read the container's spec: %w", err)
	}
	var sp specs.Spec
	if err := json.Unmarshal(b, &sp); err != nil {
		return fmt.Errorf("parse the container's spec: %w", err)
	}
	args = append(append([]string{"checkpoint"}, args...), "--image-path="+imageDir, id)
	if _, err := r.cli.Run(ctx, args...); err != nil {
		return err
	}
	for _, mark := range []struct {
		typ, dest, marker string
	}{
		{guestCgroup.Type, guestCgroup.Destination, guestCgroupMarker},
		{engineCgroup.Type, engineCgroup.Destination, guestCgroupMarker},
		{"bind", "/tmp", tmpOnDiskMarker},
	} {
		if !slices.ContainsFunc(sp.Mounts, func(m specs.Mount) bool { return m.Type == mark.typ && m.Destination == mark.dest }) {
			continue
		}
		if err := os.WriteFile(filepath.Join(imageDir, mark.marker), nil, 0o600); err != nil {
			return fmt.Errorf("mark the checkpoint image: %w", err)
		}
	}
	return nil
}

// tmpOnDiskMarker, in a checkpoint image, says that its sandbox ran with
// /tmp on its root (tmpOnDisk); older images had runsc's tmpfs there.
const tmpOnDiskMarker = "cella-tmp-on-disk"

// bootMounts are the mounts a boot adds to the standard ones: all of them
// for a new sandbox, those its checkpoint image is marked with for a
// restore.
type bootMounts struct{ guestCgroup, tmpOnDisk bool }

func savedMounts(imageDir string) bootMounts {
	has := func(marker string) bool {
		_, err := os.Stat(filepath.Join(imageDir, marker))
		return err == nil
	}
	return bootMounts{guestCgroup: has(guestCgroupMarker), tmpOnDisk: has(tmpOnDiskMarker)}
}

// tmpOnDisk is a mount of the root's own /tmp at /tmp. runsc mounts a
// tmpfs of the sandbox's memory over an empty /tmp unless the spec mounts
// something there, so files in /tmp would count as memory, not disk, and be
// lost wherever only the writable layer travels: a template build's step,
// an archive, a cold boot (E2B's /tmp is on the sandbox's disk). The source
// must be a real directory, not a link: a link the image or an earlier
// boot left there would be followed on the host. Nothing in the sandbox
// runs while it boots, so the check holds until runsc binds it.
func tmpOnDisk(rootFS string) (specs.Mount, bool) {
	dir := filepath.Join(rootFS, "tmp")
	if err := os.Mkdir(dir, 0o777); err == nil {
		_ = os.Chmod(dir, os.ModeSticky|0o777) // as /tmp is; the umask took group and other write
	}
	st, err := os.Lstat(dir)
	if err != nil || !st.IsDir() {
		return specs.Mount{}, false
	}
	return specs.Mount{Destination: "/tmp", Type: "bind", Source: dir, Options: []string{"rbind", "rw", "nosuid", "nodev"}}, true
}

// boot writes spec's bundle and runs `runsc <verb> --detach` (run, or a
// restore with its flags), with the mounts bm names.
func (r *Runtime) boot(ctx context.Context, spec *runtime.Spec, what string, bm bootMounts, verb ...string) error {
	// sudo works inside, as in E2B; a container engine gets what it needs,
	// all of it served by the sentry.
	o := oci.Options{SetuidElevates: true, ContainerEngine: spec.ContainerEngine}
	if bm.tmpOnDisk {
		if m, ok := tmpOnDisk(spec.RootFS); ok {
			o.ExtraMounts = append(o.ExtraMounts, m)
		}
	}
	switch {
	case bm.guestCgroup && spec.ContainerEngine:
		o.ExtraMounts = append(o.ExtraMounts, engineCgroup)
	case bm.guestCgroup:
		o.ExtraMounts = append(o.ExtraMounts, guestCgroup)
		verb = append([]string{"--in-sandbox-cgroup=v2"}, verb...)
	}
	sp, err := oci.Build(spec, o)
	if err != nil {
		return fmt.Errorf("gvisor %s: %w", what, err)
	}
	dropClone3Rule(sp)
	if err := oci.WriteBundle(spec.BundleDir, sp); err != nil {
		return fmt.Errorf("gvisor %s %s: %w", what, spec.ID, err)
	}
	return r.launch(ctx, spec, what, verb...)
}

// launch runs `runsc <verb> --detach` (run, or restore with its extra
// flags) for spec's bundle with the container's stdio on its log file; on
// failure it leaves nothing half-created behind.
func (r *Runtime) launch(ctx context.Context, spec *runtime.Spec, what string, verb ...string) error {
	var args []string
	if spec.NetNSPath != "" {
		// The netstack takes over the slot's eth0 (overrides --network=none).
		args = append(args, "--network=sandbox")
	}
	if spec.ContainerEngine {
		// Raw and packet sockets in the netstack: an engine's bridge,
		// iptables (netfilter's sockets) and ARP announcements use them.
		// They reach only the sandbox's own eth0, whose far end passes
		// nothing but the egress proxy's redirected flows (internal/network).
		args = append(args, "--net-raw")
	}
	err := r.cli.Launch(ctx, spec, ocicli.Launch{
		What:       what,
		Args:       append(args, verb...),
		RuntimeLog: filepath.Join(spec.BundleDir, "runsc.log"),
		Destroy:    r.Destroy,
	})
	if err != nil {
		return fmt.Errorf("gvisor %s %s: %w", what, spec.ID, err)
	}
	return nil
}

// Capabilities implements runtime.Runtime: gVisor saves a sandbox's whole
// kernel state (runsc checkpoint) and restores it (runsc restore).
func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{MemoryCheckpoint: true}
}

// Freeze implements runtime.Runtime (runsc pause: every task of the
// sandbox stops; memory stays allocated).
func (r *Runtime) Freeze(ctx context.Context, id string) error {
	if err := r.cli.Pause(ctx, id); err != nil {
		return fmt.Errorf("gvisor freeze %s: %w", id, err)
	}
	return nil
}

// Thaw implements runtime.Runtime (runsc resume).
func (r *Runtime) Thaw(ctx context.Context, id string) error {
	if err := r.cli.Resume(ctx, id); err != nil {
		return fmt.Errorf("gvisor thaw %s: %w", id, err)
	}
	return nil
}

// Checkpoint implements runtime.Runtime: `runsc checkpoint` writes the
// sandbox's state and memory into imageDir and ends the sandbox. runsc
// still reports the container as running afterwards (runtime-notes §1b),
// so Destroy removes what is left of it: state, cgroups, null-netns.
func (r *Runtime) Checkpoint(ctx context.Context, id, imageDir string) error {
	start := time.Now()
	if err := r.checkpoint(ctx, id, imageDir); err != nil {
		return fmt.Errorf("gvisor checkpoint %s: %w", id, err)
	}
	took := time.Since(start)
	if err := r.Destroy(context.WithoutCancel(ctx), id); err != nil {
		return fmt.Errorf("gvisor checkpoint %s: remove the checkpointed container: %w", id, err)
	}
	slog.Debug("gvisor: container checkpointed", "id", id, "took", took)
	return nil
}

// Restore implements runtime.Runtime: `runsc restore --detach` boots a
// sandbox from imageDir with spec's bundle (rewritten, identical to the one
// it was started with: the mounts must match) and its stdio on the log file.
// --background (the pause's image is uncompressed, runsc's default) returns
// once the kernel state is in and streams the pages after, as a fork's
// restore does: cella bench state measured resume → the holder answered at
// 1.22× a raw plain restore beside 1.60× without it (means of three runs
// each, 100 MiB touched). The image may be removed once Restore returns:
// runsc reads it by the descriptor it holds, and a checkpoint of the
// restored sandbox first waits for every page (pgalloc.MemoryFile.SaveTo).
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	return r.restore(ctx, spec, imageDir, "restore", "--background", "--image-path="+imageDir)
}

// restoreCPUs is the least CPU limit, in cores, a memory restore runs
// under: gVisor's own least CPU count (runsc gives a sandbox at least 2
// CPUs whatever its quota, or the host's if it has fewer:
// --cpu-num-from-quota), so the restored kernel sees the CPUs it had.
const restoreCPUs = 2

// restore runs `runsc <verb...>` (a restore of imageDir) for spec, under a
// CPU limit of at least restoreCPUs, and puts spec's own limit back on the
// container's cgroup before it returns. The restore's kernel load is one
// thread and the --background page loading others, all in the sandbox's
// cgroup: under a 1-core limit they queued behind each other (runsc's
// "Kernel load took" 114-130 ms beside 46-80 ms under 2 cores, 100 MiB
// touched), where a raw restore has the host's cores. The window is the
// restore call alone: a daemon that dies inside it has no record of the
// sandbox as running (resume, fork and a create from a memory snapshot
// write theirs after), so crash reconciliation removes the container. If
// the limit cannot be put back, the container is destroyed and the
// restore fails.
func (r *Runtime) restore(ctx context.Context, spec runtime.Spec, imageDir string, verb ...string) error {
	limit := spec.Limits.CPUs
	raised := limit > 0 && limit < restoreCPUs
	if raised {
		spec.Limits.CPUs = restoreCPUs
	}
	if err := r.boot(ctx, &spec, "restore", savedMounts(imageDir), verb...); err != nil {
		return err
	}
	if !raised {
		return nil
	}
	quota, period := oci.CPUQuota(limit)
	if err := cgroup.SetCPUQuota(spec.ID, quota, period); err != nil {
		derr := r.Destroy(context.WithoutCancel(ctx), spec.ID)
		return fmt.Errorf("gvisor restore %s: put back its CPU limit of %g: %w", spec.ID, limit, errors.Join(err, derr))
	}
	return nil
}

// State implements runtime.Runtime.
func (r *Runtime) State(ctx context.Context, id string) (runtime.Status, error) {
	st, err := r.cli.State(ctx, id)
	if err != nil {
		if ids, lerr := r.List(ctx); lerr == nil && !slices.Contains(ids, id) {
			return "", fmt.Errorf("gvisor state %s: %w", id, runtime.ErrNotFound)
		}
		return "", fmt.Errorf("gvisor state %s: %w", id, err)
	}
	status, err := st.RuntimeStatus()
	if err != nil {
		return "", fmt.Errorf("gvisor state %s: %w", id, err)
	}
	// After a checkpoint or a sentry crash runsc still says "running"; the
	// sandbox process tells the truth.
	if status == runtime.StatusRunning && st.Pid > 0 && !alive(st.Pid) {
		return runtime.StatusStopped, nil
	}
	return status, nil
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state field follows the parenthesized command name.
	if i := bytes.LastIndexByte(b, ')'); i > 0 && i+2 < len(b) {
		return b[i+2] != 'Z' && b[i+2] != 'X'
	}
	return true
}

// Destroy implements runtime.Runtime. Every step runs even if an earlier
// one fails, so that a half-dead container is still cleaned up: sandbox and
// gofer processes that survived (a wedged sentry) sit in the container's
// cgroups, which go with what is in them.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	held := func(ctx context.Context) bool {
		ids, err := r.List(ctx)
		return err != nil || slices.Contains(ids, id)
	}
	errs := []error{r.cli.Remove(ctx, id, ocicli.Removal{Held: held})}
	// runsc keeps one null-netns mount per root dir for all --network=none
	// sandboxes; drop it with the last container (runsc recreates it).
	if ids, err := r.List(ctx); err == nil && len(ids) == 0 {
		errs = append(errs, rootfs.Detach(filepath.Join(r.cfg.RootDir, "null-netns")))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gvisor destroy %s: %w", id, err)
	}
	return nil
}

// List implements runtime.Runtime.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	ids, err := r.cli.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("gvisor list: %w", err)
	}
	return ids, nil
}

// dropClone3Rule removes the profile's clone3 rule. It asks for ENOSYS so
// that libc falls back to clone(2), whose flags seccomp can check; runsc's
// --oci-seccomp answers EPERM instead, and glibc then fails every
// pthread_create. Inside gVisor clone3 reaches the sentry, not the host
// kernel, so the namespace-flag concern it guards against does not apply.
func dropClone3Rule(sp *specs.Spec) {
	if sp.Linux == nil || sp.Linux.Seccomp == nil {
		return
	}
	var kept []specs.LinuxSyscall
	for _, sc := range sp.Linux.Seccomp.Syscalls {
		if len(sc.Names) == 1 && sc.Names[0] == "clone3" {
			continue
		}
		kept = append(kept, sc)
	}
	sp.Linux.Seccomp.Syscalls = kept
}

// Stats implements runtime.Runtime from the container's cgroups.
func (r *Runtime) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	return ocicli.Stats(id)
}

// RemoveOrphans implements runtime.Runtime.
func (r *Runtime) RemoveOrphans(ctx context.Context, keep func(id string) bool) ([]string, error) {
	return ocicli.RemoveOrphans(ctx, keep)
}
