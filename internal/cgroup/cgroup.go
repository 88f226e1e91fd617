// Package cgroup finds and removes cella's cgroups. Every container cella
// starts gets the cgroupsPath "/cella/<id>", so on this host's v1 (hybrid)
// layout its cgroups are /sys/fs/cgroup/<hierarchy>/cella/<id> in every
// mounted hierarchy (and, if the unified hierarchy is used, under it).
//
// The runtimes create these directories; they do not always remove them
// (runsc leaves empty ones behind after a failed boot, and nothing removes
// them after a daemon crash), so Destroy and crash reconciliation call
// Remove, which first kills whatever still runs inside.
package cgroup

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Parent is the cgroup directory, relative to each hierarchy's root, that
// holds every cella container's cgroup.
const Parent = "cella"

// Root is where cgroup hierarchies are mounted. A variable for tests.
var Root = "/sys/fs/cgroup"

var idRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// Path returns the OCI cgroupsPath of container id.
func Path(id string) string { return "/" + Parent + "/" + id }

// hierarchies returns the cgroup mount points below Root (each v1
// hierarchy and the unified one), read from /proc/self/mountinfo so that
// co-mounted controllers (cpu,cpuacct) or symlinks are not visited twice.
func hierarchies() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("list cgroup hierarchies: %w", err)
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		i := slices.Index(f, "-")
		if i < 0 || i+1 >= len(f) || len(f) < 5 {
			continue
		}
		if fstype := f[i+1]; fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		mp := f[4]
		if strings.HasPrefix(mp, Root+"/") || mp == Root {
			if !slices.Contains(out, mp) {
				out = append(out, mp)
			}
		}
	}
	return out, nil
}

// Dirs returns every existing cgroup directory of container id.
func Dirs(id string) ([]string, error) {
	if !idRE.MatchString(id) {
		return nil, fmt.Errorf("invalid container id %q", id)
	}
	hs, err := hierarchies()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, h := range hs {
		d := filepath.Join(h, Parent, id)
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			out = append(out, d)
		}
	}
	return out, nil
}

