// Package asuser runs a function with a sandbox user's identity, so that
// the agent (root, PID 1) touches files exactly as that user would: the
// kernel checks every path component, symlink and permission against the
// user, and what the function creates is owned by the user.
//
// Linux credentials are per thread (glibc and Go's syscall.Setresuid only
// make them look per process by changing every thread), so Run locks a
// goroutine to an OS thread and changes just that thread with the raw
// syscalls: supplementary groups, effective gid, effective uid, and an
// empty effective capability set. The real and saved uid stay 0, which is
// what lets the thread change back. setfsuid(2) would be the narrower tool
// but gVisor does not implement it (ENOSYS); setresuid and setgroups are
// per-task there as in Linux.
//
// While the thread is the user, processes of that user still cannot signal
// or ptrace it: both checks compare against its real and saved uid, which
// stay root. They can lower its scheduling (nice, policy, CPU affinity go
// by the effective uid), so those are checked after every call, and a
// thread found changed is destroyed rather than reused.
package asuser

import (
	"fmt"
	goruntime "runtime"
	"slices"
	"sync"
	"sync/atomic"
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
// credentials for the duration of the call; fn must not start goroutines
// or processes that are meant to act as the user (they run on other
// threads, or keep the thread's root real uid), nor unlock the thread or
// end its goroutine. A panic in fn is re-raised in the caller.
//
// A thread that served id waits a while for id's next call, holding id's
// groups and gid but root's effective uid (so that the user's processes
// cannot re-nice or re-pin it meanwhile); the next call only switches the
// effective uid, and the capabilities with it. Switching groups, gid and
// uid there and back and verifying every piece of the way back, per call,
// took about 20 syscalls, each a trip through gVisor's sentry: 160-180 µs
// per file call in a gVisor sandbox. A thread leaves the pool of waiting
// ones (idle for idleFor, or more waiting than maxIdle) fully restored and
// verified, back to Go's pool of threads; if anything is off, or fn
// panicked, its goroutine ends locked to it and Go destroys it, so no other
// goroutine ever runs with a user's identity.
func Run(id Identity, fn func() error) error {
	if id.IsRoot() {
		return fn()
	}
	id.Groups = slices.Clone(id.Groups)
	key := id.key()
	done := make(chan result, 1)
	j := job{fn: fn, done: done}
	if w := takeIdle(key); w != nil {
		w.jobs <- j
	} else if err := startWorker(id, key, j); err != nil {
		return err
	}
	r := <-done
	if r.panicked != nil {
		panic(r.panicked)
	}
	return r.err
}

// idleFor is how long a thread waits for its identity's next call before
// it goes back to Go's pool: long enough for a client's burst of file
// calls, short enough that an idle sandbox keeps nothing of a user.
var idleFor atomic.Int64

func init() { idleFor.Store(int64(10 * time.Second)) }

const (
	// maxIdle threads of one identity wait at a time, maxIdleTotal of all
	// identities; concurrent calls beyond them get threads that go back
	// after their call.
	maxIdle      = 4
	maxIdleTotal = 8
)

var (
	mu sync.Mutex
	// idle holds the threads waiting for a call, by identity; idleCount
	// is their number.
	idle      = map[string][]*worker{}
	idleCount int
)

type worker struct {
	key  string
	uid  uint32
	jobs chan job
	// setDumpable: an effective uid change leaves the process's dumpable
	// flag other than the agent's, so every switch puts it back.
	setDumpable bool
	// capset: the kernel's capability fixups do not apply to this
	// identity's switches, so every switch sets the capabilities itself.
	capset bool
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
	idleCount--
	return w
}

// park puts w on the idle list; false when enough threads wait already.
func park(w *worker) bool {
	mu.Lock()
	defer mu.Unlock()
	if len(idle[w.key]) >= maxIdle || idleCount >= maxIdleTotal {
		return false
	}
	idle[w.key] = append(idle[w.key], w)
	idleCount++
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
	idleCount--
	return true
}

// retire sends every waiting thread back to Go's pool; calls under way
// finish on theirs. Tests use it to see every thread back to root.
func retire() {
	mu.Lock()
	all := idle
	idle, idleCount = map[string][]*worker{}, 0
	mu.Unlock()
	for _, ws := range all {
		for _, w := range ws {
			close(w.jobs)
		}
	}
}

// startWorker starts a thread with id's credentials that runs first, then
// serves more calls of id. It returns once the thread has id's
// credentials, or with the reason it could not get them.
func startWorker(id Identity, key string, first job) error {
	ready := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Never the main thread: Go parks rather than destroys it when a
			// goroutine exits locked to it, and /proc/self describes it.
			// Holding it here makes the scheduler start the worker elsewhere.
			ready <- startWorker(id, key, first)
			goruntime.UnlockOSThread()
			return
		}
		agent, err := pooled()
		if err != nil {
			goruntime.UnlockOSThread()
			ready <- err
			return
		}
		if err := become(id); err != nil {
			leave(agent)
			ready <- fmt.Errorf("act as uid %d: %w", id.UID, err)
			return
		}
		// The euid change reset the process's dumpable flag to what the
		// host resets it to (Linux: fs.suid_dumpable, 0 unless an admin
		// set it; gVisor: always 0): learn that value here, so that the
		// flag is put back after every later switch exactly when it
		// differs from the agent's (which keeps itself at 0).
		reset, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
		w := &worker{key: key, uid: id.UID, jobs: make(chan job, 1), setDumpable: err != nil || reset != agent.dumpable,
			// root's uid with another gid changes no euid: no fixups apply.
			capset: !agent.fixups || id.UID == uint32(agent.euid)}
		if err := unix.Prctl(unix.PR_SET_DUMPABLE, uintptr(agent.dumpable), 0, 0, 0); err != nil {
			leave(agent)
			ready <- fmt.Errorf("act as uid %d: set dumpable: %w", id.UID, err)
			return
		}
		ready <- nil
		serve(w, agent, first)
	}()
	return <-ready
}

