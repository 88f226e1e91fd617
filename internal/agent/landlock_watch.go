package agent

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// keyWatch spares each command under the namespaces runtime the reads
// currentRulesetKey would otherwise make every time: the listings of the
// private dir's ancestors and the mount table (measured: 0.1-0.2 ms of
// every exec's start, more than running under the ruleset costs the
// command itself). It keeps what it read last and reads again only when
// something may have changed:
//   - an ancestor's stamp (fileStamp: inode, size, mtime, ctime) differs
//     from the one taken before the last read kept. A read is kept only
//     if no stamp was racy (the directory changed within racyWindow,
//     where a second change in the same clock tick could leave its stamp
//     as it was): users' rule, git's. An entry made, removed or renamed
//     changes its directory's ctime, and user space can set a file's
//     mtime back but never its ctime;
//   - a poll of /proc/self/mountinfo says POLLPRI, which the kernel
//     reports after any mount, unmount, move or remount in the agent's
//     mount namespace (a mount over an ancestor's entry changes what that
//     entry is, and no stamp says so).
//
// Stamps are taken and the poll answered before the reads, so a change
// made while reading shows at the next check. A propagation change (mount
// --make-private) changes mountinfo without a poll event; it changes no
// path's inode, so the rules would come out the same. While the mount
// table cannot be opened (tried again at every call), every command reads
// again, as without the watch.
// (inotify would also tell, but its instances count against the host user
// all namespaces sandboxes' roots map to, 128 by default: each agent
// holding one would leave none to the sandboxes' own programs.)
type keyWatch struct {
	mu       sync.Mutex
	root     string      // the tree the reads are of; "" none yet
	mountsFD int         // /proc/self/mountinfo, -1: none
	stamps   []fileStamp // taken before the read kept
	kept     bool        // listings and mounts hold a read to go by
	listings string
	mounts   string
}

var rulesetSources = &keyWatch{mountsFD: -1}

// keyReads counts the reads of the ancestors and the mount table, and
// keyReadsForMounts the calls whose poll said the mount table may have
// changed (any mount in the mount namespace does), for tests.
var keyReads, keyReadsForMounts atomic.Int64

// get returns the listings of ancestors (under root) and the mount table,
// read again only if something may have changed since the last read.
func (w *keyWatch) get(root string, ancestors []string) (listings, mounts string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.root != root {
		w.reset(root)
	}
	if w.mountsFD < 0 {
		w.openMounts()
	}
	stamps := make([]fileStamp, len(ancestors))
	for i, d := range ancestors {
		stamps[i] = stampOf(d)
	}
	mountsChanged := w.mountsChanged()
	if mountsChanged {
		keyReadsForMounts.Add(1)
	}
	settled := !racy(stamps, time.Now())
	if w.kept && settled && !mountsChanged && slices.Equal(stamps, w.stamps) {
		return w.listings, w.mounts
	}
	keyReads.Add(1)
	var b strings.Builder
	readable := true
	for _, d := range ancestors {
		l, err := dirListing(d)
		if err != nil {
			readable = false
			l = unique(err)
		}
		fmt.Fprintf(&b, "%s\n%s\n", d, l)
	}
	m, err := readMounts(w.mountsFD)
	if err != nil {
		readable = false
		m = unique(err)
	}
	w.listings, w.mounts, w.stamps = b.String(), m, stamps
	// A racy read, or one of something unreadable (whose unique text keeps
	// every ruleset's key from matching meanwhile), is made again next time.
	w.kept = settled && readable
	return w.listings, w.mounts
}

// reset forgets what was read, for root's reads.
func (w *keyWatch) reset(root string) {
	if w.mountsFD >= 0 {
		unix.Close(w.mountsFD)
	}
	w.root, w.mountsFD, w.stamps, w.kept = root, -1, nil, false
}

// openMounts opens the mount table; what was read is not gone by until a
// read follows the open (a change before it raised no poll event). A raw
// descriptor, not an *os.File: os.Open hands a pollable file (this one is)
// to the runtime's epoll, whose own polls take the kernel's change notice
// before mountsChanged can (tried: an unmount went unseen).
func (w *keyWatch) openMounts() {
	if fd, err := unix.Open("/proc/self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		w.mountsFD, w.kept = fd, false
	}
}

// mountsChanged reports whether the kernel said the mount table changed
// since the last call (the poll takes the news); true if it cannot tell.
func (w *keyWatch) mountsChanged() bool {
	if w.mountsFD < 0 {
		return true
	}
	fds := []unix.PollFd{{Fd: int32(w.mountsFD), Events: unix.POLLPRI}}
	for {
		_, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err != nil || fds[0].Revents&(unix.POLLPRI|unix.POLLERR|unix.POLLNVAL) != 0
	}
}

// racy reports whether any of stamps may hide a change made in the same
// clock tick (or is missing).
func racy(stamps []fileStamp, now time.Time) bool {
	for _, s := range stamps {
		if !s.ok || s.racy(now) {
			return true
		}
	}
	return false
}

// readMounts reads the mount table from fd, from its start.
func readMounts(fd int) (string, error) {
	if fd < 0 {
		return "", errors.New("/proc/self/mountinfo is not open")
	}
	if _, err := unix.Seek(fd, 0, io.SeekStart); err != nil {
		return "", fmt.Errorf("seek /proc/self/mountinfo: %w", err)
	}
	var b strings.Builder
	buf := make([]byte, 8192)
	for {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("read /proc/self/mountinfo: %w", err)
		}
		if n == 0 {
			return b.String(), nil
		}
		b.Write(buf[:n])
	}
}
