package oci

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/runtime"
)

func testSpec() *runtime.Spec {
	return &runtime.Spec{
		ID:          "abc-123",
		BundleDir:   "/b",
		RootFS:      "/r",
		AgentBinary: "/usr/bin/cella",
		Args:        []string{runtime.AgentGuestPath, "agent"},
		Env:         []string{"A=1"},
		RunDir:      "/run/x",
		LogPath:     "/l",
		Limits:      runtime.Limits{CPUs: 1.5, MemoryBytes: 256 << 20, Pids: 100},
		Mounts:      []runtime.Mount{{Source: "/data", Destination: "/data", ReadOnly: true}},
	}
}

func TestGuestRunDir(t *testing.T) {
	if GuestRunDir != agentapi.GuestRunDir {
		t.Fatalf("oci.GuestRunDir %q != agentapi.GuestRunDir %q", GuestRunDir, agentapi.GuestRunDir)
	}
}

func TestBuild(t *testing.T) {
	sp, err := Build(testSpec(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if sp.Hostname != "abc-123" || sp.Root.Path != "/r" || sp.Root.Readonly {
		t.Errorf("hostname/root: %q %+v", sp.Hostname, sp.Root)
	}
	p := sp.Process
	if p.Terminal || p.User.UID != 0 || p.Cwd != "/" || !p.NoNewPrivileges || !slices.Equal(p.Args, []string{runtime.AgentGuestPath, "agent"}) {
		t.Errorf("process %+v", p)
	}
	for _, c := range []string{"CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_PTRACE", "CAP_SYS_MODULE", "CAP_NET_RAW", "CAP_MKNOD"} {
		if slices.Contains(p.Capabilities.Bounding, c) {
			t.Errorf("%s granted", c)
		}
	}
	for _, c := range []string{"CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL"} {
		if !slices.Contains(p.Capabilities.Effective, c) {
			t.Errorf("%s missing", c)
		}
	}
	if len(p.Capabilities.Ambient) > 0 || len(p.Capabilities.Inheritable) > 0 {
		t.Error("ambient/inheritable caps set")
	}
	if p.ApparmorProfile != "" || p.SelinuxLabel != "" || sp.Linux.MountLabel != "" {
		t.Error("LSM fields set")
	}
	l := sp.Linux
	if l.CgroupsPath != "/cella/abc-123" {
		t.Errorf("cgroupsPath %q", l.CgroupsPath)
	}
	var ns []specs.LinuxNamespaceType
	for _, n := range l.Namespaces {
		if n.Path != "" {
			t.Errorf("namespace %s joins %s", n.Type, n.Path)
		}
		ns = append(ns, n.Type)
	}
	for _, want := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.MountNamespace, specs.NetworkNamespace, specs.IPCNamespace, specs.UTSNamespace} {
		if !slices.Contains(ns, want) {
			t.Errorf("no %s namespace", want)
		}
	}
	if slices.Contains(ns, specs.UserNamespace) || len(l.UIDMappings) > 0 {
		t.Error("user namespace without Options.UserNS")
	}
	r := l.Resources
	if *r.Memory.Limit != 256<<20 || *r.CPU.Quota != 150000 || *r.CPU.Period != 100000 || r.Pids.Limit != 100 {
		t.Errorf("resources %+v %+v %+v", r.Memory, r.CPU, r.Pids)
	}
	byDest := map[string]specs.Mount{}
	for _, m := range sp.Mounts {
		byDest[m.Destination] = m
	}
	for _, d := range []string{"/proc", "/dev", "/dev/pts", "/dev/shm", "/sys", runtime.AgentGuestPath, GuestRunDir, "/data"} {
		if _, ok := byDest[d]; !ok {
			t.Errorf("no mount at %s", d)
		}
	}
	if m := byDest[runtime.AgentGuestPath]; m.Source != "/usr/bin/cella" || !slices.Contains(m.Options, "ro") {
		t.Errorf("agent mount %+v", m)
	}
	if m := byDest[GuestRunDir]; m.Source != "/run/x" || !slices.Contains(m.Options, "ro") || slices.Contains(m.Options, "rw") {
		t.Errorf("run dir mount %+v", m)
	}
	if m := byDest["/sys"]; !slices.Contains(m.Options, "ro") {
		t.Errorf("/sys %+v", m)
	}
	if m, ok := byDest["/run"]; ok {
		t.Errorf("a /run mount without HostKernel: %+v", m)
	}
	if m := byDest["/data"]; !slices.Contains(m.Options, "ro") {
		t.Errorf("/data %+v", m)
	}
	// Seccomp: deny list with EPERM, clone namespace flags, clone3 ENOSYS.
	sc := l.Seccomp
	if sc.DefaultAction != specs.ActAllow {
		t.Errorf("default %s", sc.DefaultAction)
	}
	denied := map[string]bool{}
	for _, s := range sc.Syscalls {
		for _, n := range s.Names {
			if s.Action == specs.ActErrno && len(s.Args) == 0 {
				denied[n] = true
			}
		}
	}
	for _, n := range strings.Fields("unshare setns mount umount2 pivot_root ptrace process_vm_readv pidfd_getfd keyctl bpf perf_event_open kexec_load kexec_file_load init_module finit_module delete_module open_by_handle_at userfaultfd add_key request_key swapon swapoff reboot settimeofday clock_settime clone3 io_uring_setup io_uring_enter io_uring_register") {
		if !denied[n] {
			t.Errorf("%s not denied", n)
		}
	}
	b, _ := json.Marshal(sp)
	if strings.Contains(string(b), "apparmor") || strings.Contains(string(b), "selinux") {
		t.Error("LSM field in JSON")
	}
}

func TestBuildUserNS(t *testing.T) {
	sp, err := Build(testSpec(), Options{UserNS: &DefaultIDMap, CgroupNS: true, HostKernel: true, RootPath: "/x", ReplaceRunDir: "/y", SysfsSource: "/z", OCIVersion: "1.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	if sp.Version != "1.0.2" || sp.Root.Path != "/x" {
		t.Errorf("version %q root %q", sp.Version, sp.Root.Path)
	}
	want := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 100000, Size: 65536}}
	if !slices.Equal(sp.Linux.UIDMappings, want) || !slices.Equal(sp.Linux.GIDMappings, want) {
		t.Errorf("mappings %v %v", sp.Linux.UIDMappings, sp.Linux.GIDMappings)
	}
	var hasUser, hasCgroup bool
	for _, n := range sp.Linux.Namespaces {
		hasUser = hasUser || n.Type == specs.UserNamespace
		hasCgroup = hasCgroup || n.Type == specs.CgroupNamespace
	}
	if !hasUser || !hasCgroup {
		t.Error("user/cgroup namespace missing")
	}
	if !slices.Contains(sp.Linux.MaskedPaths, "/proc/kcore") || !slices.Contains(sp.Linux.MaskedPaths, "/sys/devices/virtual/block") || !slices.Contains(sp.Linux.ReadonlyPaths, "/proc/sys") {
		t.Error("host kernel paths not masked")
	}
	// /run: a tmpfs with the image's /run copied in, mounted before the
	// run dir inside it.
	run := slices.IndexFunc(sp.Mounts, func(m specs.Mount) bool { return m.Destination == "/run" })
	rundir := slices.IndexFunc(sp.Mounts, func(m specs.Mount) bool { return m.Destination == GuestRunDir })
	if run < 0 || sp.Mounts[run].Type != "tmpfs" || !slices.Contains(sp.Mounts[run].Options, "tmpcopyup") || run > rundir {
		t.Errorf("/run mount at %d (run dir at %d): %+v", run, rundir, sp.Mounts)
	}
	for _, m := range sp.Mounts {
		if m.Destination == "/sys" && (m.Type != "bind" || m.Source != "/z" || !slices.Contains(m.Options, "ro")) {
			t.Errorf("/sys from SysfsSource: %+v", m)
		}
		if m.Destination == GuestRunDir && m.Source != "/y" {
			t.Errorf("run dir source %q", m.Source)
		}
	}
}

