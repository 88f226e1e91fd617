package agent

import (
	"bytes"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/agentapi"
)

// defaultOutputBytes caps a command's output when the config has no cap.
const defaultOutputBytes = 10 << 20

// The watchdog's cadence while commands run. Each sample wakes the agent
// and, under gVisor, makes the sentry look for newly committed pages of
// the sandbox (guestCharge): at a fixed 20 ms a sandbox running a mere
// `sleep` cost its host ~115 ms of CPU a second (beside 2 ms idle, 7 ms at
// one sample a second), a tenth of a core per busy sandbox. So the next
// sample comes when the memory left under the limit could be used up by
// the sandbox's CPUs each allocating at allocRate, at least
// minSampleInterval and at most maxSampleInterval later, and at once
// (minSampleInterval) after a command starts: a hog allocating that fast
// reaches the limit no earlier than the sample that finds it there, and
// overshoots it by at most minSampleInterval of allocation (~40 MB per CPU
// under gVisor), as a fixed 20 ms did; the host cgroup's ceiling (a
// quarter of the limit above it, plus headroom) is the margin for one
// faster still. Pids are refused at fork time (the guest's commands
// cgroup, the host's pids cgroup); the sample names the limit and ends
// the session, at the shortest interval once half the limit is in use.
const (
	minSampleInterval = 20 * time.Millisecond
	maxSampleInterval = 500 * time.Millisecond
)

// allocRate is how fast one CPU of a sandbox of runtime rt may be taken to
// commit memory, in bytes a second: gVisor's sentry handles every fault of
// a new page, the namespaces runtime's kernel faults at native speed.
func allocRate(rt string) float64 {
	if rt == "namespaces" {
		return 8 << 30
	}
	return 2 << 30
}

// nextSample is how long after a sample that found mem bytes charged and
// count processes the next may wait (mem < 0: unknown), for a sandbox of
// runtime rt with limits.
func nextSample(rt string, limits agentapi.Limits, mem, count int64) time.Duration {
	d := maxSampleInterval
	if limits.MemoryBytes > 0 {
		if mem < 0 {
			return minSampleInterval
		}
		rate := allocRate(rt) * max(1, math.Ceil(limits.CPUs))
		left := max(limits.MemoryBytes-mem, 0)
		d = min(d, time.Duration(float64(left)/rate*float64(time.Second)))
	}
	if limits.Pids > 0 && 2*count >= limits.Pids {
		d = minSampleInterval
	}
	return max(d, minSampleInterval)
}

// The named errors. Each says which limit was hit, its value and the flag
// that raises it, so that an agent reading the error can act on it.

func timeoutReason(d time.Duration) string {
	return fmt.Sprintf("killed: command timeout %s reached (raise with --timeout)", formatDuration(d))
}

func memoryReason(limit int64) string {
	return fmt.Sprintf("killed: sandbox memory limit %s reached (raise with --memory)", formatBytes(limit))
}

func pidsReason(limit int64) string {
	return fmt.Sprintf("killed: sandbox pids limit %d reached (raise with --pids)", limit)
}

func diskReason(limit int64) string {
	return fmt.Sprintf("sandbox disk limit %s reached (raise with --disk)", formatBytes(limit))
}

// uploadDiskReason is diskReason for a files API client: the size in MiB,
// and the create request's field (E2B's diskSizeMB) beside the CLI flag.
func uploadDiskReason(limit int64) string {
	return fmt.Sprintf("sandbox disk limit %d MiB reached (raise with --disk / diskSizeMB)", limit>>20)
}

func truncationMarker(limit int64) string {
	return fmt.Sprintf("\n[cella: output truncated at %s (raise with --output-limit)]\n", formatBytes(limit))
}

