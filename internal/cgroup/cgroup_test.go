package cgroup

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRemoveKillsAndCleans(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat(filepath.Join(Root, "memory")); err != nil {
		t.Skip("no v1 memory hierarchy")
	}
	id := fmt.Sprintf("cgtest-%d", os.Getpid())
	hs, err := hierarchies()
	if err != nil || len(hs) == 0 {
		t.Fatalf("hierarchies: %v %v", hs, err)
	}
	var made []string
	for _, h := range []string{"memory", "pids", "freezer", "cpu"} {
		d := filepath.Join(Root, h, Parent, id)
		if err := os.MkdirAll(filepath.Join(d, "nested"), 0o755); err == nil {
			made = append(made, d)
		}
	}
	t.Cleanup(func() { _ = Remove(id) })
	if len(made) == 0 {
		t.Skip("cannot create cgroups")
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for _, d := range made {
		if err := os.WriteFile(filepath.Join(d, "nested", "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatalf("join %s: %v", d, err)
		}
	}
	// Freeze it: Remove must still be able to kill it.
	fz := filepath.Join(Root, "freezer", Parent, id, "nested", "freezer.state")
	_ = os.WriteFile(fz, []byte("FROZEN"), 0)

	ids, err := List()
	if err != nil || !slices.Contains(ids, id) {
		t.Fatalf("List = %v %v", ids, err)
	}
	pids, err := Pids(id)
	if err != nil || !slices.Equal(pids, []int{cmd.Process.Pid}) {
		t.Fatalf("Pids = %v %v", pids, err)
	}
	if err := Remove(id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("process survived Remove")
	}
	for _, d := range made {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Fatalf("%s still exists", d)
		}
	}
	if ids, _ := List(); slices.Contains(ids, id) {
		t.Fatal("still listed")
	}
	if err := Remove(id); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if _, err := Dirs("../etc"); err == nil {
		t.Fatal("bad id accepted")
	}
}

// TestReadUsage runs a real process in real v1 cgroups: its CPU time and
// the shared memory it fills (what gVisor's guest memory is) are read back,
// the memory as used, not as cache.
func TestReadUsage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat(filepath.Join(Root, "cpuacct", "cpuacct.usage")); err != nil {
		t.Skip("no v1 cpuacct hierarchy")
	}
	id := fmt.Sprintf("cgusage-%d", os.Getpid())
	for _, h := range []string{"cpuacct", "memory"} {
		if err := os.MkdirAll(filepath.Join(Root, h, Parent, id), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = Remove(id) })
	shm := filepath.Join("/dev/shm", id)
	t.Cleanup(func() { os.Remove(shm) })

	// The child waits on stdin until it sits in the cgroups, then burns CPU
	// and fills 8 MiB of shared memory.
	cmd := exec.Command("sh", "-c", `read go; i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; head -c 8388608 /dev/zero > `+shm)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"cpuacct", "memory"} {
		if err := os.WriteFile(filepath.Join(Root, h, Parent, id, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			cmd.Process.Kill()
			t.Fatalf("join %s: %v", h, err)
		}
	}
	stdin.Write([]byte("go\n"))
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	u, err := ReadUsage(id)
	if err != nil {
		t.Fatal(err)
	}
	if u.CPU <= 0 {
		t.Errorf("CPU = %v after a busy loop", u.CPU)
	}
	if used := u.Memory - u.FileCache; used < 8<<20 {
		t.Errorf("memory %d, file cache %d: the 8 MiB of shared memory is not counted as used", u.Memory, u.FileCache)
	}
	if _, err := ReadUsage("no-such-" + id); err == nil {
		t.Error("usage of a container without cgroups: no error")
	}
	if _, err := ReadUsage("../etc"); err == nil {
		t.Error("bad id accepted")
	}
}