func TestValidateSpec(t *testing.T) {
	for _, mod := range []func(*runtime.Spec){
		func(s *runtime.Spec) { s.ID = "../x" },
		func(s *runtime.Spec) { s.ID = "UPPER" },
		func(s *runtime.Spec) { s.ID = "" },
		func(s *runtime.Spec) { s.RootFS = "rel" },
		func(s *runtime.Spec) { s.RunDir = "" },
		func(s *runtime.Spec) { s.Args = nil },
		func(s *runtime.Spec) { s.Limits.MemoryBytes = -1 },
		func(s *runtime.Spec) { s.Mounts = []runtime.Mount{{Source: "x", Destination: "/x"}} },
	} {
		s := testSpec()
		mod(s)
		if err := ValidateSpec(s); err == nil {
			t.Errorf("accepted %+v", s)
		}
	}
}

func TestWriteBundleAndHostRootfs(t *testing.T) {
	dir := t.TempDir()
	sp, _ := Build(testSpec(), Options{})
	if err := WriteBundle(dir, sp); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, ConfigName))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("config.json: %v %v", st, err)
	}
	ms, err := HostPathsRootfs(filepath.Join(dir, "root"))
	if err != nil || len(ms) != 2 {
		t.Fatalf("%v %v", ms, err)
	}
	if l, _ := os.Readlink(filepath.Join(dir, "root/bin")); l != "usr/bin" {
		t.Errorf("bin -> %q", l)
	}
}

