package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

const (
	landlockModeUser = "user"
	landlockModeRoot = "root"
)

// privateRunDir is what no command may ever touch: the daemon's socket and
// the agent's config (which holds the channel and access tokens). A
// variable only so that tests can point it at a temporary directory.
var privateRunDir = "/run/cella"

// commandRuleset is the Landlock ruleset a command starts under when the
// sandbox runs on the namespaces runtime (gVisor needs none: the sentry
// interposes every syscall, and runsc does not implement Landlock).
//
// The ruleset is defence in depth under the namespaces runtime:
//   - user: read/execute everywhere, read/write under /home, /tmp,
//     /var/tmp and /dev;
//   - root: read/write everywhere;
//   - both: no file under /run/cella can be read. root's rights to make
//     and remove entries in / and /run reach into /run/cella as well
//     (Landlock grants whole trees and cannot carve one out); what keeps
//     root from changing it is its read-only mount (oci).
//
// It is in force from the command's first instruction: the agent forks
// the command from a thread of its own that restricted itself first
// (forkExec), so the child inherits the domain and no_new_privs with its
// credentials, and no helper binary is exec'd in between (that re-exec of
// the agent's binary was most of a command's start under this runtime).
// Landlock is applied best-effort: on kernels without it the command runs
// unrestricted. no_new_privs means setuid binaries (sudo) do not gain
// privileges in commands started this way.
type commandRuleset struct {
	fd    int
	flags uint32
	key   rulesetKey
	refs  int  // commands starting under it, plus one while cached; rulesets.mu
	gone  bool // no longer cached: closed when the last command has started
}

// rulesetKey is what a mode's rules follow: the entries of / and of the
// private dir's other ancestors, by name and inode (a rule holds the inode
// an entry names: one made, removed, renamed or replaced changes the
// listing; a directory's mtime would not tell two changes within one clock
// tick apart, or one whose mtime was set back), which directories the
// user's writable trees are, and the sandbox's mounts (volumes).
// Unchanged, the rules would come out the same. A cached ruleset holds the
// inodes of its rules: a large file removed from / or /run is freed only
// once a command of each mode has run under a new ruleset.
type rulesetKey struct {
	mode   string
	dirs   string
	mounts string
}

// rulesets keeps the last ruleset of each mode. Building one walked / and
// /run, stat'ed and opened each entry and made a rule of it: 6.7 % of the
// agent's CPU per exec under the namespaces runtime, profiled; now an exec
// stats those directories and the user's writable trees and polls the
// mount table (keyWatch), and builds the ruleset again only when any of it
// changed.
var rulesets struct {
	mu     sync.Mutex
	byMode map[string]*commandRuleset
}

// landlockRuleset returns the ruleset for commands of user u, or nil when
// commands run without one (not the namespaces runtime, or a kernel
// without Landlock). Its rules follow the entries of / and /run and the
// sandbox's volume mounts as they are now. The caller Closes it once the
// command started.
func (s *Server) landlockRuleset(u *sandboxUser) (*commandRuleset, error) {
	if s.config().Runtime != "namespaces" {
		return nil, nil
	}
	mode := landlockModeUser
	if u.UID == 0 {
		mode = landlockModeRoot
	}
	key := currentRulesetKey(mode, "/")
	rulesets.mu.Lock()
	if r := rulesets.byMode[mode]; r != nil && r.key == key {
		r.refs++
		rulesets.mu.Unlock()
		return r, nil
	}
	rulesets.mu.Unlock()

	rules, err := landlockRules(mode, "/")
	if err != nil {
		return nil, fmt.Errorf("build landlock rules: %w", err)
	}
	fd, flags, err := fsOnly.NewRulesetFD(rules...)
	if err != nil {
		return nil, fmt.Errorf("make landlock ruleset: %w", err)
	}
	if fd < 0 {
		return nil, nil // nothing to restrict on this kernel
	}
	r := &commandRuleset{fd: fd, flags: flags, key: key, refs: 2}
	rulesets.mu.Lock()
	if rulesets.byMode == nil {
		rulesets.byMode = map[string]*commandRuleset{}
	}
	if old := rulesets.byMode[mode]; old != nil {
		old.gone = true
		old.releaseLocked()
	}
	rulesets.byMode[mode] = r
	rulesets.mu.Unlock()
	return r, nil
}

// userWritable are the trees a user's commands may write (besides volumes).
var userWritable = []string{"/home", "/tmp", "/var/tmp", "/dev"}

