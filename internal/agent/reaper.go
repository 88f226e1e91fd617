package agent

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Reaper owns waiting for child processes.
//
// As PID 1 (or a child subreaper) the agent inherits every orphan of the
// sandbox and must reap them all, or zombies pile up until the pids limit is
// hit. A global wait4(-1) loop and per-child waits (exec.Cmd.Wait) race for
// the same exit statuses, so there is exactly one waiter: the Reaper. It
// reaps everything and hands the statuses of the processes the agent started
// to whoever registered for them.
//
// A nil *Reaper is valid: then every started process is waited for by pid
// only (wait4(pid)), which is what tests and non-PID-1 callers want since
// they must not steal the statuses of other children of their process.
type Reaper struct {
	// mu is held across fork+register so that the loop cannot reap a pid
	// before its waiter is registered.
	mu      sync.Mutex
	waiters map[int]chan unix.WaitStatus
	kick    chan struct{}
}

// NewReaper makes a reaper; call Run to start reaping.
func NewReaper() *Reaper {
	return &Reaper{waiters: map[int]chan unix.WaitStatus{}, kick: make(chan struct{}, 1)}
}

// Run reaps children until ctx ends. It must be the only code in the process
// that waits for children.
func (r *Reaper) Run(ctx context.Context) {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	// The tick is a safety net in case a SIGCHLD is coalesced away while
	// the loop is between wait4 calls (it should not be, but a missed reap
	// would leave a command hanging forever). It runs only while a command
	// is awaited: an idle sandbox's agent should not wake at all, since
	// under gVisor every wake is trips through the sentry (with Go's
	// GOMAXPROCS re-read, also once a second, an idle agent cost its host
	// ~2 ms of CPU a second; a raw idle runsc container 0.01 ms).
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		r.reapAll()
		var safety <-chan time.Time
		if r.awaiting() {
			safety = tick.C
		}
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		case <-r.kick:
		case <-safety:
		}
	}
}

// awaiting reports whether a started command has not been reaped yet.
func (r *Reaper) awaiting() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waiters) > 0
}

func (r *Reaper) reapAll() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		r.mu.Lock()
		ch := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if ch != nil {
			ch <- ws
		}
	}
}

// start runs fork (which must start exactly one child and return its pid)
// and returns a channel that receives the child's wait status.
func (r *Reaper) start(fork func() (int, error)) (int, <-chan unix.WaitStatus, error) {
	ch := make(chan unix.WaitStatus, 1)
	if r == nil {
		pid, err := fork()
		if err != nil {
			return 0, nil, err
		}
		go waitPid(pid, ch)
		return pid, ch, nil
	}
	r.mu.Lock()
	pid, err := fork()
	if err == nil {
		r.waiters[pid] = ch
	}
	r.mu.Unlock()
	if err != nil {
		return 0, nil, err
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
	return pid, ch, nil
}

func waitPid(pid int, ch chan<- unix.WaitStatus) {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			// ECHILD: someone else reaped it; report it as killed rather
			// than hanging the command forever.
			ws = unix.WaitStatus(unix.SIGKILL)
		}
		ch <- ws
		return
	}
}