// Only a container engine's spec widens capabilities and syscalls, and
// even it keeps tracing, perf, io_uring, modules and kexec denied.
func TestBuildContainerEngine(t *testing.T) {
	denied := func(sp *specs.Spec, name string) bool {
		for _, sc := range sp.Linux.Seccomp.Syscalls {
			if sc.Action == specs.ActErrno && len(sc.Args) == 0 && slices.Contains(sc.Names, name) {
				return true
			}
		}
		return false
	}
	cloneNSRules := func(sp *specs.Spec) int {
		n := 0
		for _, sc := range sp.Linux.Seccomp.Syscalls {
			if slices.Contains(sc.Names, "clone") && len(sc.Args) > 0 {
				n++
			}
		}
		return n
	}
	plain, err := Build(testSpec(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	engine, err := Build(testSpec(), Options{ContainerEngine: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range EngineCapabilities {
		if slices.Contains(plain.Process.Capabilities.Bounding, c) {
			t.Errorf("a plain sandbox has %s", c)
		}
		if !slices.Contains(engine.Process.Capabilities.Bounding, c) || !slices.Contains(engine.Process.Capabilities.Effective, c) {
			t.Errorf("an engine sandbox lacks %s", c)
		}
	}
	for _, c := range []string{"CAP_SYS_PTRACE", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_TIME", "CAP_SYS_BOOT"} {
		if slices.Contains(engine.Process.Capabilities.Bounding, c) {
			t.Errorf("an engine sandbox has %s", c)
		}
	}
	for _, sc := range []string{"mount", "unshare", "setns", "pivot_root", "keyctl", "bpf"} {
		if !denied(plain, sc) {
			t.Errorf("a plain sandbox may call %s", sc)
		}
		if denied(engine, sc) {
			t.Errorf("an engine sandbox may not call %s", sc)
		}
	}
	for _, sc := range []string{"ptrace", "process_vm_readv", "perf_event_open", "io_uring_setup", "init_module", "kexec_load", "open_by_handle_at", "userfaultfd", "settimeofday"} {
		if !denied(engine, sc) {
			t.Errorf("an engine sandbox may call %s", sc)
		}
	}
	if cloneNSRules(plain) == 0 || cloneNSRules(engine) != 0 {
		t.Errorf("clone namespace rules: plain %d, engine %d", cloneNSRules(plain), cloneNSRules(engine))
	}
}