// formatBytes renders sizes the way users type them: 512 MiB, 1 GiB, 1.5 GiB.
func formatBytes(n int64) string {
	units := []struct {
		size int64
		name string
	}{{1 << 40, "TiB"}, {1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}}
	for _, u := range units {
		if n >= u.size {
			v := float64(n) / float64(u.size)
			s := strconv.FormatFloat(v, 'f', 1, 64)
			s = trimZeroFraction(s)
			return s + " " + u.name
		}
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// formatDuration renders 55s, 1.5s, 300s, 250ms (time.Duration.String would
// say 5m0s, which does not match what the user passed to --timeout).
func formatDuration(d time.Duration) string {
	if d < time.Second {
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	}
	return trimZeroFraction(strconv.FormatFloat(d.Seconds(), 'f', 3, 64)) + "s"
}

func trimZeroFraction(s string) string {
	if !bytes.ContainsRune([]byte(s), '.') {
		return s
	}
	for s[len(s)-1] == '0' {
		s = s[:len(s)-1]
	}
	return trimSuffixDot(s)
}

func trimSuffixDot(s string) string {
	if s[len(s)-1] == '.' {
		return s[:len(s)-1]
	}
	return s
}

// watchdog enforces the memory and pids limits by sampling /proc while at
// least one command runs. It is idle (no goroutine) otherwise.
type watchdog struct {
	s *Server

	// started wakes a running sampling loop when a command starts, so
	// that the command is sampled soon however long the loop's wait.
	started chan struct{}

	mu      sync.Mutex
	running bool
	// lingering are the sessions of ended commands that may still have
	// members (`cmd &`, a fork bomb whose first shell returned at once):
	// they stay under the limits until they are empty.
	lingering map[int]bool

	cgroup commandCgroup // gVisor: the pids cap at fork time
	charge guestCharge   // gVisor: what the sandbox's memory costs
}

// guestCgroupDir is where gVisor mounts its own cgroup v2 hierarchy inside
// the sandbox (runsc --in-sandbox-cgroup=v2; internal/runtime/gvisor). It
// lives in the sentry: its limits cost the host nothing and bind only the
// sandbox.
const guestCgroupDir = "/sys/fs/cgroup"

// commandCgroupName is the guest cgroup every command starts in.
const commandCgroupName = "cella-commands"

// commandCgroup caps the tasks of all commands of a gVisor sandbox at fork
// time. The watchdog alone cannot stop a fork bomb there: the bomb's
// runnable processes starve the agent (each is one more guest task the
// sentry schedules beside it) while every new process costs about two host
// tasks (a systrap stub), until the host pids ceiling refuses a fork and the
// whole sandbox dies. gVisor's pids controller refuses the fork inside the
// sentry instead (EAGAIN, as the kernel's does under the namespaces
// runtime): the bomb stops growing, its shells back off, and the watchdog
// gets the CPU to kill it. Commands are cloned straight into the cgroup
// (clone3 CLONE_INTO_CGROUP), so not one of their forks happens outside it.
type commandCgroup struct {
	mu    sync.Mutex
	tried bool
	fd    int   // the cgroup directory, -1 when there is none
	max   int64 // the pids.max written
}

// sysProcAttr is the SysProcAttr of a command the agent starts: its own
// session, and under gVisor the commands' cgroup.
func (s *Server) sysProcAttr() *syscall.SysProcAttr {
	sys := &syscall.SysProcAttr{Setsid: true}
	s.watchdog.charge.open(s) // before the first command can touch the mount
	if fd, ok := s.watchdog.cgroup.dir(s); ok {
		sys.UseCgroupFD, sys.CgroupFD = true, fd
	}
	return sys
}

// dir returns the commands' cgroup, made on first use with pids.max from
// the config (kept up to date with it). Only inside a gVisor sandbox whose
// guest has cgroup v2; anywhere else (tests on the host, the namespaces
// runtime, whose host pids cgroup already refuses forks) there is none.
func (c *commandCgroup) dir(s *Server) (int, bool) {
	cfg := s.config()
	if !s.opts.SandboxWide || cfg.Runtime != "gvisor" || cfg.Limits.Pids <= 0 {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.tried {
		c.tried, c.fd = true, -1
		fd, err := openCommandCgroup(filepath.Join(guestCgroupDir, commandCgroupName))
		if err != nil {
			slog.Warn("no guest pids cgroup: a fork bomb can outrun the watchdog", "err", err)
			return 0, false
		}
		c.fd = fd
	}
	if c.fd < 0 {
		return 0, false
	}
	if want := cfg.Limits.Pids + agentapi.CommandPidsSlack; c.max != want {
		if err := writeCgroupFile(c.fd, "pids.max", strconv.FormatInt(want, 10)); err != nil {
			slog.Warn("set the commands' pids.max", "max", want, "err", err)
		} else {
			c.max = want
		}
	}
	return c.fd, true
}

// openCommandCgroup makes (or finds again: a cold boot on kept files sees a
// fresh hierarchy, a restore the old one) the cgroup at path and opens it.
func openCommandCgroup(path string) (int, error) {
	root, err := openCgroup2Dir(filepath.Dir(path))
	if err != nil {
		return -1, err
	}
	defer unix.Close(root)
	name := filepath.Base(path)
	if err := unix.Mkdirat(root, name, 0o755); err != nil && err != unix.EEXIST {
		return -1, fmt.Errorf("mkdir %s: %w", path, err)
	}
	fd, err := unix.Openat(root, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", path, err)
	}
	return fd, nil
}

func writeCgroupFile(dirfd int, name, value string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(value))
	return err
}

// guestCharge is the guest root cgroup's memory.current under gVisor: the
// sentry's memory accounting of every guest process, each page once — a
// library mapped by a dozen processes once, as the host charges it, where
// summing the processes' statm counts it a dozen times (gVisor's statm
// reports no shared pages). It is the root's, not the commands' cgroup's,
// so a process that moves to another cgroup (root may) is still counted,
// and the directory is opened before the first command starts, so a mount
// over /sys/fs/cgroup later cannot stand in a file of its own.
type guestCharge struct {
	mu    sync.Mutex
	tried bool
	dir   int // the guest cgroup root, -1 when there is none

	// The sampling loop's own (no lock): the last reading and when the
	// next may be taken.
	last   int64
	lastOK bool
	next   time.Time
	// killedAt is the charge at the last kill, until the charge is below
	// the limit again: the sentry counts a killed process's pages until
	// its releaser has returned them, so until then a charge that is not
	// above the one at the kill is the dead command's, not a new one's.
	killedAt int64
}

// over reports whether charge c over limit calls for a kill (which the
// caller then makes).
func (g *guestCharge) over(c, limit int64) bool {
	switch {
	case c <= limit:
		g.killedAt = 0
		return false
	case g.killedAt > 0 && c <= g.killedAt:
		return false // still releasing what the last kill freed
	}
	g.killedAt = c
	return true
}

// chargeCostRatio bounds the reads of memory.current to 1/chargeCostRatio
// of a CPU. A read makes the sentry look for newly committed pages of the
// sandbox (mincore over what it does not know to be committed yet):
// measured 0.5 ms idle, 0.9 ms with 1.2 GiB in use and 2.1 ms with a 3 GiB
// mapping touched every 2 MiB, so at 20 ms samples it is never skipped but
// in extreme cases.
const chargeCostRatio = 8

// current returns the sandbox's charge, read anew unless the last read was
// so slow that the loop must wait for the next (then the last reading).
func (g *guestCharge) current(dir int, buf []byte) (int64, bool) {
	start := time.Now()
	if start.Before(g.next) {
		return g.last, g.lastOK
	}
	g.last, g.lastOK = readCharge(dir, buf)
	g.next = start.Add(chargeCostRatio * time.Since(start))
	return g.last, g.lastOK
}

// open opens the guest cgroup root once, under gVisor only (elsewhere the
// processes' resident-minus-shared sum is what the kernel charges).
func (g *guestCharge) open(s *Server) {
	_, _ = g.fd(s)
}

// fd returns the guest cgroup root directory, opening it on first use.
func (g *guestCharge) fd(s *Server) (int, bool) {
	if !s.opts.SandboxWide || s.config().Runtime != "gvisor" {
		return -1, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.tried {
		g.tried, g.dir = true, -1
		fd, err := openCgroup2Dir(guestCgroupDir)
		if err == nil {
			if _, ok := readCharge(fd, make([]byte, 4096)); !ok {
				unix.Close(fd)
				err = fmt.Errorf("no memory.current in %s", guestCgroupDir)
			}
		}
		if err != nil {
			slog.Warn("no guest memory accounting: the memory limit counts every process's resident memory", "err", err)
			return -1, false
		}
		g.dir = fd
	}
	return g.dir, g.dir >= 0
}

// openCgroup2Dir opens path if it is a cgroup v2 mount.
func openCgroup2Dir(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", path, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		unix.Close(fd)
		return -1, fmt.Errorf("%s is not a cgroup v2 mount", path)
	}
	return fd, nil
}

// readCharge reads memory.current in dirfd, minus the agent's own resident
// memory (the limit is the commands'; the agent's is the sandbox's base).
func readCharge(dirfd int, buf []byte) (int64, bool) {
	fd, err := unix.Openat(dirfd, "memory.current", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	n, err := unix.Read(fd, buf)
	unix.Close(fd)
	if err != nil || n <= 0 {
		return 0, false
	}
	c, err := strconv.ParseInt(string(bytes.TrimSpace(buf[:n])), 10, 64)
	if err != nil {
		return 0, false
	}
	if self, ok := readResident(os.Getpid(), buf); ok {
		c -= self * int64(os.Getpagesize())
	}
	return max(c, 0), true
}

// track keeps watching the session of an ended command.
func (w *watchdog) track(sid int) {
	if l := w.s.config().Limits; l.MemoryBytes <= 0 && l.Pids <= 0 {
		return
	}
	w.mu.Lock()
	if w.lingering == nil {
		w.lingering = map[int]bool{}
	}
	w.lingering[sid] = true
	w.mu.Unlock()
	w.kick()
}

func (w *watchdog) lingeringSessions() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]int, 0, len(w.lingering))
	for sid := range w.lingering {
		out = append(out, sid)
	}
	return out
}

