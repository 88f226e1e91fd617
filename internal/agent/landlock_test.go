package agent

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/agentapi"
)

func landlockABI() int {
	const createRulesetVersion = 1
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, createRulesetVersion)
	if errno != 0 {
		return 0
	}
	return int(v)
}

// landlockDirs skips without Landlock, and makes a dir the test user can
// reach (the default temp dir may be private to root) holding a private
// dir that stands in for /run/cella (outside /tmp, which users may write),
// with a secret in it; privateRunDir points at it for the test.
func landlockDirs(t *testing.T) (helperDir, private string) {
	t.Helper()
	if landlockABI() < 1 {
		t.Skip("kernel without landlock")
	}
	helperDir, err := os.MkdirTemp("/var/cache", "cella-landlock-")
	if err != nil {
		t.Skip("no /var/cache to test with")
	}
	t.Cleanup(func() { os.RemoveAll(helperDir) })
	if err := os.Chmod(helperDir, 0o755); err != nil {
		t.Fatal(err)
	}
	private = filepath.Join(helperDir, "private")
	writeFile(t, filepath.Join(private, "config.json"), "secret")
	old := privateRunDir
	privateRunDir = private
	t.Cleanup(func() { privateRunDir = old })
	return helperDir, private
}

// TestLandlock runs commands under the Landlock ruleset the way the agent
// does under the namespaces runtime: forked from a thread that restricted
// itself, with no helper in between.
func TestLandlock(t *testing.T) {
	helperDir, private := landlockDirs(t)
	e := newTestEnv(t, func(c *agentapi.Config, o *Options) { c.Runtime = "namespaces" })
	ctx := ctxT(t, 20*time.Second)

	// A world-writable dir outside the user's areas.
	open := filepath.Join(e.rootDir, "open")
	if err := os.MkdirAll(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(e.rootDir, "readable.txt"), "readable")

	script := strings.Join([]string{
		"cat " + filepath.Join(private, "config.json") + " >/dev/null 2>&1 && echo private=yes || echo private=no",
		"cat " + filepath.Join(e.rootDir, "readable.txt") + " >/dev/null 2>&1 && echo read=yes || echo read=no",
		"touch " + filepath.Join(open, "f") + " 2>/dev/null && echo openw=yes || echo openw=no",
		"touch /tmp/cella-landlock-test-$$ 2>/dev/null && echo tmpw=yes && rm -f /tmp/cella-landlock-test-$$ || echo tmpw=no",
		"echo home=$(cd && touch h && echo yes)",
	}, "; ")

	// Entries beside the private dir that lead into it or above it (only
	// root can make them in / and /run) grant nothing of it.
	for name, target := range map[string]string{"to-private": private, "to-root": "/", "to-parent": helperDir} {
		if err := os.Symlink(target, filepath.Join(helperDir, name)); err != nil {
			t.Fatal(err)
		}
		script += "; cat " + filepath.Join(helperDir, name, strings.TrimPrefix(filepath.Join(private, "config.json"), target)) +
			" >/dev/null 2>&1 && echo " + name + "=yes || echo " + name + "=no"
	}

	// root: everything but the private dir's contents. (Its names can be
	// listed: the rights on its ancestors are inherited.)
	r := e.run(ctx, bashReq(script))
	for _, want := range []string{"private=no", "read=yes", "openw=yes", "tmpw=yes", "to-private=no", "to-root=no", "to-parent=no"} {
		if !strings.Contains(r.stdout, want+"\n") {
			t.Errorf("root: want %s in %q (stderr %q)", want, r.stdout, r.stderr)
		}
	}

	// user: world-writable places outside /home, /tmp, /var/tmp, /dev are
	// read-only. /tmp itself stays writable, so use /var/cache for the
	// outside place.
	outside := filepath.Join(helperDir, "outside")
	if err := os.Mkdir(outside, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(outside, 0o777); err != nil {
		t.Fatal(err)
	}
	script = "touch " + filepath.Join(outside, "f") + " 2>/dev/null && echo outw=yes || echo outw=no; " +
		"cat " + filepath.Join(private, "config.json") + " >/dev/null 2>&1 && echo private=yes || echo private=no; " +
		"touch /tmp/cella-landlock-user-$$ 2>/dev/null && echo tmpw=yes && rm -f /tmp/cella-landlock-user-$$ || echo tmpw=no; " +
		"echo dev=$(echo x > /dev/null && echo yes)"
	r = e.run(ctx, bashReq(script), "Authorization", basicAuth("user"))
	for _, want := range []string{"outw=no", "private=no", "tmpw=yes", "dev=yes"} {
		if !strings.Contains(r.stdout, want+"\n") {
			t.Errorf("user: want %s in %q (stderr %q)", want, r.stdout, r.stderr)
		}
	}

	// Without a ruleset (gvisor runtime) the same write succeeds, which
	// shows the denial above came from Landlock, not file modes.
	plain := newTestEnv(t)
	r = plain.run(ctx, bashReq("touch "+filepath.Join(outside, "g")+" && echo outw=yes"), "Authorization", basicAuth("user"))
	if r.stdout != "outw=yes\n" {
		t.Fatalf("without landlock: %q %q", r.stdout, r.stderr)
	}

	// Only the file system is restricted: a command still connects over
	// TCP (the namespaces and the host's egress rules govern that).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	r = e.run(ctx, bashReq("exec 3<>/dev/tcp/127.0.0.1/"+port+" && echo tcp=yes"), "Authorization", basicAuth("user"))
	if r.stdout != "tcp=yes\n" {
		t.Errorf("user: TCP connect under landlock: %q %q", r.stdout, r.stderr)
	}

	// The agent itself stays unrestricted: the threads that restricted
	// themselves to fork the commands above are gone, none went back to
	// the scheduler (no_new_privs is the per-thread trace Landlock leaves;
	// a thread of the commands' domain that lived on would let them trace
	// or read the agent's memory, Landlock allowing that within a domain),
	// and the agent still reads the private dir.
	eventually(t, 10*time.Second, "every restricted thread to end", func() bool { return len(noNewPrivsThreads(t)) == 0 })
	if _, err := os.ReadFile(filepath.Join(private, "config.json")); err != nil {
		t.Fatalf("the agent lost access to its private dir: %v", err)
	}
}

// noNewPrivsThreads lists the threads of this process with no_new_privs set.
func noNewPrivsThreads(t *testing.T) []string {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "status"))
		if err != nil {
			continue // the thread ended meanwhile
		}
		if strings.Contains(string(b), "\nNoNewPrivs:\t1\n") {
			out = append(out, task.Name())
		}
	}
	return out
}