// serve runs j and the calls of its identity that follow on the current
// thread (locked, with the identity's credentials) until the thread is no
// longer wanted; it returns with the thread unlocked only if the thread
// is the agent's again.
func serve(w *worker, agent *creds, j job) {
	timer := time.NewTimer(time.Duration(idleFor.Load()))
	defer timer.Stop()
	for {
		var r result
		func() {
			defer func() { r.panicked = recover() }()
			r.err = j.fn()
		}()
		if r.panicked != nil {
			// fn may have left the thread in any state: destroyed.
			j.done <- r
			return
		}
		err := rest(w, agent)
		// Parked before the caller hears back, so that a retire after Run
		// returned finds the thread.
		parked := err == nil && park(w)
		j.done <- r
		if err != nil {
			return // destroyed: the user changed what it could of the thread
		}
		if !parked {
			leave(agent)
			return
		}
		timer.Reset(time.Duration(idleFor.Load()))
		var ok bool
		select {
		case j, ok = <-w.jobs:
		case <-timer.C:
			if unpark(w) {
				leave(agent)
				return
			}
			j, ok = <-w.jobs // taken meanwhile: its call is on the way
		}
		if !ok {
			leave(agent) // retired
			return
		}
		if err := resume(w, agent); err != nil {
			j.done <- result{err: fmt.Errorf("act as uid %d: %w", w.uid, err)}
			return // destroyed: it could not be the user again
		}
	}
}

// rest gives a thread between calls root's effective uid and capabilities
// back (it keeps the user's gid and groups, which nothing uses while it
// waits), and checks that the user's processes did not change its
// scheduling while it was theirs.
func rest(w *worker, agent *creds) error {
	if err := switchEUID(w, uint32(agent.euid), agent, agent.caps); err != nil {
		return err
	}
	return sameScheduling(agent)
}

// resume makes a resting thread the user again: the effective uid, and no
// effective capabilities.
func resume(w *worker, agent *creds) error {
	caps := agent.caps
	caps[0].Effective, caps[1].Effective = 0, 0
	return switchEUID(w, w.uid, agent, caps)
}

// switchEUID sets the thread's effective uid, its effective capabilities
// to caps where the kernel does not do it by itself (w.capset), and
// the process's dumpable flag back where the change moved it
// (w.setDumpable).
func switchEUID(w *worker, euid uint32, agent *creds, caps [2]unix.CapUserData) error {
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(euid), ^uintptr(0)); e != 0 {
		return fmt.Errorf("setresuid: %w", e)
	}
	if w.capset {
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		if err := unix.Capset(&hdr, &caps[0]); err != nil {
			return fmt.Errorf("capset: %w", err)
		}
	}
	if w.setDumpable {
		if err := unix.Prctl(unix.PR_SET_DUMPABLE, uintptr(agent.dumpable), 0, 0, 0); err != nil {
			return fmt.Errorf("set dumpable: %w", err)
		}
	}
	return nil
}

// sameScheduling checks the current thread's scheduling against the
// agent's.
func sameScheduling(agent *creds) error {
	now, err := currentScheduling()
	if err != nil {
		return err
	}
	if now != agent.sched {
		return fmt.Errorf("the thread's scheduling was changed")
	}
	return nil
}

// scheduling is what the user's processes can change of a thread whose
// effective uid is theirs.
type scheduling struct {
	nice, policy int
	cpus         unix.CPUSet
}