// kick starts the sampling loop if it is not running. Call it after a
// command was registered as running.
func (w *watchdog) kick() {
	if l := w.s.config().Limits; l.MemoryBytes <= 0 && l.Pids <= 0 {
		return // nothing to enforce: stay idle
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started == nil {
		w.started = make(chan struct{}, 1)
	}
	if w.running {
		select {
		case w.started <- struct{}{}:
		default: // a wake is pending already
		}
		return
	}
	w.running = true
	go w.loop(w.started)
}

func (w *watchdog) loop(started <-chan struct{}) {
	due := time.Now().Add(minSampleInterval)
	t := time.NewTimer(minSampleInterval)
	defer t.Stop()
	buf := make([]byte, 4096)
	for {
		select {
		case <-t.C:
		case <-started:
			// A new command: sampled within minSampleInterval, never
			// later than already due (commands started in quick
			// succession must not keep pushing the sample away). Reset
			// of a pending timer: its channel holds no stale tick.
			if soon := time.Now().Add(minSampleInterval); soon.Before(due) {
				due = soon
				t.Reset(minSampleInterval)
			}
			continue
		case <-w.s.done:
			w.mu.Lock()
			w.running = false
			w.mu.Unlock()
			return
		}
		live := w.s.procs.running()
		if len(live) == 0 {
			w.mu.Lock()
			// Re-check under mu: kick() registers before it takes mu, so
			// a command started now is either seen here or restarts us.
			if len(w.lingering) == 0 && len(w.s.procs.running()) == 0 {
				w.running = false
				w.mu.Unlock()
				return
			}
			w.mu.Unlock()
		}
		next := w.sample(live, buf)
		due = time.Now().Add(next)
		t.Reset(next)
	}
}

// sessionUsage is what the watchdog learns about one session.
type sessionUsage struct {
	count int64
	rss   int64 // resident bytes: anonymous (statm's resident minus shared), or all under gVisor
}

// sample enforces the limits once and returns when the next sample is due.
func (w *watchdog) sample(live []*proc, buf []byte) time.Duration {
	cfg := w.s.config()
	limits := cfg.Limits
	lingering := w.lingeringSessions()
	if limits.MemoryBytes <= 0 && limits.Pids <= 0 {
		w.mu.Lock()
		clear(w.lingering)
		w.mu.Unlock()
		return maxSampleInterval
	}
	bySID := make(map[int]*proc, len(live)+len(lingering))
	for _, sid := range lingering {
		bySID[sid] = nil
	}
	for _, p := range live {
		bySID[p.pid] = p
	}
	// Under gVisor the guest cgroup's charge is the sandbox's memory (one
	// read); the per-process walk, which counts every mapped library once
	// per process there, only picks the session to kill once it is over.
	chargeFD, charged := w.charge.fd(w.s)
	usage, members, total := scanSessions(buf, w.s.opts.SandboxWide, bySID, limits.MemoryBytes > 0 && !charged)
	mem := total.rss // what the next sample's wait is reckoned from
	if limits.MemoryBytes > 0 && charged {
		total.rss = 0
		c, ok := w.charge.current(chargeFD, buf)
		mem = c
		if !ok {
			mem = -1
		}
		if ok && w.charge.over(c, limits.MemoryBytes) {
			total.rss = c
			sessionRSS(usage, members, buf)
		}
	}
	next := nextSample(cfg.Runtime, limits, mem, total.count)
	w.mu.Lock()
	for _, sid := range lingering {
		if usage[sid] == nil {
			delete(w.lingering, sid)
		}
	}
	w.mu.Unlock()

	if limits.Pids > 0 {
		var worst int
		var worstN int64
		for sid, u := range usage {
			if u.count > worstN {
				worst, worstN = sid, u.count
			}
			if u.count > limits.Pids {
				w.s.killSession(sid, bySID[sid], pidsReason(limits.Pids), members[sid])
			}
		}
		if w.s.opts.SandboxWide && total.count > limits.Pids && worstN <= limits.Pids && worst != 0 {
			w.s.killSession(worst, bySID[worst], pidsReason(limits.Pids), members[worst])
		}
	}
	if limits.MemoryBytes > 0 && total.rss > limits.MemoryBytes {
		var worst int
		var worstRSS int64 = -1
		for sid, u := range usage {
			if u.rss > worstRSS {
				worst, worstRSS = sid, u.rss
			}
		}
		if worst != 0 {
			slog.Warn("memory limit reached", "limit", limits.MemoryBytes, "total", total.rss, "session", worst, "session_rss", worstRSS)
			w.s.killSession(worst, bySID[worst], memoryReason(limits.MemoryBytes), members[worst])
		}
	}
	return next
}

// scanSessions walks /proc and sums the process count and anonymous RSS per
// session. Only live processes count (zombies are already dead and hold no
// memory). With sandboxWide every process but the agent counts; otherwise
// only the sessions of commands we started (tests run on a shared host).
//
// RSS is resident minus file-backed pages (statm's "shared"): shared
// libraries and page cache would otherwise be counted once per process.
func scanSessions(buf []byte, sandboxWide bool, ours map[int]*proc, withMem bool) (map[int]*sessionUsage, map[int][]int, sessionUsage) {
	usage := map[int]*sessionUsage{}
	members := map[int][]int{}
	var total sessionUsage
	d, err := os.Open("/proc")
	if err != nil {
		return usage, members, total
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	self := os.Getpid()
	page := int64(os.Getpagesize())
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid == self {
			continue
		}
		state, sid, ok := readStat(pid, buf)
		if !ok || state == 'Z' || state == 'X' {
			continue
		}
		if !sandboxWide {
			if _, mine := ours[sid]; !mine {
				continue
			}
		}
		u := usage[sid]
		if u == nil {
			u = &sessionUsage{}
			usage[sid] = u
		}
		u.count++
		total.count++
		members[sid] = append(members[sid], pid)
		if withMem {
			if rss, ok := readAnonRSS(pid, buf); ok {
				u.rss += rss * page
				total.rss += rss * page
			}
		}
	}
	return usage, members, total
}

// sessionRSS fills in each session's resident bytes from its members'
// statm: under gVisor, whose statm has no shared pages, this over-counts
// libraries, so it only ranks sessions, never decides whether to kill.
func sessionRSS(usage map[int]*sessionUsage, members map[int][]int, buf []byte) {
	page := int64(os.Getpagesize())
	for sid, pids := range members {
		for _, pid := range pids {
			if rss, ok := readAnonRSS(pid, buf); ok {
				usage[sid].rss += rss * page
			}
		}
	}
}

// readStat returns the state and session id from /proc/<pid>/stat.
func readStat(pid int, buf []byte) (byte, int, bool) {
	n, ok := readProcFile(pid, "/stat", buf)
	if !ok {
		return 0, 0, false
	}
	b := buf[:n]
	// comm may contain spaces and parens; fields resume after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+2:])
	// state ppid pgrp session ...
	if len(f) < 4 || len(f[0]) == 0 {
		return 0, 0, false
	}
	sid, err := strconv.Atoi(string(f[3]))
	if err != nil {
		return 0, 0, false
	}
	return f[0][0], sid, true
}

// readAnonRSS returns resident minus shared pages from /proc/<pid>/statm.
func readAnonRSS(pid int, buf []byte) (int64, bool) {
	res, shared, ok := readStatm(pid, buf)
	return max(res-shared, 0), ok
}

// readResident returns the resident pages from /proc/<pid>/statm.
func readResident(pid int, buf []byte) (int64, bool) {
	res, _, ok := readStatm(pid, buf)
	return res, ok
}

// readStatm returns the resident and shared pages from /proc/<pid>/statm.
func readStatm(pid int, buf []byte) (res, shared int64, ok bool) {
	n, ok := readProcFile(pid, "/statm", buf)
	if !ok {
		return 0, 0, false
	}
	f := bytes.Fields(buf[:n])
	if len(f) < 3 {
		return 0, 0, false
	}
	res, err1 := strconv.ParseInt(string(f[1]), 10, 64)
	shared, err2 := strconv.ParseInt(string(f[2]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return res, shared, true
}

// readProcFile reads a small /proc file without the allocations of
// os.ReadFile; the watchdog does this for every process every 20 ms.
func readProcFile(pid int, file string, buf []byte) (int, bool) {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	n, err := unix.Read(fd, buf)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n, true
}

// sessionMembers lists the live processes of a session.
func sessionMembers(sid int) []int {
	buf := make([]byte, 4096)
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	var out []int
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		if state, s, ok := readStat(pid, buf); ok && s == sid && state != 'Z' {
			out = append(out, pid)
		}
	}
	return out
}

// killSession kills a whole session: its process group in one kill(2) (the
// kernel signals every member atomically, so a fork bomb cannot outrun it),
// then every known member that moved to another group.
func (s *Server) killSession(sid int, p *proc, reason string, members []int) {
	if p != nil {
		p.setKillReason(reason)
	}
	if sid <= 1 {
		return
	}
	slog.Warn("limit reached: killing the command's session", "sid", sid, "members", len(members), "reason", reason)
	_ = unix.Kill(-sid, unix.SIGKILL)
	for _, pid := range members {
		if pid != os.Getpid() && pid > 1 {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}

// diskFull reports whether the filesystem at path has (almost) no space left.
func diskFull(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Bavail*uint64(st.Bsize) < 1<<20
}