// currentRulesetKey reads what mode's rules under root follow now: the
// private dir's ancestors (their entries become rules), and which
// directories the user's writable trees are (a rule holds a directory,
// not its path: one removed and made again is another; their entries come
// and go without changing the rule). A directory or mountinfo that cannot
// be read makes a key no ruleset has. The ancestors' listings and the
// mount table come from rulesetSources, read again only when an
// ancestor's stamp or the mount table's poll says they may have changed
// (landlock_watch.go).
func currentRulesetKey(mode, root string) rulesetKey {
	var ancestors []string
	private := filepath.Join(root, privateRunDir)
	for d := filepath.Dir(private); ; d = filepath.Dir(d) {
		ancestors = append(ancestors, d)
		if d == root || d == filepath.Dir(d) {
			break
		}
	}
	listings, mounts := rulesetSources.get(root, ancestors)
	var dirs strings.Builder
	dirs.WriteString(listings)
	if mode == landlockModeUser {
		for _, p := range userWritable {
			st := stampOf(filepath.Join(root, p))
			fmt.Fprintf(&dirs, "%s %v %d %d\n", p, st.ok, st.dev, st.ino)
		}
	}
	return rulesetKey{mode: mode, dirs: dirs.String(), mounts: mounts}
}

// unique is what stands in a key for something that could not be read:
// text no other call gives, so that no ruleset's key matches it.
func unique(err error) string {
	return fmt.Sprintf("unreadable: %v %d", err, time.Now().UnixNano())
}

// dirListing is directory d's identity and entries, each by name, inode
// and type, in name order.
func dirListing(d string) (string, error) {
	fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", err
	}
	var entries []string
	buf := make([]byte, 8192)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return "", err
		}
		if n <= 0 {
			break
		}
		// struct linux_dirent64: ino, off (8 bytes each), reclen (2),
		// type (1), the name up to its NUL.
		for b := buf[:n]; len(b) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				return "", errors.New("bad dirent")
			}
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			entries = append(entries, fmt.Sprintf("%s/%d/%d", name, binary.NativeEndian.Uint64(b[0:8]), b[18]))
			b = b[reclen:]
		}
	}
	slices.Sort(entries)
	return fmt.Sprintf("%d:%d %s", st.Dev, st.Ino, strings.Join(entries, " ")), nil
}

// Close gives the ruleset back (a nil ruleset holds nothing).
func (r *commandRuleset) Close() {
	if r == nil {
		return
	}
	rulesets.mu.Lock()
	r.releaseLocked()
	rulesets.mu.Unlock()
}

// releaseLocked drops one reference; rulesets.mu is held.
func (r *commandRuleset) releaseLocked() {
	r.refs--
	if r.refs == 0 && r.gone {
		_ = unix.Close(r.fd)
	}
}

// fsOnly restricts what Landlock ABI 6 can restrict of the file system,
// and nothing else: TCP ports and IPC scopes stay as the namespaces and the
// seccomp profile leave them.
var fsOnly = landlock.Config{HandledAccessFS: landlock.V6.HandledAccessFS}.BestEffort()

// forkExec starts a command under the ruleset (a nil ruleset: as it is).
// Landlock and no_new_privs are per thread until a thread forks, so the
// command is forked from an OS thread that restricts itself first and is
// never given back to the Go scheduler: its goroutine ends without
// unlocking it, which makes the runtime end the thread. (The runtime never
// clones new threads from a locked one, so the restriction cannot spread
// to the agent's other threads either.)
//
// No thread of the commands' domain outlives its fork: Landlock lets a
// process trace or read the memory of members of its own domain, and such
// a thread's memory is the agent's (tokens and all). A thread kept per
// ruleset to fork every command was measured 0.15-0.2 ms faster per exec
// under the namespaces runtime and not kept for that reason.
func (r *commandRuleset) forkExec(argv0 string, argv []string, attr *syscall.ProcAttr) (int, error) {
	if r == nil {
		return syscall.ForkExec(argv0, argv, attr)
	}
	done := make(chan forkResult, 1)
	go r.forkOnOwnThread(argv0, argv, attr, done)
	res := <-done
	return res.pid, res.err
}

type forkResult struct {
	pid int
	err error
}

