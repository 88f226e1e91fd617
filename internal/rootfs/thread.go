package rootfs

import (
	goruntime "runtime"

	"golang.org/x/sys/unix"
)

// OnThrowawayThread runs fn on an OS thread of its own that is destroyed
// afterwards, so fn may change per-thread state (mount namespace, fs
// credentials) that no other goroutine must inherit. It never uses the
// process's main thread: Go does not destroy that one but parks it forever,
// and it is the thread /proc/self shows, so a changed main thread would
// silently change what /proc/self/mountinfo says for the whole process.
func OnThrowawayThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		// No UnlockOSThread: exiting locked makes Go destroy the thread.
		if unix.Gettid() == unix.Getpid() {
			// On the main thread: hold it (locked, blocked on the channel) so
			// the scheduler has to run the retry on another thread, then give
			// it back untouched.
			errc <- OnThrowawayThread(fn)
			goruntime.UnlockOSThread()
			return
		}
		errc <- fn()
	}()
	return <-errc
}
