// Package asuser runs a function with a sandbox user's identity, so that
// the agent (root, PID 1) touches files exactly as that user would: the
// kernel checks every path component, symlink and permission against the
// user, and what the function creates is owned by the user.
//
// Linux credentials are per thread (glibc and Go's syscall.Setresuid only
// make them look per process by changing every thread), so Run locks a
// goroutine to an OS thread and changes just that thread with the raw
// syscalls: supplementary groups, effective gid, effective uid, and an
// empty effective capability set. setfsuid(2) would be the narrower tool
// but gVisor does not implement it (ENOSYS); setresuid and setgroups are
// per-task there as in Linux. A thread that became a user stays that user
// and serves only that user's calls until it is destroyed.
//
// While the thread is the user, processes of that user still cannot signal
// or ptrace it: both checks compare against its real and saved uid, which
// stay root. They can lower its scheduling (nice, policy, CPU affinity go
// by the effective uid), which slows only their own user's calls.
package asuser

import (
	"fmt"
	goruntime "runtime"
	"slices"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Identity is who a file operation acts as.
type Identity struct {
	UID, GID uint32
	// Groups are the supplementary groups (the primary one may be among them).
	Groups []uint32
}

// IsRoot reports whether id is root with root's group: nothing to switch.
func (id Identity) IsRoot() bool { return id.UID == 0 && id.GID == 0 }

// Run calls fn as id and returns its error. For root it simply calls fn.
// Otherwise fn runs on a goroutine locked to an OS thread that has id's
// credentials; fn must not start goroutines that are meant to act as the
// user (they run on other threads). A panic in fn is re-raised in the
// caller.
//
// The thread keeps id's credentials after the call and waits for id's next
// one: switching there and back and verifying the way back took a dozen
// syscalls per call, each a trip through gVisor's sentry (about 1 ms of a
// 1 MiB upload's 5-6 ms). Such a thread only ever runs fn's of its own
// identity: its goroutine never unlocks it, so Go's scheduler puts nothing
// else on it, and when the goroutine ends (idle for idleFor, more than
// maxIdle of its identity waiting, or fn panicked) Go destroys the thread.
// Go creates new threads from a clean template thread, never by cloning a
// locked one, so no other thread inherits the identity.
func Run(id Identity, fn func() error) error {
	if id.IsRoot() {
		return fn()
	}
	done := make(chan result, 1)
	j := job{fn: fn, done: done}
	if w := takeIdle(id.key()); w != nil {
		w.jobs <- j
	} else if err := startWorker(id, j); err != nil {
		return err
	}
	r := <-done
	if r.panicked != nil {
		panic(r.panicked)
	}
	return r.err
}

var (
	// idleFor is how long a thread waits for its identity's next call
	// before it ends: long enough for a client's burst of file calls, short
	// enough that an idle sandbox keeps no extra threads (each is kernel
	// state in a pause's checkpoint).
	idleFor = 10 * time.Second
)

const (
	// maxIdle threads of one identity wait at a time; concurrent calls
	// beyond them get threads of their own that end after their call.
	maxIdle = 4
)

var (
	mu sync.Mutex
	// idle holds the threads waiting for a call, by identity.
	idle = map[string][]*worker{}
)

type worker struct {
	key  string
	jobs chan job
}

type job struct {
	fn   func() error
	done chan<- result
}

type result struct {
	err      error
	panicked any
}

// key tells identities apart: uid, gid and the groups in their order.
func (id Identity) key() string {
	b := make([]byte, 0, 8*(2+len(id.Groups)))
	b = fmt.Appendf(b, "%d:%d", id.UID, id.GID)
	for _, g := range id.Groups {
		b = fmt.Appendf(b, ",%d", g)
	}
	return string(b)
}

// takeIdle removes a waiting thread of identity key from the idle list.
func takeIdle(key string) *worker {
	mu.Lock()
	defer mu.Unlock()
	ws := idle[key]
	if len(ws) == 0 {
		return nil
	}
	w := ws[len(ws)-1]
	if len(ws) == 1 {
		delete(idle, key)
	} else {
		idle[key] = ws[:len(ws)-1]
	}
	return w
}

// park puts w on the idle list; false when its identity has enough
// threads waiting already.
func park(w *worker) bool {
	mu.Lock()
	defer mu.Unlock()
	if len(idle[w.key]) >= maxIdle {
		return false
	}
	idle[w.key] = append(idle[w.key], w)
	return true
}

// unpark takes w off the idle list; false when a caller took it first (its
// call is on the way).
func unpark(w *worker) bool {
	mu.Lock()
	defer mu.Unlock()
	ws := idle[w.key]
	i := slices.Index(ws, w)
	if i < 0 {
		return false
	}
	ws = slices.Delete(ws, i, i+1)
	if len(ws) == 0 {
		delete(idle, w.key)
	} else {
		idle[w.key] = ws
	}
	return true
}

// retire ends every waiting thread (each ends with its goroutine, so Go
// destroys it); calls under way finish on theirs. Tests use it to see
// every thread back to root.
func retire() {
	mu.Lock()
	all := idle
	idle = map[string][]*worker{}
	mu.Unlock()
	for _, ws := range all {
		for _, w := range ws {
			close(w.jobs)
		}
	}
}

// startWorker starts a thread with id's credentials that runs first, then
// waits for more calls of id. It returns once the thread has id's
// credentials, or with the reason it could not get them (the thread is
// then destroyed).
func startWorker(id Identity, first job) error {
	ready := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Never the main thread: Go parks rather than destroys it when a
			// goroutine exits locked to it, and /proc/self describes it.
			// Holding it here makes the scheduler start the worker elsewhere.
			ready <- startWorker(id, first)
			goruntime.UnlockOSThread()
			return
		}
		// Otherwise this goroutine ends locked, always: the thread is
		// destroyed with it.
		saved, err := agentOnce()
		if err != nil {
			ready <- err
			return
		}
		if err := become(id); err != nil {
			ready <- fmt.Errorf("act as uid %d: %w", id.UID, err)
			return
		}
		// An effective uid change resets the process's dumpable flag (it is
		// per process, not per thread): put it back as it was.
		if err := unix.Prctl(unix.PR_SET_DUMPABLE, uintptr(saved.dumpable), 0, 0, 0); err != nil {
			ready <- fmt.Errorf("act as uid %d: set dumpable: %w", id.UID, err)
			return
		}
		ready <- nil
		w := &worker{key: id.key(), jobs: make(chan job, 1)}
		serve(w, first)
	}()
	return <-ready
}