func (r *commandRuleset) forkOnOwnThread(argv0 string, argv []string, attr *syscall.ProcAttr, done chan<- forkResult) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		// The main thread never ends (the runtime parks it instead), so
		// it must not be the one restricted. Holding it, the goroutine
		// started here runs on another thread; this one is given back
		// untouched.
		inner := make(chan forkResult, 1)
		go r.forkOnOwnThread(argv0, argv, attr, inner)
		done <- <-inner
		runtime.UnlockOSThread()
		return
	}
	// Never unlocked from here on: the thread dies with this goroutine.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		done <- forkResult{err: fmt.Errorf("set no_new_privs: %w", err)}
		return
	}
	if err := llsys.LandlockRestrictSelf(r.fd, r.flags); err != nil {
		done <- forkResult{err: fmt.Errorf("apply landlock: %w", err)}
		return
	}
	pid, err := syscall.ForkExec(argv0, argv, attr)
	done <- forkResult{pid, err}
}

// landlockRules lists what a command may access. Landlock only allows, and
// a rule covers a whole tree, so "everything but /run/cella" is spelled as a
// rule per entry of / and of /run except cella. The ancestors of the private
// dir themselves (/ and /run) get every right but reading files, so that
// root can still create, write and remove entries directly in them (pid
// files in /run) while the private dir's files stay unreadable; those rights
// reach into the private dir too, whose read-only mount refuses them. root
// is a parameter for tests.
func landlockRules(mode, root string) ([]landlock.Rule, error) {
	private := filepath.Join(root, privateRunDir)
	isAncestor := func(p string) bool { return p == root || strings.HasPrefix(private, strings.TrimSuffix(p, "/")+"/") }
	var rw []string
	if mode == landlockModeUser {
		for _, p := range userWritable {
			rw = append(rw, filepath.Join(root, p))
		}
		if root == "/" {
			rw = append(rw, volumeMountPoints()...) // landlock_volumes.go
		}
	}
	var rules []landlock.Rule
	add := func(p string, write bool) {
		// A rule holds what the path leads to (/bin -> usr/bin and the
		// like are followed): an entry that leads to the private dir, into
		// it or to one of its ancestors (root's ln -s /run/cella /x, or
		// ln -s / /x) would grant the private dir with it.
		if r, err := filepath.EvalSymlinks(p); err != nil || r == private || strings.HasPrefix(r, private+"/") || isAncestor(r) {
			return
		}
		st, err := os.Stat(p)
		if err != nil {
			return
		}
		switch {
		case st.IsDir() && write:
			r := landlock.RWDirs(p).WithRefer().IgnoreIfMissing()
			if p == filepath.Join(root, "dev") {
				// Terminals need ioctls (window size, job control).
				r = r.WithIoctlDev()
			}
			rules = append(rules, r)
		case st.IsDir():
			rules = append(rules, landlock.RODirs(p).IgnoreIfMissing())
		case st.Mode().IsRegular() && write:
			rules = append(rules, landlock.RWFiles(p).IgnoreIfMissing())
		case st.Mode().IsRegular():
			rules = append(rules, landlock.ROFiles(p).IgnoreIfMissing())
		}
	}
	var walk func(dir string) error
	walk = func(dir string) error {
		if mode == landlockModeRoot {
			rules = append(rules, landlock.PathAccess(ancestorRights, dir).IgnoreIfMissing())
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			switch {
			case p == private:
				continue
			case isAncestor(p):
				if err := walk(p); err != nil && !errors.Is(err, os.ErrNotExist) {
					return err
				}
			default:
				add(p, mode == landlockModeRoot)
			}
		}
		return nil
	}
	if err := walk(root); err != nil {
		return nil, err
	}
	// Read/write areas nested in read-only ones (/var/tmp in /var) are
	// added on top: Landlock rights accumulate down the tree. An area that
	// contains the private dir is never granted whole.
	for _, p := range rw {
		if !isAncestor(p) {
			add(p, true)
		}
	}
	return rules, nil
}

// ancestorRights are root's rights on the directories above the private
// dir: everything but reading (and executing) files, which would reach into
// the private dir as well.
var ancestorRights = func() landlock.AccessFSSet {
	var all landlock.AccessFSSet
	for _, r := range []landlock.AccessFSSet{
		llsys.AccessFSWriteFile, llsys.AccessFSReadDir, llsys.AccessFSRemoveDir, llsys.AccessFSRemoveFile,
		llsys.AccessFSMakeChar, llsys.AccessFSMakeDir, llsys.AccessFSMakeReg, llsys.AccessFSMakeSock,
		llsys.AccessFSMakeFifo, llsys.AccessFSMakeBlock, llsys.AccessFSMakeSym, llsys.AccessFSRefer, llsys.AccessFSTruncate,
	} {
		all |= r
	}
	return all
}()