// currentScheduling reads the current thread's nice value, policy and CPU
// affinity.
func currentScheduling() (scheduling, error) {
	var s scheduling
	var err error
	if s.nice, err = unix.Getpriority(unix.PRIO_PROCESS, 0); err != nil {
		return s, fmt.Errorf("getpriority: %w", err)
	}
	policy, _, e := unix.RawSyscall(unix.SYS_SCHED_GETSCHEDULER, 0, 0, 0)
	if e != 0 {
		return s, fmt.Errorf("sched_getscheduler: %w", e)
	}
	s.policy = int(policy)
	if err := unix.SchedGetaffinity(0, &s.cpus); err != nil {
		return s, fmt.Errorf("sched_getaffinity: %w", err)
	}
	return s, nil
}

// leave gives the thread back to Go's pool once it is exactly the agent's
// again; otherwise it stays locked and Go destroys it when its goroutine
// ends (callers return right after).
func leave(agent *creds) {
	if restore(agent) == nil {
		goruntime.UnlockOSThread()
	}
}

// pooledOnce holds the identity of the agent's own threads, read once:
// every thread a worker gives back was verified to be exactly that again,
// so it need not be read (nine syscalls, each a trip through gVisor's
// sentry) before every worker starts.
var pooledOnce = sync.OnceValues(current)

func pooled() (*creds, error) { return pooledOnce() }

// creds is a thread's identity as Run changes it.
type creds struct {
	ruid, euid, suid int
	rgid, egid, sgid int
	groups           []uint32
	caps             [2]unix.CapUserData
	dumpable         int
	// fixups: the kernel gives the effective capabilities back (the
	// permitted ones, which are the agent's effective ones) when the
	// effective uid returns to 0, and clears them when it leaves 0
	// (capabilities(7); gVisor does the same), so a resting thread's uid
	// switch needs no capset of its own.
	fixups bool
	sched  scheduling
}

func current() (*creds, error) {
	c := &creds{}
	c.ruid, c.euid, c.suid = unix.Getresuid()
	c.rgid, c.egid, c.sgid = unix.Getresgid()
	n, _, e := unix.RawSyscall(unix.SYS_GETGROUPS, 0, 0, 0)
	if e != 0 {
		return nil, fmt.Errorf("getgroups: %w", e)
	}
	c.groups = make([]uint32, n)
	if n > 0 {
		m, _, e := unix.RawSyscall(unix.SYS_GETGROUPS, n, uintptr(unsafe.Pointer(&c.groups[0])), 0)
		if e != 0 {
			return nil, fmt.Errorf("getgroups: %w", e)
		}
		c.groups = c.groups[:m]
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capget(&hdr, &c.caps[0]); err != nil {
		return nil, fmt.Errorf("capget: %w", err)
	}
	d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("get dumpable: %w", err)
	}
	c.dumpable = d
	// SECBIT_NO_SETUID_FIXUP (1 << SECURE_NO_SETUID_FIXUP, 2) turns the
	// kernel's fixups off; without an answer, capset every time.
	bits, err := unix.PrctlRetInt(unix.PR_GET_SECUREBITS, 0, 0, 0, 0)
	c.fixups = err == nil && bits&(1<<2) == 0 &&
		c.caps[0].Effective == c.caps[0].Permitted && c.caps[1].Effective == c.caps[1].Permitted
	if c.sched, err = currentScheduling(); err != nil {
		return nil, err
	}
	if c.ruid != 0 || c.suid != 0 {
		// Without a root real or saved uid the thread could not change back.
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

// restore puts the thread back to c and checks that it is exactly c again.
func restore(c *creds) error {
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(c.euid), ^uintptr(0)); e != 0 {
		return fmt.Errorf("setresuid: %w", e)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	caps := c.caps
	if err := unix.Capset(&hdr, &caps[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(c.egid), ^uintptr(0)); e != 0 {
		return fmt.Errorf("setresgid: %w", e)
	}
	if err := setgroups(c.groups); err != nil {
		return err
	}
	// An effective uid change resets the process's dumpable flag (and it is
	// per process, not per thread): put it back as it was.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, uintptr(c.dumpable), 0, 0, 0); err != nil {
		return fmt.Errorf("set dumpable: %w", err)
	}
	now, err := current()
	if err != nil {
		return err
	}
	if now.ruid != c.ruid || now.euid != c.euid || now.suid != c.suid ||
		now.rgid != c.rgid || now.egid != c.egid || now.sgid != c.sgid ||
		!slices.Equal(now.groups, c.groups) || now.caps != c.caps ||
		now.sched != c.sched {
		return fmt.Errorf("credentials not restored")
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
