package asuser

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain doubles as the user's process of TestRunThreadUntouchable: with
// ASUSER_ATTACK=pid:tid it tries to signal (signal 0: the permission check
// alone), ptrace, read, re-nice and re-pin that thread and prints what it
// could do.
func TestMain(m *testing.M) {
	if v := os.Getenv("ASUSER_ATTACK"); v != "" {
		var pid, tid int
		fmt.Sscanf(v, "%d:%d", &pid, &tid)
		if err := unix.Tgkill(pid, tid, 0); err == nil {
			fmt.Println("signalled")
		}
		if err := unix.PtraceSeize(tid); err == nil { // seize: no stop
			fmt.Println("attached")
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/environ", pid, tid)); err == nil {
			fmt.Printf("read environ (%d bytes)\n", len(b))
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, 19); err == nil {
			fmt.Println("reniced")
		}
		var one unix.CPUSet
		one.Set(0)
		if err := unix.SchedSetaffinity(tid, &one); err == nil {
			fmt.Println("repinned")
		}
		fmt.Println("done")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

var user = Identity{UID: 1000, GID: 1000, Groups: []uint32{1000, 4242}}

// threadsAllRoot fails the test if, within 10 s (a thread Go destroys
// leaves /proc a moment later), any thread of the process is still not
// root.
func threadsAllRoot(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		bad := notRoot()
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("threads not root: %v", bad)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// notRoot lists the threads of the process that are not plain root.
func notRoot() []string {
	var bad []string
	// The process's supplementary groups, as its main thread has them.
	groups := ""
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Groups:"); ok {
				groups = strings.Join(strings.Fields(v), " ")
			}
		}
	}
	tasks, _ := filepath.Glob("/proc/self/task/*/status")
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		for _, line := range strings.Split(string(b), "\n") {
			for _, k := range []string{"Uid:", "Gid:"} {
				if v, ok := strings.CutPrefix(line, k); ok && strings.Join(strings.Fields(v), " ") != "0 0 0 0" {
					bad = append(bad, p+": "+k+v)
				}
			}
			if v, ok := strings.CutPrefix(line, "CapEff:"); ok && strings.TrimSpace(v) == "0000000000000000" {
				bad = append(bad, p+": no effective capabilities left")
			}
			if v, ok := strings.CutPrefix(line, "Groups:"); ok && strings.Join(strings.Fields(v), " ") != groups {
				bad = append(bad, p+": Groups:"+v)
			}
		}
	}
	return bad
}

func TestRunActsAsUser(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("root only"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Run(user, func() error {
		if u := unix.Geteuid(); u != 1000 {
			t.Errorf("euid %d inside, want 1000", u)
		}
		if _, err := os.ReadFile(secret); !errors.Is(err, os.ErrPermission) {
			t.Errorf("read a root-only file as the user: %v", err)
		}
		if err := os.Chown(filepath.Join(dir), 1000, 1000); !errors.Is(err, os.ErrPermission) {
			t.Errorf("chown as the user: %v", err)
		}
		return os.WriteFile(filepath.Join(dir, "mine"), []byte("x"), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "mine"))
	if err != nil {
		t.Fatal(err)
	}
	if s := st.Sys().(*syscall.Stat_t); s.Uid != 1000 || s.Gid != 1000 {
		t.Fatalf("created file owned by %d:%d, want 1000:1000", s.Uid, s.Gid)
	}
	// Supplementary groups apply: a file of group 4242, mode 0060.
	grp := filepath.Join(dir, "grp")
	if err := os.WriteFile(grp, nil, 0o060); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(grp, 0, 4242); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(grp, 0o060); err != nil {
		t.Fatal(err)
	}
	if err := Run(user, func() error { return os.WriteFile(grp, []byte("g"), 0) }); err != nil {
		t.Fatalf("write through a supplementary group: %v", err)
	}
	retire()
	threadsAllRoot(t)
}

// Concurrent root work on other goroutines never sees a user's identity.
func TestRunLeavesOtherThreadsRoot(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("root only"), 0o600); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var rootFailures, userReads int
	var mu sync.Mutex
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := os.ReadFile(secret); err != nil {
					mu.Lock()
					rootFailures++
					mu.Unlock()
				}
			}
		}()
	}
	for range 200 {
		_ = Run(user, func() error {
			if _, err := os.ReadFile(secret); err == nil {
				mu.Lock()
				userReads++
				mu.Unlock()
			}
			return nil
		})
	}
	close(stop)
	wg.Wait()
	if rootFailures != 0 || userReads != 0 {
		t.Fatalf("root reads failed %d times, user reads succeeded %d times", rootFailures, userReads)
	}
	retire()
	threadsAllRoot(t)
}

