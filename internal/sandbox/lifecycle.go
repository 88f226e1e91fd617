package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cella-sandbox/cella/internal/metrics"
	"github.com/cella-sandbox/cella/internal/tenant"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/rootfs"
)

// Lifecycle is a sandbox's policy beyond its TTL (Daytona-style). Zero
// durations are off.
//
//   - AutoStop: a running sandbox idle this long is paused (memory kept as
//     the runtime can: a gVisor checkpoint, a crun freeze). Idle means no
//     proxied request (exec, file operation, port traffic) in flight or
//     finished within the window, and no REST call acting on it.
//   - AutoArchive: a sandbox paused this long is archived: its checkpoint
//     image and writable layer go into <data>/archive/<id>.tar.gz and its
//     layer is unmounted and its image deleted (one compressed file left).
//     A frozen (crun) sandbox's memory is dropped first: it resumes with a
//     cold boot on its files.
//   - AutoDelete: a sandbox paused (archived or not) this long is killed.
type Lifecycle struct {
	AutoStop    time.Duration `json:"auto_stop,omitempty"`
	AutoArchive time.Duration `json:"auto_archive,omitempty"`
	AutoDelete  time.Duration `json:"auto_delete,omitempty"`
}

// MaxLifecycleDuration bounds each lifecycle duration.
const MaxLifecycleDuration = 10 * 365 * 24 * time.Hour

// Validate rejects negative or absurd durations.
func (l Lifecycle) Validate() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"autoStop", l.AutoStop}, {"autoArchive", l.AutoArchive}, {"autoDelete", l.AutoDelete}} {
		if f.d < 0 {
			return errdefs.InvalidArgument("lifecycle %s must not be negative (got %v)", f.name, f.d)
		}
		if f.d > MaxLifecycleDuration {
			return errdefs.InvalidArgument("lifecycle %s %v is above the maximum of 10 years", f.name, f.d)
		}
	}
	return nil
}

// LifecycleDefaults are the daemon's defaults, used for what a create
// request leaves unset.
func (m *Manager) LifecycleDefaults() Lifecycle { return m.cfg.Lifecycle }

// Transition actions.
const (
	ActionPause   = "pause"   // auto-stop when idle, or the TTL with autoPause
	ActionKill    = "kill"    // the TTL without autoPause
	ActionArchive = "archive" // auto-archive of a paused sandbox
	ActionDelete  = "delete"  // auto-delete of a paused sandbox
)