// TestLandlockRulesetCache: commands reuse their mode's ruleset while what
// its rules follow is unchanged, and get a new one as soon as it changed —
// here a directory made beside the private dir after a command ran, which
// a user's command can read only under rules made after it (a stale
// ruleset has no rule for it). Many commands at once while the rules change
// leave no ruleset descriptor behind but the cached ones.
func TestLandlockRulesetCache(t *testing.T) {
	helperDir, private := landlockDirs(t)
	e := newTestEnv(t, func(c *agentapi.Config, o *Options) { c.Runtime = "namespaces" })
	ctx := ctxT(t, time.Minute)

	read := func(p string) string {
		r := e.run(ctx, bashReq("cat "+p+" 2>/dev/null || echo denied"), "Authorization", basicAuth("user"))
		return strings.TrimSpace(r.stdout)
	}
	if got := read(filepath.Join(private, "config.json")); got != "denied" {
		t.Fatalf("the private dir: %q", got)
	}
	for i := range 3 {
		fresh := filepath.Join(helperDir, "fresh"+strconv.Itoa(i))
		writeFile(t, filepath.Join(fresh, "f"), "fresh")
		if err := os.Chmod(fresh, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(fresh, "f"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := read(filepath.Join(fresh, "f")); got != "fresh" {
			t.Fatalf("a directory made since the last command: %q (a stale ruleset)", got)
		}
		if got := read(filepath.Join(private, "config.json")); got != "denied" {
			t.Fatalf("the private dir after a change: %q", got)
		}
	}

	// Many commands at once, for root and user, while the rules change.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20 {
			_ = os.Mkdir(filepath.Join(helperDir, "churn"+strconv.Itoa(i)), 0o755)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	errs := make(chan string, 40)
	for i := range 40 {
		go func() {
			hdr := []string{}
			if i%2 == 0 {
				hdr = []string{"Authorization", basicAuth("user")}
			}
			r := e.run(ctx, bashReq("echo ok"), hdr...)
			errs <- strings.TrimSpace(r.stdout + r.stderr)
		}()
	}
	for range 40 {
		if got := <-errs; got != "ok" {
			t.Errorf("a command while the rules changed: %q", got)
		}
	}
	<-done
	e.run(ctx, bashReq("true"))
	e.run(ctx, bashReq("true"), "Authorization", basicAuth("user"))
	if n := landlockFDs(t); n > 2 {
		t.Fatalf("%d ruleset descriptors open, want at most one per mode", n)
	}
}

// landlockFDs counts this process's open Landlock ruleset descriptors.
func landlockFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ent := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", ent.Name())); err == nil && strings.Contains(l, "landlock-ruleset") {
			n++
		}
	}
	return n
}

