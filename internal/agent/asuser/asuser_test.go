package asuser

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain doubles as the user's process of TestRunThreadUntouchable: with
// ASUSER_ATTACK=pid:tid it tries to signal (signal 0: the permission check alone) and to ptrace that thread and
// prints what it could do.
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

// threadNice is the nice value of thread tid of this process.
func threadNice(t *testing.T, tid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/stat", tid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command (in parentheses): nice is the 17th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return f[16]
}

// A thread keeps its user between calls and serves that user only: a
// second call of the user runs on the same thread, another user's never
// does, and what a user did to its thread (re-nice it) reaches no one else.
func TestRunThreadServesOneIdentity(t *testing.T) {
	needRoot(t)
	retire()
	other := Identity{UID: 1001, GID: 1001}
	var first, again, theirs int
	if err := Run(user, func() error {
		first = unix.Gettid()
		return unix.Setpriority(unix.PRIO_PROCESS, 0, 19)
	}); err != nil {
		t.Fatal(err)
	}
	if err := Run(user, func() error { again = unix.Gettid(); return nil }); err != nil {
		t.Fatal(err)
	}
	if first != again {
		t.Errorf("the user's second call ran on thread %d, not on its thread %d", again, first)
	}
	if err := Run(other, func() error {
		theirs = unix.Gettid()
		if u := unix.Geteuid(); u != 1001 {
			t.Errorf("euid %d in the other user's call", u)
		}
		if g, _ := unix.Getgroups(); len(g) != 0 {
			t.Errorf("the other user's call has groups %v", g)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if theirs == first {
		t.Fatalf("another user's call ran on the first user's thread")
	}
	if n := threadNice(t, theirs); n != "0" {
		t.Errorf("the other user's thread has nice %s", n)
	}
	// Calls of both users at once never see each other's identity.
	var wg sync.WaitGroup
	var wrong atomic.Int32
	for i := range 64 {
		id, want := user, 1000
		if i%2 == 1 {
			id, want = other, 1001
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = Run(id, func() error {
				if unix.Geteuid() != want {
					wrong.Add(1)
				}
				return nil
			})
		}()
	}
	wg.Wait()
	if wrong.Load() != 0 {
		t.Fatalf("%d calls ran as the wrong user", wrong.Load())
	}
	mu.Lock()
	for k, ws := range idle {
		if len(ws) > maxIdle {
			t.Errorf("%d threads of %s wait, want at most %d", len(ws), k, maxIdle)
		}
	}
	mu.Unlock()
	retire()
	threadsAllRoot(t)
}

// A thread that waits as the user for its next call is still out of the
// user's reach: its real and saved uid are root, so a process of the user
// can neither signal nor ptrace it nor read its environment.
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

// A thread left idle for idleFor ends by itself.
func TestRunIdleThreadEnds(t *testing.T) {
	needRoot(t)
	retire()
	defer func(d time.Duration) { idleFor = d }(idleFor)
	idleFor = 50 * time.Millisecond
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