// Transition is the next automatic lifecycle step of a sandbox.
type Transition struct {
	Action string    `json:"action"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
}

// LifecycleInfo is a sandbox's lifecycle for the API.
type LifecycleInfo struct {
	Policy         Lifecycle
	LastActivityAt time.Time
	PausedAt       time.Time // zero while running
	Archived       bool
	ArchivePath    string // set while archived
	Next           *Transition
}

// lifecycleState is the mutable lifecycle part of a Sandbox. The atomics are
// touched on every proxied request; pausedAt and archived are guarded by
// Sandbox.mu and persisted.
type lifecycleState struct {
	lastActive  atomic.Int64 // unix nanos of the last activity end
	inflight    atomic.Int32 // proxied requests in progress
	busy        atomic.Bool  // a lifecycle transition is running
	pausedAt    time.Time
	archived    bool
	archivePath string // set with archived
	remote      bool   // objects may be in the archive store (remote.go)
}

// Touch records activity on the sandbox now (it resets the idle timer).
func (s *Sandbox) Touch() { s.lc.lastActive.Store(time.Now().UnixNano()) }

// BeginActivity marks a request in progress (the sandbox is not idle while
// it runs); call the returned func when it ends.
func (s *Sandbox) BeginActivity() (end func()) {
	s.lc.inflight.Add(1)
	s.Touch()
	return func() {
		s.Touch()
		s.lc.inflight.Add(-1)
	}
}

func (s *Sandbox) lastActivity() time.Time {
	t := time.Unix(0, s.lc.lastActive.Load())
	if t.Before(s.StartedAt) {
		return s.StartedAt
	}
	return t
}

// lifecycleInfoLocked builds the LifecycleInfo; s.mu is held.
func (s *Sandbox) lifecycleInfoLocked() LifecycleInfo {
	li := LifecycleInfo{Policy: s.Options.Lifecycle, LastActivityAt: s.lastActivity().UTC(), PausedAt: s.lc.pausedAt, Archived: s.lc.archived}
	if s.lc.archived {
		li.ArchivePath = s.lc.archivePath
	}
	li.Next = s.nextLocked()
	return li
}

// nextLocked is the next automatic transition, or nil; s.mu is held.
func (s *Sandbox) nextLocked() *Transition {
	p := s.Options.Lifecycle
	var next *Transition
	consider := func(action string, at time.Time, reason string) {
		if next == nil || at.Before(next.At) {
			next = &Transition{Action: action, At: at.UTC(), Reason: reason}
		}
	}
	switch s.state {
	case StateRunning:
		if s.Options.AutoPause {
			consider(ActionPause, s.endAt, "timeout (autoPause)")
		} else {
			consider(ActionKill, s.endAt, "timeout")
		}
		if p.AutoStop > 0 {
			consider(ActionPause, s.lastActivity().Add(p.AutoStop), "idle (autoStop)")
		}
	case StatePaused:
		if p.AutoArchive > 0 && !s.lc.archived && !s.lc.pausedAt.IsZero() {
			consider(ActionArchive, s.lc.pausedAt.Add(p.AutoArchive), "paused (autoArchive)")
		}
		if p.AutoDelete > 0 && !s.lc.pausedAt.IsZero() {
			consider(ActionDelete, s.lc.pausedAt.Add(p.AutoDelete), "paused (autoDelete)")
		}
	}
	return next
}

// lifecycleTick runs at every reaper tick for one sandbox and starts the
// lifecycle transition that is due (idle auto-stop, auto-archive,
// auto-delete) in the background; true means one runs and the reaper
// leaves the sandbox alone this tick. TTL expiry stays the reaper's.
func (m *Manager) lifecycleTick(sb *Sandbox, now time.Time) bool {
	if sb.lc.busy.Load() {
		return true
	}
	p := sb.Options.Lifecycle
	if p == (Lifecycle{}) {
		return false
	}
	sb.mu.Lock()
	state, endAt, pausedAt, archived := sb.state, sb.endAt, sb.lc.pausedAt, sb.lc.archived
	sb.mu.Unlock()
	var action func()
	switch {
	case state == StateRunning && p.AutoStop > 0 && !now.After(endAt) &&
		sb.lc.inflight.Load() == 0 && now.Sub(sb.lastActivity()) >= p.AutoStop:
		action = func() {
			m.log.Info("sandbox idle: auto-stopping (pause)", "id", sb.ID, "idle_for", p.AutoStop)
			keepMemory := sb.Options.AutoPauseMemory == nil || *sb.Options.AutoPauseMemory
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			// A request that started since the check keeps it running.
			if sb.lc.inflight.Load() > 0 || time.Since(sb.lastActivity()) < p.AutoStop {
				return
			}
			if err := m.Pause(ctx, tenant.System, sb.ID, keepMemory); err != nil && !errdefs.Is(err, errdefs.KindConflict) {
				m.log.Error("auto-stop failed", "id", sb.ID, "err", err)
			}
		}
	case state == StatePaused && p.AutoDelete > 0 && !pausedAt.IsZero() && now.Sub(pausedAt) >= p.AutoDelete:
		action = func() {
			m.log.Info("sandbox paused for its autoDelete time: deleting it", "id", sb.ID, "paused_at", pausedAt)
			if err := m.kill(context.Background(), tenant.System, sb.ID, metrics.DeathTimeout); err != nil {
				m.log.Debug("auto-delete", "id", sb.ID, "err", err)
			}
		}
	case state == StatePaused && p.AutoArchive > 0 && !archived && !pausedAt.IsZero() && now.Sub(pausedAt) >= p.AutoArchive:
		action = func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			if err := m.Archive(ctx, sb.ID); err != nil && !errdefs.Is(err, errdefs.KindConflict) && !errdefs.Is(err, errdefs.KindNotFound) {
				m.log.Error("auto-archive failed", "id", sb.ID, "err", err)
			}
		}
	default:
		return false
	}
	if !sb.lc.busy.CompareAndSwap(false, true) {
		return true
	}
	go func() {
		defer sb.lc.busy.Store(false)
		action()
	}()
	return true
}

func archiveDir(dataDir string) string  { return filepath.Join(dataDir, "archive") }
func archivePath(dir, id string) string { return filepath.Join(dir, id+".tar.gz") }

func (m *Manager) archiveFile(sb *Sandbox) string {
	return archivePath(archiveDir(m.cfg.DataDir), sb.ID)
}

// Archive packs a paused sandbox's state into one file: its checkpoint
// image (if any) and its writable layer's files go into one tar.gz under
// <data>/archive (with an archive store, remote.go: sealed objects there),
// and its overlay and layer are unmounted, the layer's image deleted. A
// frozen sandbox loses its memory first (its container is destroyed;
// resume boots it cold). Resume unpacks the archive again. Archiving a
// running sandbox is a Conflict.
func (m *Manager) Archive(ctx context.Context, id string) error {
	sb, unlock, err := m.opLocked(id)
	if err != nil {
		return err
	}
	defer unlock()
	return m.archiveLocked(ctx, sb)
}

// opLocked finds a tracked sandbox (whoever owns it) and takes its opMu,
// which unlock releases; one killed meanwhile is not found.
func (m *Manager) opLocked(id string) (sb *Sandbox, unlock func(), err error) {
	if sb, err = m.get(id); err != nil {
		return nil, nil, err
	}
	sb.opMu.Lock()
	if !m.isTracked(sb) {
		sb.opMu.Unlock()
		return nil, nil, errdefs.NotFound("sandbox %q not found", id)
	}
	return sb, sb.opMu.Unlock, nil
}

// archiveLocked is Archive's work; sb.opMu is held.
func (m *Manager) archiveLocked(ctx context.Context, sb *Sandbox) error {
	id := sb.ID
	sb.mu.Lock()
	state, mode, archived, layer := sb.state, sb.pauseMode, sb.lc.archived, sb.layer
	sb.mu.Unlock()
	if state != StatePaused {
		return errdefs.Conflict("sandbox %q is %s: only a paused sandbox can be archived", id, state)
	}
	if archived {
		return errdefs.Conflict("sandbox %q is already archived", id)
	}
	if layer == nil {
		return fmt.Errorf("archive sandbox %s: its writable layer is not mounted", id)
	}
	start := time.Now()
	if mode == PauseFrozen {
		if err := m.cfg.Runtime.Destroy(ctx, sb.ID); err != nil {
			return fmt.Errorf("archive sandbox %s: drop its frozen container: %w", id, err)
		}
		m.detachNetwork(sb) // network.go: its slot went with the container
		mode = m.setPauseMode(ctx, sb, PauseStopped)
	}
	dirs := [][2]string{{"upper", layer.Upper}}
	if mode == PauseCheckpoint {
		dirs = append(dirs, [2]string{"checkpoint", checkpointDir(sb)})
	}
	var dst string
	var size int64
	if m.cfg.Archive != nil {
		dst = m.cfg.Archive.String() + "/sandboxes/" + id
		if err := m.archiveRemote(ctx, sb, dirs, mode); err != nil { // remote.go
			return fmt.Errorf("archive sandbox %s to %s: %w", id, m.cfg.Archive.String(), err)
		}
	} else {
		dst = m.archiveFile(sb)
		if err := writeArchiveFile(dst, dirs); err != nil {
			return fmt.Errorf("archive sandbox %s: %w", id, err)
		}
		if st, err := os.Stat(dst); err == nil {
			size = st.Size()
		}
	}
	sb.mu.Lock()
	sb.lc.archived, sb.lc.archivePath = true, dst
	sb.mu.Unlock()
	if err := m.persist(context.WithoutCancel(ctx), sb); err != nil {
		return err
	}
	// From here the archive is the sandbox's state: drop the layer.
	if err := layer.Unmount(); err != nil {
		m.log.Warn("unmount archived sandbox's layer", "id", id, "err", err)
	}
	sb.mu.Lock()
	sb.layer = nil
	sb.mu.Unlock()
	if err := os.RemoveAll(checkpointDir(sb)); err != nil {
		m.log.Warn("remove archived checkpoint", "id", id, "err", err)
	}
	m.log.Info("sandbox archived", "id", id, "mode", mode, "to", dst, "bytes", size, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// writeArchiveFile writes the archive of dirs to dst through a temporary
// file, synced before it takes dst's name.
func writeArchiveFile(dst string, dirs [][2]string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = writeArchive(f, dirs)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// unarchive brings an archived sandbox's layer (and checkpoint) back from
// its archive before a resume; sb.opMu is held. Not archived: nothing to do.
func (m *Manager) unarchive(ctx context.Context, sb *Sandbox) error {
	sb.mu.Lock()
	archived := sb.lc.archived
	sb.mu.Unlock()
	if !archived {
		return nil
	}
	start := time.Now()
	remote := m.cfg.Archive != nil && sb.lc.remote
	if remote {
		if err := m.claim(ctx, sb.ID); err != nil { // remote.go
			if errors.Is(err, ErrMoved) {
				m.forgetLocked(ctx, sb)
				return notFound(sb.ID)
			}
			return fmt.Errorf("unarchive sandbox %s: %w", sb.ID, err)
		}
	}
	tpl, err := m.templateOf(ctx, sb.Dir, sb.TemplateID)
	if err != nil {
		return fmt.Errorf("unarchive sandbox %s: %w", sb.ID, err)
	}
	// A sandbox made from a snapshot stacks on the snapshot's layers too
	// (origin.json): without them its upper would float over the bare
	// template.
	lowers := tpl.Lowers()
	if o, ok := readOrigin(sb.Dir); ok {
		if lowers, err = m.layersOf(snapshotRecord{Layers: o.Layers}, tpl.Lowers()); err != nil {
			return fmt.Errorf("unarchive sandbox %s: %w", sb.ID, err)
		}
	}
	_ = rootfs.UnmountAll(sb.Dir)
	layer, err := m.layers.MountStack(lowers, sb.Dir, mib(sb.Options.DiskMB))
	if err != nil {
		return fmt.Errorf("unarchive sandbox %s: %w", sb.ID, err)
	}
	ckpt := checkpointDir(sb)
	_ = os.RemoveAll(ckpt)
	if err := os.Mkdir(ckpt, 0o700); err != nil {
		layer.Unmount()
		return fmt.Errorf("unarchive sandbox %s: %w", sb.ID, err)
	}
	dests := map[string]string{"upper": layer.Upper, "checkpoint": ckpt}
	src := m.archiveFile(sb)
	if remote {
		err = m.unarchiveRemote(ctx, sb, dests) // remote.go
	} else {
		err = extractArchiveFile(src, dests)
	}
	if err != nil {
		layer.Unmount()
		os.RemoveAll(ckpt)
		if errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "no space") {
			return errdefs.ResourceExhausted("unarchive sandbox %s: %v", sb.ID, err)
		}
		return fmt.Errorf("unarchive sandbox %s: %w", sb.ID, err)
	}
	sb.mu.Lock()
	sb.layer = layer
	sb.lc.archived = false
	sb.mu.Unlock()
	if err := m.persist(context.WithoutCancel(ctx), sb); err != nil {
		return err
	}
	if !remote {
		if err := os.Remove(src); err != nil {
			m.log.Warn("remove archive", "file", src, "err", err)
		}
	}
	m.log.Info("sandbox unarchived", "id", sb.ID, "remote", remote, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// extractArchiveFile unpacks the archive file src into dests.
func extractArchiveFile(src string, dests map[string]string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	return extractArchive(f, dests)
}

// markPaused and markResumed keep the lifecycle clock; sb.mu is held.
func (s *Sandbox) markPausedLocked() { s.lc.pausedAt = time.Now().UTC() }
func (s *Sandbox) markResumedLocked() {
	s.lc.pausedAt = time.Time{}
	s.Touch()
}

// restoreLifecycle loads the persisted lifecycle state of a record at
// reconcile; the idle clock restarts with the daemon.
func (s *Sandbox) restoreLifecycle(r record) {
	s.lc.pausedAt = r.PausedAt
	s.lc.archived = r.Archived
	s.lc.remote = r.Remote
	s.Touch()
}

// adoptArchived keeps an archived sandbox across a daemon restart: all it
// needs is its archive file.
func (m *Manager) adoptArchived(sb *Sandbox) error {
	switch {
	case sb.lc.remote && m.cfg.Archive != nil:
		sb.lc.archivePath = m.cfg.Archive.String() + "/sandboxes/" + sb.ID
	case sb.lc.remote:
		return errors.New("its archive is in an object store, and this daemon has no --archive")
	default:
		if _, err := os.Stat(m.archiveFile(sb)); err != nil {
			return fmt.Errorf("its archive is gone: %w", err)
		}
		sb.lc.archivePath = m.archiveFile(sb)
	}
	m.mu.Lock()
	m.sandboxes[sb.ID] = sb
	m.mu.Unlock()
	return nil
}

// removeArchive deletes a sandbox's archive file, if any.
func (m *Manager) removeArchive(sb *Sandbox) {
	if err := os.Remove(m.archiveFile(sb)); err != nil && !errors.Is(err, os.ErrNotExist) {
		m.log.Error("remove archive", "id", sb.ID, "err", err)
	}
	_ = os.Remove(m.archiveFile(sb) + ".tmp")
}

// removeOrphanArchives deletes archives no tracked sandbox owns (reconcile).
func (m *Manager) removeOrphanArchives() {
	entries, _ := os.ReadDir(archiveDir(m.cfg.DataDir))
	for _, e := range entries {
		id := strings.TrimSuffix(strings.TrimSuffix(e.Name(), ".tmp"), ".tar.gz")
		if _, err := m.get(id); err == nil && !strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		m.log.Warn("removing archive without a sandbox", "file", e.Name())
		_ = os.Remove(filepath.Join(archiveDir(m.cfg.DataDir), e.Name()))
	}
}