// sameFiles compares two keys apart from their mount tables, which any
// mount in the test's mount namespace changes (other tests mount).
func sameFiles(a, b rulesetKey) bool { return a.mode == b.mode && a.dirs == b.dirs }

// TestRulesetKey: the key changes with the entries of the private dir's
// ancestors and with the identity of the user's writable trees, and not
// with what is made inside those trees.
func TestRulesetKey(t *testing.T) {
	root := t.TempDir()
	for _, d := range append([]string{"run/cella"}, userWritable...) {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	old := privateRunDir
	privateRunDir = "/run/cella"
	t.Cleanup(func() { privateRunDir = old })
	key := func() rulesetKey { return currentRulesetKey(landlockModeUser, root) }
	k0 := key()
	if !sameFiles(key(), k0) {
		t.Fatal("the key changed with nothing changed")
	}
	writeFile(t, filepath.Join(root, "tmp", "churn"), "x")
	if !sameFiles(key(), k0) {
		t.Fatal("a file made in /tmp changed the key")
	}
	// A cached ruleset pins the inodes of its rules, so the /tmp made
	// again cannot get the old one's inode number: pin it here too.
	pin, err := unix.Open(filepath.Join(root, "tmp"), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pin)
	if err := os.RemoveAll(filepath.Join(root, "tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	k1 := key()
	if sameFiles(k1, k0) {
		t.Fatal("/tmp made again (another directory) left the key as it was")
	}
	// A new entry of /run, with /run's mtime set back as it was: the key
	// follows the entries, not the clock.
	st, err := os.Stat(filepath.Join(root, "run"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "run", "new"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(root, "run"), st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	if sameFiles(key(), k1) {
		t.Fatal("a new entry of /run left the key as it was")
	}
	if currentRulesetKey(landlockModeRoot, root) == key() {
		t.Fatal("the modes share a key")
	}
}

// TestRulesetKeyWatch: the ancestors' listings and the mount table are read
// again only when something may have changed, and every change the key
// follows is seen: at once (the directory's stamp is racy right after a
// change, so it is read every time), and once the stamp has aged (when
// only the stamp can tell). The changes: an entry made, removed, renamed
// over, moved in from elsewhere or moved out, renamed with the
// directory's mtime set back (only its ctime tells), the ancestor itself
// removed and made again (and then changed), and, as root, a mount over
// an ancestor's entry and its unmount. With nothing changed and the
// stamps aged, nothing is read again but for the mount table's poll, which
// any mount in the test's mount namespace raises (other tests mount; the
// files' part of the key is compared, sameFiles).
func TestRulesetKeyWatch(t *testing.T) {
	root := t.TempDir()
	old := privateRunDir
	privateRunDir = "/run/cella"
	t.Cleanup(func() { privateRunDir = old })
	key := func() rulesetKey { return currentRulesetKey(landlockModeRoot, root) }
	path := func(p string) string { return filepath.Join(root, p) }
	// settle waits until the ancestors' stamps have aged past racyWindow.
	settle := func(t *testing.T) {
		t.Helper()
		eventually(t, 10*time.Second, "the ancestors' stamps to age", func() bool {
			return !racy([]fileStamp{stampOf(root), stampOf(path("run"))}, time.Now())
		})
	}
	// steady takes the key with the stamps aged and checks that, with
	// nothing changed, it stays and nothing is read again.
	steady := func(t *testing.T, after string) rulesetKey {
		t.Helper()
		settle(t)
		k := key()
		reads, forMounts := keyReads.Load(), keyReadsForMounts.Load()
		for range 3 {
			if !sameFiles(key(), k) {
				t.Fatalf("after %s, the key changed with nothing changed", after)
			}
		}
		if n := keyReads.Load() - reads - (keyReadsForMounts.Load() - forMounts); n != 0 {
			t.Fatalf("after %s, read %d times again with nothing changed", after, n)
		}
		return k
	}
	mk := func(p string) func() error { return func() error { return os.MkdirAll(path(p), 0o755) } }
	file := func(p string) func() error { return func() error { return os.WriteFile(path(p), nil, 0o644) } }
	mv := func(from, to string) func() error { return func() error { return os.Rename(path(from), path(to)) } }
	type change struct {
		what          string
		setup, change func() error // the key is taken between them
		// seen says whether the key now shows the change (nil: the files'
		// part of the key differs from before).
		seen func(before, now rulesetKey) bool
	}
	changes := func(t *testing.T) []change {
		var mtime time.Time
		cs := []change{
			{"an entry made in /run", nil, mk("run/a"), nil},
			{"an entry made in /", nil, file("b"), nil},
			{"an entry of /run renamed over another", func() error {
				if err := file("run/c")(); err != nil {
					return err
				}
				return file("run/d")()
			}, mv("run/d", "run/c"), nil},
			{"a file from elsewhere moved over an entry of /run", func() error {
				if err := mk("x/y")(); err != nil {
					return err
				}
				return file("x/y/f")()
			}, mv("x/y/f", "run/c"), nil},
			{"an entry of /run moved elsewhere", file("run/g"), mv("run/g", "x/g"), nil},
			{"an entry removed from /run", nil, func() error { return os.Remove(path("run/c")) }, nil},
			{"an entry of /run renamed, /run's mtime set back", func() error {
				st, err := os.Stat(path("run"))
				mtime = st.ModTime()
				return err
			}, func() error {
				if err := mv("run/a", "run/h")(); err != nil {
					return err
				}
				return os.Chtimes(path("run"), mtime, mtime)
			}, nil},
			{"/run removed and made again", nil, func() error {
				if err := os.RemoveAll(path("run")); err != nil {
					return err
				}
				return mk("run/cella")()
			}, nil},
			{"an entry made in the new /run", nil, mk("run/e"), nil},
		}
		if os.Geteuid() == 0 {
			mnt := path("run/e")
			cs = append(cs,
				change{"a mount over an entry of /run", nil, func() error {
					t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
					return unix.Mount("cella-test", mnt, "tmpfs", 0, "size=1m")
				}, func(_, now rulesetKey) bool { return strings.Contains(now.mounts, " "+mnt+" ") }},
				change{"its unmount", nil, func() error { return unix.Unmount(mnt, 0) },
					func(_, now rulesetKey) bool { return !strings.Contains(now.mounts, " "+mnt+" ") }})
		}
		return cs
	}
	for _, at := range []string{"at once", "once aged"} {
		t.Run(at, func(t *testing.T) {
			if err := os.RemoveAll(root); err != nil {
				t.Fatal(err)
			}
			if err := mk("run/cella")(); err != nil {
				t.Fatal(err)
			}
			for _, c := range changes(t) {
				if c.setup != nil {
					if err := c.setup(); err != nil {
						t.Fatalf("%s: %v", c.what, err)
					}
				}
				prev := steady(t, "the setup of "+c.what)
				if err := c.change(); err != nil {
					t.Fatalf("%s: %v", c.what, err)
				}
				if at == "once aged" {
					settle(t)
				}
				seen := c.seen
				if seen == nil {
					seen = func(before, now rulesetKey) bool { return !sameFiles(before, now) }
				}
				if !seen(prev, key()) {
					t.Fatalf("%s left the key as it was", c.what)
				}
			}
		})
	}

	// A read made while a stamp is racy is not gone by: while the stamps
	// are racy (a window wider than the test, here), every key reads
	// again, and the first key after they aged reads once more.
	steady(t, "the changes")
	racyWindow = time.Hour
	if err := mk("run/racy")(); err != nil {
		racyWindow = 100 * time.Millisecond
		t.Fatal(err)
	}
	reads := keyReads.Load()
	key()
	key()
	n := keyReads.Load() - reads
	racyWindow = 100 * time.Millisecond
	if n != 2 {
		t.Fatalf("%d reads in two keys while the stamps were racy; want 2", n)
	}
	settle(t)
	reads = keyReads.Load()
	key()
	if n := keyReads.Load() - reads; n != 1 {
		t.Fatalf("%d reads in the first key after the stamps aged; want 1 (the last read was racy)", n)
	}

	// A mount table that could not be opened is opened again at the next
	// key, and then watched as before.
	rulesetSources.mu.Lock()
	unix.Close(rulesetSources.mountsFD)
	rulesetSources.mountsFD = -1
	rulesetSources.mu.Unlock()
	reads = keyReads.Load()
	key()
	if n := keyReads.Load() - reads; n != 1 {
		t.Fatalf("%d reads in the key after the mount table was closed; want 1", n)
	}
	steady(t, "the mount table opened again")

	// An ancestor that cannot be read gives a key no other call gives:
	// missing, or there but no directory.
	if err := os.Rename(path("run"), path("run.away")); err != nil {
		t.Fatal(err)
	}
	if sameFiles(key(), key()) {
		t.Fatal("a missing ancestor gave the same key twice")
	}
	if err := os.WriteFile(path("run"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	settle(t)
	if sameFiles(key(), key()) {
		t.Fatal("an ancestor that is no directory gave the same key twice")
	}
}
