package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unsafe"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/envd/filesystem"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// maxPendingEvents bounds the events a watcher queues for a slow or absent
// reader; past it new events are dropped (and logged).
const maxPendingEvents = 10000

const inotifyMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// dirWatcher watches a directory (and, if recursive, every directory below
// it, including ones created later) with inotify. Event names are relative
// to the watched directory, as in envd.
type dirWatcher struct {
	root         string
	recursive    bool
	includeEntry bool
	names        idNames
	user         *sandboxUser // watches are added and entries read as this user
	file         *os.File     // the inotify fd, pollable so Close unblocks Read
	fd           int
	wake         chan struct{}

	mu      sync.Mutex
	wds     map[int]string // watch descriptor -> directory
	pending []*filesystem.FilesystemEvent
	dropped int
	closed  bool
}

// newDirWatcher must be called as u (u.do): inotify_add_watch checks that
// the caller may read each directory.
func newDirWatcher(root string, recursive, includeEntry bool, names idNames, u *sandboxUser) (*dirWatcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify init: %w", err)
	}
	w := &dirWatcher{
		root: root, recursive: recursive, includeEntry: includeEntry, names: names, user: u,
		file: os.NewFile(uintptr(fd), "inotify"), fd: fd,
		wake: make(chan struct{}, 1),
		wds:  map[int]string{},
	}
	if err := w.add(root); err != nil {
		w.file.Close()
		return nil, err
	}
	go w.readLoop()
	return w, nil
}

// add watches dir, and its subdirectories when recursive.
func (w *dirWatcher) add(dir string) error {
	if !w.recursive {
		return w.addOne(dir)
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil
		}
		if !d.IsDir() {
			return nil
		}
		if err := w.addOne(p); err != nil && p == dir {
			return err
		}
		return nil
	})
}

func (w *dirWatcher) addOne(dir string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return os.ErrClosed
	}
	wd, err := unix.InotifyAddWatch(w.fd, dir, inotifyMask)
	if err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	w.wds[wd] = dir
	return nil
}

func (w *dirWatcher) close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	w.mu.Unlock()
	w.file.Close()
	w.notify()
}

func (w *dirWatcher) isClosed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

func (w *dirWatcher) notify() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// take returns the queued events.
func (w *dirWatcher) take() []*filesystem.FilesystemEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	evs := w.pending
	w.pending = nil
	return evs
}

func (w *dirWatcher) readLoop() {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				slog.Warn("inotify read", "root", w.root, "err", err)
			}
			w.close()
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			name := string(nameBytes)
			for len(name) > 0 && name[len(name)-1] == 0 {
				name = name[:len(name)-1]
			}
			w.handle(int(ev.Wd), ev.Mask, name)
		}
	}
}

func (w *dirWatcher) handle(wd int, mask uint32, name string) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		slog.Warn("inotify queue overflow; events were lost", "root", w.root)
		return
	}
	w.mu.Lock()
	dir, ok := w.wds[wd]
	if mask&unix.IN_IGNORED != 0 {
		delete(w.wds, wd)
	}
	w.mu.Unlock()
	if !ok || name == "" {
		return
	}
	full := filepath.Join(dir, name)
	// The same mapping as fsnotify, which envd uses.
	var typ filesystem.EventType
	addDir := false
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		typ = filesystem.EventType_EVENT_TYPE_CREATE
		addDir = w.recursive && mask&unix.IN_ISDIR != 0
	case mask&unix.IN_MODIFY != 0:
		typ = filesystem.EventType_EVENT_TYPE_WRITE
	case mask&unix.IN_DELETE != 0:
		typ = filesystem.EventType_EVENT_TYPE_REMOVE
	case mask&unix.IN_MOVED_FROM != 0:
		typ = filesystem.EventType_EVENT_TYPE_RENAME
	case mask&unix.IN_ATTRIB != 0:
		typ = filesystem.EventType_EVENT_TYPE_CHMOD
	default:
		return
	}
	rel, err := filepath.Rel(w.root, full)
	if err != nil {
		rel = full
	}
	ev := &filesystem.FilesystemEvent{Name: rel, Type: typ}
	withEntry := w.includeEntry && typ != filesystem.EventType_EVENT_TYPE_REMOVE && typ != filesystem.EventType_EVENT_TYPE_RENAME
	if addDir || withEntry {
		// As the user, like the watch itself: a new directory the user
		// cannot read is not watched, an entry it cannot stat not shown.
		_ = w.user.do(func() error {
			if addDir {
				_ = w.add(full)
			}
			if !withEntry {
				return nil
			}
			if fi, err := os.Lstat(full); err == nil {
				ev.Entry = entryFromInfo(full, full, fi, w.names)
			}
			return nil
		})
	}
	w.mu.Lock()
	if len(w.pending) >= maxPendingEvents {
		w.dropped++
		if w.dropped == 1 {
			slog.Warn("watcher queue full; dropping events", "root", w.root)
		}
	} else {
		w.pending = append(w.pending, ev)
	}
	w.mu.Unlock()
	w.notify()
}

