package asuser

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

var user = Identity{UID: 1000, GID: 1000, Groups: []uint32{1000, 4242}}

// threadsAllRoot fails the test if any thread of the process is not root.
func threadsAllRoot(t *testing.T) {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		for _, line := range strings.Split(string(b), "\n") {
			for _, k := range []string{"Uid:", "Gid:"} {
				if v, ok := strings.CutPrefix(line, k); ok && strings.Join(strings.Fields(v), " ") != "0 0 0 0" {
					t.Errorf("%s: %s%s", p, k, v)
				}
			}
			if v, ok := strings.CutPrefix(line, "CapEff:"); ok && strings.TrimSpace(v) == "0000000000000000" {
				t.Errorf("%s: no effective capabilities left", p)
			}
		}
	}
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
	threadsAllRoot(t)
}

func TestRunPanicAndRoot(t *testing.T) {
	needRoot(t)
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v, want boom", p)
			}
		}()
		_ = Run(user, func() error { panic("boom") })
	}()
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

// A thread whose scheduling the user lowered is not reused.
func TestRunDiscardsDegradedThread(t *testing.T) {
	needRoot(t)
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