// serve runs j and the calls that follow on the current thread until the
// thread is no longer wanted.
func serve(w *worker, j job) {
	timer := time.NewTimer(idleFor)
	defer timer.Stop()
	for {
		var r result
		func() {
			defer func() { r.panicked = recover() }()
			r.err = j.fn()
		}()
		// Parked before the caller hears back, so that a Retire after Run
		// returned finds the thread. A panic may have left the thread in
		// any state: it is not reused.
		parked := r.panicked == nil && park(w)
		j.done <- r
		if !parked {
			return
		}
		timer.Reset(idleFor)
		var ok bool
		select {
		case j, ok = <-w.jobs:
		case <-timer.C:
			if unpark(w) {
				return
			}
			j, ok = <-w.jobs // taken meanwhile: its call is on the way
		}
		if !ok {
			return // retired
		}
	}
}

// agentOnce holds the agent's own identity, read once: asuser never
// changes the credentials of a thread that runs anything but a user's
// calls.
var agentOnce = sync.OnceValues(current)

// creds is what a worker needs of the agent's identity.
type creds struct {
	ruid, euid, suid int
	dumpable         int
}

func current() (*creds, error) {
	c := &creds{}
	c.ruid, c.euid, c.suid = unix.Getresuid()
	d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("get dumpable: %w", err)
	}
	c.dumpable = d
	if c.ruid != 0 || c.suid != 0 {
		// Without a root real and saved uid the user's processes could
		// signal or ptrace the thread, and it could not take the user's
		// identity in the first place.
		return nil, fmt.Errorf("act as user: the agent is not root (uids %d/%d/%d)", c.ruid, c.euid, c.suid)
	}
	return c, nil
}

// become gives the current thread id's identity. Order matters: groups and
// gid need CAP_SETGID, which the uid change takes away.
func become(id Identity) error {
	if err := setgroups(id.Groups); err != nil {
		return err
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(id.GID), ^uintptr(0)); e != 0 {
		return fmt.Errorf("setresgid: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(id.UID), ^uintptr(0)); e != 0 {
		return fmt.Errorf("setresuid: %w", e)
	}
	// The kernel clears the effective capabilities when the effective uid
	// leaves 0, unless SECBIT_NO_SETUID_FIXUP says otherwise; clear them
	// explicitly so CAP_DAC_OVERRIDE & co never outlive the switch.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	if caps[0].Effective != 0 || caps[1].Effective != 0 {
		caps[0].Effective, caps[1].Effective = 0, 0
		if err := unix.Capset(&hdr, &caps[0]); err != nil {
			return fmt.Errorf("drop effective capabilities: %w", err)
		}
	}
	return nil
}

// setgroups sets the supplementary groups of the calling thread only
// (syscall.Setgroups changes every thread of the process).
func setgroups(groups []uint32) error {
	var p *uint32
	if len(groups) > 0 {
		p = &groups[0]
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(unsafe.Pointer(p)), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	return nil
}