func TestRunPanicAndRoot(t *testing.T) {
	needRoot(t)
	retire()
	threadsAllRoot(t)
	// Long enough that a thread kept after the panic would still wait
	// (with the user's groups) when threadsAllRoot gives up.
	defer idleFor.Store(idleFor.Load())
	idleFor.Store(int64(time.Hour))
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v, want boom", p)
			}
		}()
		_ = Run(user, func() error { panic("boom") })
	}()
	// The thread that panicked is destroyed, not kept for the next call.
	threadsAllRoot(t)
	// Root runs in place.
	if err := Run(Identity{}, func() error {
		if unix.Geteuid() != 0 {
			return errors.New("not root")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkRun is the price of one file operation as a user: a goroutine, a
// locked thread and the switches there and back (compare Stat as root).
func BenchmarkRun(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	for _, c := range []struct {
		name string
		id   Identity
	}{{"root", Identity{}}, {"user", user}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := Run(c.id, func() error { _, err := os.Stat("/"); return err }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// callWithoutCaps runs a call as id that checks its euid and egid and that
// it has no capabilities (chown of root's file f is refused), and then
// that the thread rests with capabilities; it returns the thread's id.
func callWithoutCaps(t *testing.T, id Identity, f string) int {
	t.Helper()
	var tid int
	if err := Run(id, func() error {
		tid = unix.Gettid()
		if u, g := unix.Geteuid(), unix.Getegid(); u != int(id.UID) || g != int(id.GID) {
			t.Errorf("euid/egid %d/%d in a call as %+v", u, g, id)
		}
		if err := os.Chown(f, 1000, 1000); !errors.Is(err, os.ErrPermission) {
			t.Errorf("chown in a call as %+v: %v, want permission denied", id, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := threadStatus(t, tid, "CapEff:"); got == "0000000000000000" {
		t.Errorf("the thread resting after a call as %+v has no effective capabilities", id)
	}
	return tid
}

// threadStatus is the value of field (e.g. "Uid:") in thread tid's status.
func threadStatus(t *testing.T, tid int, field string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/status", tid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	t.Fatalf("no %s in thread %d's status", field, tid)
	return ""
}

// A thread serves the user's next call and no one else's: a second call
// of the user runs on the same thread, calls of users that differ in uid,
// gid or groups only never share one, and while it waits the thread has
// root's effective uid (out of the user's reach) and the user's groups.
func TestRunThreadServesOneIdentity(t *testing.T) {
	needRoot(t)
	retire()
	defer retire()
	var first, again int
	if err := Run(user, func() error { first = unix.Gettid(); return nil }); err != nil {
		t.Fatal(err)
	}
	if got := threadStatus(t, first, "Uid:"); got != "0 0 0 0" {
		t.Errorf("the waiting thread's uids: %s, want root's", got)
	}
	if got := threadStatus(t, first, "CapEff:"); got == "0000000000000000" {
		t.Errorf("the waiting thread has no effective capabilities: it could not become the user again")
	}
	rootFile := filepath.Join(t.TempDir(), "root")
	if err := os.WriteFile(rootFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The second call, on the waiting thread: the user's identity again,
	// capabilities included (none).
	again = callWithoutCaps(t, user, rootFile)
	if first != again {
		t.Errorf("the user's second call ran on thread %d, not on its thread %d", again, first)
	}
	others := []Identity{
		{UID: 1001, GID: 1001},                         // another user
		{UID: 1000, GID: 1001, Groups: user.Groups},    // another gid only
		{UID: 1000, GID: 1000, Groups: []uint32{1000}}, // other groups only
	}
	for _, o := range others {
		var tid int
		if err := Run(o, func() error { tid = unix.Gettid(); return nil }); err != nil {
			t.Fatal(err)
		}
		if tid == first {
			t.Fatalf("a call of %+v ran on the thread of %+v", o, user)
		}
	}
	// Calls of all of them at once each see exactly their identity.
	ids := append([]Identity{user}, others...)
	var wg sync.WaitGroup
	var wrong atomic.Int32
	for i := range 64 {
		id := ids[i%len(ids)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = Run(id, func() error {
				groups, _ := unix.Getgroups()
				want := make([]int, len(id.Groups))
				for i, g := range id.Groups {
					want[i] = int(g)
				}
				if unix.Geteuid() != int(id.UID) || unix.Getegid() != int(id.GID) || !slices.Equal(groups, want) {
					wrong.Add(1)
				}
				return nil
			})
		}()
	}
	wg.Wait()
	if wrong.Load() != 0 {
		t.Fatalf("%d calls ran with another identity", wrong.Load())
	}
	mu.Lock()
	n := 0
	for k, ws := range idle {
		n += len(ws)
		if len(ws) > maxIdle {
			t.Errorf("%d threads of %s wait, want at most %d", len(ws), k, maxIdle)
		}
	}
	if n > maxIdleTotal || n != idleCount {
		t.Errorf("%d threads wait (counted %d), want at most %d", n, idleCount, maxIdleTotal)
	}
	mu.Unlock()
	retire()
	threadsAllRoot(t)
}

// A thread whose scheduling the user lowered is not reused.
func TestRunDiscardsDegradedThread(t *testing.T) {
	needRoot(t)
	retire()
	defer retire()
	// Long enough that a re-niced thread kept waiting would outlast the
	// poll below.
	defer idleFor.Store(idleFor.Load())
	idleFor.Store(int64(time.Hour))
	if err := Run(user, func() error { return unix.Setpriority(unix.PRIO_PROCESS, 0, 19) }); err != nil {
		t.Fatal(err)
	}
	niced := func() []string {
		var out []string
		tasks, _ := filepath.Glob("/proc/self/task/*/stat")
		for _, p := range tasks {
			b, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			// Fields after the command (in parentheses): nice is the 17th.
			f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
			if len(f) > 16 && f[16] != "0" {
				out = append(out, p+": nice "+f[16])
			}
		}
		return out
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(niced()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a thread the user re-niced is still in the pool: %v", niced())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A thread that waits for its user's next call is out of the user's
// reach: all its uids are root then, so a process of the user can neither
// signal, ptrace or read it, nor re-nice or re-pin it.
func TestRunThreadUntouchable(t *testing.T) {
	needRoot(t)
	retire()
	var tid int
	if err := Run(user, func() error { tid = unix.Gettid(); return nil }); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A copy the user can run: go test's build directory is root's only.
	bin, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "asuser-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	attacker := filepath.Join(dir, "attacker")
	if err := os.WriteFile(attacker, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(attacker, "-test.run", "^$")
	cmd.Env = []string{fmt.Sprintf("ASUSER_ATTACK=%d:%d", os.Getpid(), tid)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: user.UID, Gid: user.GID, Groups: user.Groups}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the user's process: %v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "done" {
		t.Fatalf("the user's process reached the agent's thread: %s", got)
	}
	// The thread still serves the user.
	if err := Run(user, func() error {
		if unix.Gettid() != tid {
			return errors.New("another thread")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	retire()
	threadsAllRoot(t)
}

// A thread leaving the waiting pool goes back to Go as the agent's again,
// not destroyed: the agent's prewarmed threads are what it rides out a
// fork bomb with (agent.prewarmThreads).
func TestRunRetiredThreadReturns(t *testing.T) {
	needRoot(t)
	retire()
	var tid int
	if err := Run(user, func() error { tid = unix.Gettid(); return nil }); err != nil {
		t.Fatal(err)
	}
	retire()
	threadsAllRoot(t) // every thread root again, groups included
	if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); err != nil {
		t.Fatalf("the retired thread %d was destroyed, not given back: %v", tid, err)
	}
}

// The process's dumpable flag (per process; an effective uid change
// resets it) is the same after calls as before, whatever it was.
func TestRunKeepsDumpable(t *testing.T) {
	needRoot(t)
	before, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Prctl(unix.PR_SET_DUMPABLE, uintptr(before), 0, 0, 0)
	for _, d := range []int{1, 0} {
		retire()
		threadsAllRoot(t)
		if err := unix.Prctl(unix.PR_SET_DUMPABLE, uintptr(d), 0, 0, 0); err != nil {
			t.Fatal(err)
		}
		pooledOnce = sync.OnceValues(current) // the agent's flag is read once
		for range 3 {                         // a new thread, then a waiting one twice
			if err := Run(user, func() error { return nil }); err != nil {
				t.Fatal(err)
			}
			if now, _ := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); now != d {
				t.Fatalf("dumpable %d after a call, was %d", now, d)
			}
		}
	}
	retire()
	threadsAllRoot(t)
	pooledOnce = sync.OnceValues(current)
}

// Root's uid with another group switches no effective uid, so no kernel
// fixup applies: each call still runs without capabilities and the thread
// rests with root's.
func TestRunRootWithAnotherGroup(t *testing.T) {
	needRoot(t)
	retire()
	defer retire()
	f := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	id := Identity{UID: 0, GID: 1000}
	for range 2 {
		callWithoutCaps(t, id, f)
	}
	retire()
	threadsAllRoot(t)
}

// A thread left idle for idleFor goes back to Go's pool as root by itself.
func TestRunIdleThreadEnds(t *testing.T) {
	needRoot(t)
	retire()
	defer idleFor.Store(idleFor.Load())
	idleFor.Store(int64(50 * time.Millisecond))
	if err := Run(user, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	threadsAllRoot(t)
	mu.Lock()
	n := len(idle)
	mu.Unlock()
	if n != 0 {
		t.Fatalf("%d identities still have idle threads", n)
	}
	// And the next call starts a new one.
	if err := Run(user, func() error {
		if unix.Geteuid() != 1000 {
			return errors.New("not the user")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	threadsAllRoot(t)
}