// network filesystems' magic numbers (linux/magic.h): inotify does not see
// changes made by other clients there, so envd refuses them by default.
var networkFSMagic = map[int64]bool{0x6969: true, 0xFF534D42: true, 0x517B: true, 0xFE534D42: true, 0x65735546: true}

// openWatch validates a watch request and starts the watcher.
func (s *Server) openWatch(u *sandboxUser, path string, recursive, includeEntry, allowNetwork bool) (*dirWatcher, error) {
	p, err := s.resolve(path, u)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.KindInvalidArgument, err)
	}
	names := s.users.idNames()
	var w *dirWatcher
	err = u.do(func() error {
		st, err := os.Stat(p)
		if err != nil {
			return fsError(u.denied("watch", p, err))
		}
		if !st.IsDir() {
			return errdefs.InvalidArgument("path %s is not a directory", p)
		}
		if !allowNetwork {
			var sfs unix.Statfs_t
			if err := unix.Statfs(p, &sfs); err == nil && networkFSMagic[int64(sfs.Type)] {
				return errdefs.FailedPrecondition("path %s is on a network mount; set allowNetworkMounts to watch it", p)
			}
		}
		w, err = newDirWatcher(p, recursive, includeEntry, names, u)
		if err != nil {
			return fsError(u.denied("watch", p, err))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return w, nil
}

func (fsvc filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) (err error) {
	defer rpcError(&err)
	u, err := fsvc.s.requestUser(req.Header())
	if err != nil {
		return err
	}
	m := req.Msg
	w, err := fsvc.s.openWatch(u, m.GetPath(), m.GetRecursive(), m.GetIncludeEntry(), m.GetAllowNetworkMounts())
	if err != nil {
		return err
	}
	defer w.close()
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	keepalive := keepaliveInterval(req.Header())
	timer := time.NewTimer(keepalive)
	defer timer.Stop()
	// As in streamEvents: only the deadline ends the stream; a cancelled
	// request context alone can be spurious, and a client that left is
	// found by the next send failing.
	done := ctx.Done()
	for {
		select {
		case <-done:
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil
			}
			done = nil
			continue
		case <-fsvc.s.done:
			return nil
		case <-timer.C:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
			timer.Reset(keepalive)
		case <-w.wake:
			for _, ev := range w.take() {
				if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
					return err
				}
			}
			if w.isClosed() {
				return errdefs.Internal("watcher of %s stopped", w.root)
			}
		}
	}
}

// watcherTable holds the watchers of the non-streaming API (Python SDK).
type watcherTable struct {
	mu   sync.Mutex
	byID map[string]*dirWatcher
}

func (t *watcherTable) closeAll() {
	t.mu.Lock()
	ws := t.byID
	t.byID = map[string]*dirWatcher{}
	t.mu.Unlock()
	for _, w := range ws {
		w.close()
	}
}

func (fsvc filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (_ *connect.Response[filesystem.CreateWatcherResponse], err error) {
	defer rpcError(&err)
	u, err := fsvc.s.requestUser(req.Header())
	if err != nil {
		return nil, err
	}
	m := req.Msg
	w, err := fsvc.s.openWatch(u, m.GetPath(), m.GetRecursive(), m.GetIncludeEntry(), m.GetAllowNetworkMounts())
	if err != nil {
		return nil, err
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	t := &fsvc.s.watchers
	t.mu.Lock()
	t.byID[id] = w
	t.mu.Unlock()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

func (fsvc filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (_ *connect.Response[filesystem.GetWatcherEventsResponse], err error) {
	defer rpcError(&err)
	t := &fsvc.s.watchers
	t.mu.Lock()
	w := t.byID[req.Msg.GetWatcherId()]
	t.mu.Unlock()
	if w == nil {
		return nil, errdefs.NotFound("watcher with id %s not found", req.Msg.GetWatcherId())
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: w.take()}), nil
}

func (fsvc filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (_ *connect.Response[filesystem.RemoveWatcherResponse], err error) {
	defer rpcError(&err)
	t := &fsvc.s.watchers
	t.mu.Lock()
	w := t.byID[req.Msg.GetWatcherId()]
	delete(t.byID, req.Msg.GetWatcherId())
	t.mu.Unlock()
	if w == nil {
		return nil, errdefs.NotFound("watcher with id %s not found", req.Msg.GetWatcherId())
	}
	w.close()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