// List returns the IDs that have a cgroup directory under cella's parent
// in any hierarchy, sorted.
func List() ([]string, error) {
	hs, err := hierarchies()
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, h := range hs {
		ents, err := os.ReadDir(filepath.Join(h, Parent))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list cgroups: %w", err)
		}
		for _, e := range ents {
			if e.IsDir() && !slices.Contains(ids, e.Name()) {
				ids = append(ids, e.Name())
			}
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// Pids returns the processes in container id's cgroups (all hierarchies,
// nested cgroups included), without duplicates.
func Pids(id string) ([]int, error) {
	dirs, err := Dirs(id)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, d := range dirs {
		p, err := treePids(d)
		if err != nil {
			return nil, err
		}
		for _, pid := range p {
			if !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
	}
	return pids, nil
}

func treePids(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed under us
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids, err
}

// Age is how long ago the youngest of container id's cgroup directories
// was made (or last gained a child): an empty cgroup that young may belong
// to a container another daemon is creating right now.
func Age(id string) (time.Duration, error) {
	dirs, err := Dirs(id)
	if err != nil {
		return 0, err
	}
	age := time.Duration(-1)
	for _, d := range dirs {
		st, err := os.Stat(d)
		if err != nil {
			continue
		}
		if a := time.Since(st.ModTime()); age < 0 || a < age {
			age = a
		}
	}
	if age < 0 {
		return 0, fmt.Errorf("cgroups of %s: none found", id)
	}
	return age, nil
}

// Remove kills every process left in container id's cgroups and removes
// the directories (nested ones first) in every hierarchy. A container
// without cgroups is not an error.
func Remove(id string) error {
	dirs, err := Dirs(id)
	if err != nil {
		return err
	}
	if len(dirs) == 0 {
		return nil
	}
	if err := kill(id, dirs); err != nil {
		return fmt.Errorf("remove cgroups of %s: %w", id, err)
	}
	var errs []error
	for _, d := range dirs {
		if err := rmTree(d); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove cgroups of %s: %w", id, err)
	}
	return nil
}

// RemoveOrphans removes the cgroups under cella's parent that keep does not
// claim and that no container uses: the parent is shared by every daemon on
// the host, so a cgroup with processes inside is another daemon's
// container, and an empty one made less than minAge ago is one being
// created (its first process is not in yet). It returns the IDs removed.
func RemoveOrphans(keep func(id string) bool, minAge time.Duration) ([]string, error) {
	ids, err := List()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, id := range ids {
		if keep(id) {
			continue
		}
		if pids, err := Pids(id); err != nil || len(pids) > 0 {
			continue
		}
		if age, err := Age(id); err != nil || age < minAge {
			continue
		}
		if err := Remove(id); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

// kill SIGKILLs the processes in dirs until none is left. A frozen cgroup
// is thawed first: a frozen task does not die until thawed.
func kill(id string, dirs []string) error {
	for _, d := range dirs {
		_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				if st, err := os.ReadFile(filepath.Join(p, "freezer.state")); err == nil && !bytes.HasPrefix(st, []byte("THAWED")) {
					_ = os.WriteFile(filepath.Join(p, "freezer.state"), []byte("THAWED"), 0)
				}
			}
			return nil
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var pids []int
		for _, d := range dirs {
			p, err := treePids(d)
			if err != nil {
				return err
			}
			pids = append(pids, p...)
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d processes survive SIGKILL: %v", len(pids), pids)
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rmTree removes a cgroup directory and its sub-cgroups, deepest first
// (cgroup dirs are removed with rmdir; their files cannot be unlinked).
// EBUSY right after the last process died is retried briefly: the kernel
// releases a cgroup asynchronously from the exit of its last task.
func rmTree(dir string) error {
	var sub []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			sub = append(sub, p)
		}
		return nil
	})
	slices.Reverse(sub)
	for _, d := range sub {
		var err error
		for i := 0; i < 100; i++ {
			err = unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				err = nil
				break
			}
			if !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("rmdir %s: %w", d, err)
		}
	}
	return nil
}

// MemoryLimit reads container id's v1 memory ceiling in bytes (for tests and
// diagnostics).
func MemoryLimit(id string) (int64, error) {
	n, err := readInt(filepath.Join(Root, "memory", Parent, id, "memory.limit_in_bytes"))
	if err != nil {
		return 0, fmt.Errorf("read memory limit of %s: %w", id, err)
	}
	return n, nil
}

// CPUQuota reads container id's CFS bandwidth: the quota and period in
// microseconds, quota -1 when unlimited (v1 cpu.cfs_quota_us and
// cpu.cfs_period_us, else a unified cgroup's cpu.max).
func CPUQuota(id string) (quota, period int64, err error) {
	if !idRE.MatchString(id) {
		return 0, 0, fmt.Errorf("invalid container id %q", id)
	}
	v1 := filepath.Join(Root, "cpu", Parent, id)
	quota, err = readInt(filepath.Join(v1, "cpu.cfs_quota_us"))
	if err == nil {
		period, err = readInt(filepath.Join(v1, "cpu.cfs_period_us"))
	}
	if !errors.Is(err, fs.ErrNotExist) {
		if err != nil {
			return 0, 0, fmt.Errorf("read cpu quota of %s: %w", id, err)
		}
		return quota, period, nil
	}
	b, err := os.ReadFile(filepath.Join(Root, Parent, id, "cpu.max"))
	if err != nil {
		return 0, 0, fmt.Errorf("read cpu quota of %s: %w", id, err)
	}
	q, p, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	if period, err = strconv.ParseInt(p, 10, 64); err != nil {
		return 0, 0, fmt.Errorf("read cpu quota of %s: cpu.max %q", id, b)
	}
	if q == "max" {
		return -1, period, nil
	}
	if quota, err = strconv.ParseInt(q, 10, 64); err != nil {
		return 0, 0, fmt.Errorf("read cpu quota of %s: cpu.max %q", id, b)
	}
	return quota, period, nil
}

// SetCPUQuota sets container id's CFS bandwidth to quota microseconds of
// CPU time every period (quota > 0), where CPUQuota reads it. The cgroup
// must exist: its runtime made it.
func SetCPUQuota(id string, quota, period int64) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("invalid container id %q", id)
	}
	if quota <= 0 || period <= 0 {
		return fmt.Errorf("set cpu quota of %s: quota %d and period %d must be positive", id, quota, period)
	}
	v1 := filepath.Join(Root, "cpu", Parent, id)
	if _, err := os.Stat(filepath.Join(v1, "cpu.cfs_quota_us")); err == nil {
		// The period first: the kernel checks each write against the
		// other value, and the period is the one that does not change.
		if err := writeFile(filepath.Join(v1, "cpu.cfs_period_us"), strconv.FormatInt(period, 10)); err != nil {
			return fmt.Errorf("set cpu period of %s: %w", id, err)
		}
		if err := writeFile(filepath.Join(v1, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10)); err != nil {
			return fmt.Errorf("set cpu quota of %s: %w", id, err)
		}
		return nil
	}
	if err := writeFile(filepath.Join(Root, Parent, id, "cpu.max"), fmt.Sprintf("%d %d", quota, period)); err != nil {
		return fmt.Errorf("set cpu quota of %s: %w", id, err)
	}
	return nil
}

// writeFile writes an existing control file (never creates one: a missing
// cgroup is an error, not a new file).
func writeFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Usage is a container's resource use as its cgroups account it.
type Usage struct {
	// CPU is the CPU time the container used since its cgroup was made.
	CPU time.Duration
	// Memory is what the container is charged, page cache included;
	// FileCache is the part of it that is reclaimable file cache. gVisor's
	// guest memory is shared memory, so it counts as used, not as cache.
	Memory, FileCache int64
	// OOMKills counts the processes the memory ceiling killed (v1
	// memory.oom_control's oom_kill); PidsMaxHits the forks the pids
	// ceiling refused (pids.events' max). Both stay readable after the
	// container's processes died, until its cgroups are removed.
	OOMKills, PidsMaxHits int64
}

// ReadUsage reads container id's CPU and memory use and its limit counters:
// from the v1 cpuacct, memory and pids hierarchies, else from a unified
// (v2) cgroup. A container without cgroups is an fs.ErrNotExist.
func ReadUsage(id string) (Usage, error) {
	if !idRE.MatchString(id) {
		return Usage{}, fmt.Errorf("invalid container id %q", id)
	}
	if u, err := readUsageV1(id); !errors.Is(err, fs.ErrNotExist) {
		return u, err
	}
	return readUsageV2(id)
}

func readUsageV1(id string) (Usage, error) {
	var u Usage
	cpu, err := readInt(filepath.Join(Root, "cpuacct", Parent, id, "cpuacct.usage"))
	if err != nil {
		return u, fmt.Errorf("read cpu usage of %s: %w", id, err)
	}
	mem, err := readInt(filepath.Join(Root, "memory", Parent, id, "memory.usage_in_bytes"))
	if err != nil {
		return u, fmt.Errorf("read memory usage of %s: %w", id, err)
	}
	stat, err := readKeyed(filepath.Join(Root, "memory", Parent, id, "memory.stat"))
	if err != nil {
		return u, fmt.Errorf("read memory stat of %s: %w", id, err)
	}
	u.CPU = time.Duration(cpu)
	u.Memory = mem
	u.FileCache = stat["total_active_file"] + stat["total_inactive_file"]
	// The counters are best effort: a hierarchy that is not mounted has
	// none to report.
	oom, _ := readKeyed(filepath.Join(Root, "memory", Parent, id, "memory.oom_control"))
	pids, _ := readKeyed(filepath.Join(Root, "pids", Parent, id, "pids.events"))
	u.OOMKills, u.PidsMaxHits = oom["oom_kill"], pids["max"]
	return u, nil
}

func readUsageV2(id string) (Usage, error) {
	var u Usage
	dir := filepath.Join(Root, Parent, id)
	cpu, err := readKeyed(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return u, fmt.Errorf("read cpu usage of %s: %w", id, err)
	}
	mem, err := readInt(filepath.Join(dir, "memory.current"))
	if err != nil {
		return u, fmt.Errorf("read memory usage of %s: %w", id, err)
	}
	stat, err := readKeyed(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return u, fmt.Errorf("read memory stat of %s: %w", id, err)
	}
	u.CPU = time.Duration(cpu["usage_usec"]) * time.Microsecond
	u.Memory = mem
	u.FileCache = stat["file"] - stat["shmem"]
	events, _ := readKeyed(filepath.Join(dir, "memory.events"))
	pids, _ := readKeyed(filepath.Join(dir, "pids.events"))
	u.OOMKills, u.PidsMaxHits = events["oom_kill"], pids["max"]
	return u, nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// readKeyed parses a "key value" per line file (memory.stat, cpu.stat).
func readKeyed(path string) (map[string]int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, nil
}

// WaitFrozen returns once container id's v1 freezer cgroup says FROZEN.
// Writing FROZEN to freezer.state (what `crun pause` does) only starts the
// freeze: the state reads FREEZING until every task has stopped, which a
// task inside a system call (disk I/O) can delay, and the kernel may need
// the request again. Until FROZEN the container still runs, so a pause is
// not done before it.
func WaitFrozen(ctx context.Context, id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("invalid container id %q", id)
	}
	path := filepath.Join(Root, "freezer", Parent, id, "freezer.state")
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("freezer state of %s: %w", id, err)
		}
		switch st := string(bytes.TrimSpace(b)); st {
		case "FROZEN":
			return nil
		case "FREEZING":
			_ = os.WriteFile(path, []byte("FROZEN"), 0)
		default:
			return fmt.Errorf("freezer state of %s is %s, not freezing", id, st)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("freezer of %s still FREEZING: %w", id, ctx.Err())
		case <-t.C:
		}
	}
}