// TestReadUsageCounters: forks refused at the pids ceiling and a process
// killed at the memory ceiling of real v1 cgroups are counted, and the
// counts stay readable after every process of the cgroups ended.
func TestReadUsageCounters(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat(filepath.Join(Root, "pids", "pids.max")); err != nil {
		// pids.max exists only below the root; the hierarchy is what counts.
		if _, err := os.Stat(filepath.Join(Root, "pids")); err != nil {
			t.Skip("no v1 pids hierarchy")
		}
	}
	id := fmt.Sprintf("cgcount-%d", os.Getpid())
	for _, h := range []string{"cpuacct", "memory", "pids"} {
		if err := os.MkdirAll(filepath.Join(Root, h, Parent, id), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = Remove(id) })
	for file, v := range map[string]string{
		"pids/" + Parent + "/" + id + "/pids.max":                "4",
		"memory/" + Parent + "/" + id + "/memory.limit_in_bytes": strconv.Itoa(32 << 20),
	} {
		if err := os.WriteFile(filepath.Join(Root, file), []byte(v), 0); err != nil {
			t.Fatal(err)
		}
	}
	u, err := ReadUsage(id)
	if err != nil {
		t.Fatal(err)
	}
	if u.OOMKills != 0 || u.PidsMaxHits != 0 {
		t.Fatalf("fresh cgroups: %+v", u)
	}
	// tail holding a 100 MB line (no newline: it keeps all of it) under a
	// 32 MiB ceiling; the OOM killer ends it (or the shell: how it ends is
	// not the point).
	oom := startIn(t, id, `head -c 100000000 /dev/zero | tail >/dev/null`)
	_ = oom.Wait()
	// Then sleeps that outlive the test where four processes fit: the
	// refused forks are counted while they still run, however slowly this
	// machine forks, and Remove below ends them.
	forks := startIn(t, id, `for i in 1 2 3 4 5 6; do sleep 600 & done; wait`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if u, err = ReadUsage(id); err != nil {
			t.Fatal(err)
		}
		if u.PidsMaxHits > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, pid := range mustPids(t, id) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = forks.Wait()
	if u.PidsMaxHits == 0 {
		t.Errorf("PidsMaxHits = 0 after six forks at pids.max 4")
	}
	if u.OOMKills == 0 {
		t.Errorf("OOMKills = 0 after 100 MB held under a 32 MiB ceiling")
	}
}

// startIn starts script in a shell that joins the test's cgroups before
// it runs anything, so every process it forks is counted there.
func startIn(t *testing.T, id, script string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", "read go; "+script)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"cpuacct", "memory", "pids"} {
		if err := os.WriteFile(filepath.Join(Root, h, Parent, id, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("join %s: %v", h, err)
		}
	}
	_, _ = stdin.Write([]byte("go\n"))
	_ = stdin.Close()
	return cmd
}

func mustPids(t *testing.T, id string) []int {
	t.Helper()
	pids, err := Pids(id)
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// TestRemoveOrphans: of the cgroups under the parent, only the empty, old
// ones that keep does not claim go.
func TestRemoveOrphans(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	base := fmt.Sprintf("cgorphan-%d-", os.Getpid())
	old := time.Now().Add(-time.Hour)
	made := map[string]string{}
	for _, name := range []string{"old", "kept", "young", "busy"} {
		id := base + name
		d := filepath.Join(Root, "pids", Parent, id)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Skipf("no v1 pids hierarchy: %v", err)
		}
		t.Cleanup(func() { _ = Remove(id) })
		if name != "young" {
			if err := os.Chtimes(d, old, old); err != nil {
				t.Fatal(err)
			}
		}
		made[name] = id
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	busy := filepath.Join(Root, "pids", Parent, made["busy"])
	if err := os.WriteFile(filepath.Join(busy, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	// Joining a process may touch the dir; it is old all the same.
	if err := os.Chtimes(busy, old, old); err != nil {
		t.Fatal(err)
	}
	removed, err := RemoveOrphans(func(id string) bool { return id == made["kept"] || !strings.HasPrefix(id, base) }, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{made["old"]}) {
		t.Fatalf("removed %v, want only %s", removed, made["old"])
	}
	ids, _ := List()
	for name, id := range made {
		if got, want := slices.Contains(ids, id), name != "old"; got != want {
			t.Errorf("%s: listed %v after RemoveOrphans, want %v", id, got, want)
		}
	}
}

// TestReadUsageV2 reads a unified hierarchy's files (laid out by hand: this
// host mounts v1 controllers).
func TestReadUsageV2(t *testing.T) {
	root := t.TempDir()
	old := Root
	Root = root
	t.Cleanup(func() { Root = old })
	dir := filepath.Join(root, Parent, "box")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"cpu.stat":       "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
		"memory.current": "104857600\n",
		"memory.stat":    "anon 50000000\nfile 30000000\nshmem 10000000\nfile_mapped 0\n",
		"memory.events":  "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n",
		"pids.events":    "max 7\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	u, err := ReadUsage("box")
	if err != nil {
		t.Fatal(err)
	}
	if want := (Usage{CPU: 2500 * time.Millisecond, Memory: 104857600, FileCache: 20000000, OOMKills: 2, PidsMaxHits: 7}); u != want {
		t.Fatalf("usage %+v, want %+v", u, want)
	}
}

// TestWaitFrozen: a busy task in a freezer cgroup asked to freeze is
// stopped when WaitFrozen returns (its CPU time no longer moves), and a
// cgroup that is not freezing is an error.
func TestWaitFrozen(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	id := fmt.Sprintf("cgfreeze-%d", os.Getpid())
	d := filepath.Join(Root, "freezer", Parent, id)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Skipf("no v1 freezer: %v", err)
	}
	t.Cleanup(func() { _ = Remove(id) })
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := WaitFrozen(ctx, id); err == nil {
		t.Fatal("a thawed cgroup counted as frozen")
	}
	if err := os.WriteFile(filepath.Join(d, "freezer.state"), []byte("FROZEN"), 0); err != nil {
		t.Fatal(err)
	}
	if err := WaitFrozen(ctx, id); err != nil {
		t.Fatal(err)
	}
	cpu := func() string {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		return string(b)
	}
	before := cpu()
	time.Sleep(200 * time.Millisecond) // a busy loop would use CPU in this time
	if after := cpu(); after != before {
		t.Fatalf("the task ran after WaitFrozen:\n%s\n%s", before, after)
	}
	_ = os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED"), 0)
}

// TestCPUQuotaFormats: CPUQuota and SetCPUQuota speak v1's two files and a
// unified cgroup's cpu.max ("max" = unlimited), never create a control
// file, and refuse a quota that is no limit.
func TestCPUQuotaFormats(t *testing.T) {
	root := t.TempDir()
	old := Root
	Root = root
	t.Cleanup(func() { Root = old })
	write := func(path, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	v1 := filepath.Join(root, "cpu", Parent, "one")
	write(filepath.Join(v1, "cpu.cfs_quota_us"), "-1\n")
	write(filepath.Join(v1, "cpu.cfs_period_us"), "100000\n")
	v2 := filepath.Join(root, Parent, "two", "cpu.max")
	write(v2, "max 100000\n")

	for _, id := range []string{"one", "two"} {
		if q, p, err := CPUQuota(id); err != nil || q != -1 || p != 100000 {
			t.Errorf("%s unlimited: %d %d %v", id, q, p, err)
		}
		if err := SetCPUQuota(id, 150000, 100000); err != nil {
			t.Fatalf("SetCPUQuota %s: %v", id, err)
		}
		if q, p, err := CPUQuota(id); err != nil || q != 150000 || p != 100000 {
			t.Errorf("%s after SetCPUQuota: %d %d %v", id, q, p, err)
		}
	}
	if b, _ := os.ReadFile(v2); string(b) != "150000 100000" {
		t.Errorf("cpu.max = %q", b)
	}
	if err := SetCPUQuota("none", 100000, 100000); err == nil {
		t.Error("SetCPUQuota of a container without cgroups succeeded")
	}
	// A cgroup directory without the cpu controller's files: an error,
	// and no file made.
	if err := os.MkdirAll(filepath.Join(root, Parent, "three"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := SetCPUQuota("three", 100000, 100000); err == nil {
		t.Error("SetCPUQuota of a cgroup without a cpu controller succeeded")
	}
	if _, err := os.Stat(filepath.Join(root, Parent, "three", "cpu.max")); !os.IsNotExist(err) {
		t.Errorf("SetCPUQuota made a control file: %v", err)
	}
	for _, bad := range [][2]int64{{0, 100000}, {-1, 100000}, {100000, 0}} {
		if err := SetCPUQuota("one", bad[0], bad[1]); err == nil {
			t.Errorf("SetCPUQuota(%d, %d) accepted", bad[0], bad[1])
		}
	}
	if _, _, err := CPUQuota("../one"); err == nil {
		t.Error("CPUQuota took a path for an id")
	}
}
