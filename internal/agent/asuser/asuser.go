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
// what lets the thread change back afterwards. setfsuid(2) would be the
// narrower tool but gVisor does not implement it (ENOSYS); setresuid and
// setgroups are per-task there as in Linux.
//
// While the thread is the user, processes of that user still cannot signal
// or ptrace it: both checks compare against its real and saved uid, which
// stay root. They can lower its scheduling (nice, policy, CPU affinity go
// by the effective uid), so those are part of what is checked before the
// thread is reused.
package asuser

import (
	"fmt"
	goruntime "runtime"
	"slices"
	"sync"
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
// that are meant to act as the user (they run on other threads). A panic in
// fn is re-raised in the caller.
//
// The thread goes back to the pool only once its credentials were restored
// and verified; if anything is off it is destroyed instead, so no other
// goroutine ever runs with a user's identity.
func Run(id Identity, fn func() error) error {
	if id.IsRoot() {
		return fn()
	}
	r := <-start(id, fn)
	if r.panicked != nil {
		panic(r.panicked)
	}
	return r.err
}

type result struct {
	err      error
	panicked any
}

// start runs fn as id on a thread of its own and delivers the outcome.
func start(id Identity, fn func() error) <-chan result {
	done := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Never the main thread: Go parks rather than destroys it when a
			// goroutine exits locked to it, and /proc/self describes it.
			// Holding it here makes the scheduler run the retry elsewhere.
			r := <-start(id, fn)
			goruntime.UnlockOSThread()
			done <- r
			return
		}
		saved, err := pooled()
		if err != nil {
			goruntime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		var res result
		if err := become(id); err != nil {
			res.err = fmt.Errorf("act as uid %d: %w", id.UID, err)
		} else {
			func() {
				defer func() { res.panicked = recover() }()
				res.err = fn()
			}()
		}
		if restore(saved) == nil {
			goruntime.UnlockOSThread()
		}
		// Otherwise the goroutine exits locked and Go destroys the thread.
		done <- res
	}()
	return done
}

// pooledOnce holds the identity of the agent's pooled threads, read once:
// every thread Run gives back was verified to be exactly that again, so it
// need not be read (nine syscalls, each a trip through gVisor's sentry)
// before every switch.
var pooledOnce = sync.OnceValues(current)

func pooled() (*creds, error) { return pooledOnce() }

// creds is a thread's identity as Run changes it.
type creds struct {
	ruid, euid, suid int
	rgid, egid, sgid int
	groups           []uint32
	caps             [2]unix.CapUserData
	dumpable         int
	nice, policy     int
	cpus             unix.CPUSet
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
	if c.nice, err = unix.Getpriority(unix.PRIO_PROCESS, 0); err != nil {
		return nil, fmt.Errorf("getpriority: %w", err)
	}
	policy, _, e := unix.RawSyscall(unix.SYS_SCHED_GETSCHEDULER, 0, 0, 0)
	if e != 0 {
		return nil, fmt.Errorf("sched_getscheduler: %w", e)
	}
	c.policy = int(policy)
	if err := unix.SchedGetaffinity(0, &c.cpus); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
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
		now.nice != c.nice || now.policy != c.policy || now.cpus != c.cpus {
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
