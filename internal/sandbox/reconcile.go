package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/diskimage"
	"github.com/cella-sandbox/cella/internal/rootfs"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// ReconcileReport says what reconciliation found and did.
type ReconcileReport struct {
	Adopted           []string // running sandboxes re-attached
	AdoptedPaused     []string // paused sandboxes kept paused
	MarkedDead        []string // records whose container was gone
	RemovedContainers []string // containers without a record
	RemovedDirs       []string // sandbox dirs without a record
	RemovedMounts     []string
	RemovedLoops      []string // loop devices of sandbox layers no record explains
	RemovedCgroups    []string
}

func (r ReconcileReport) String() string {
	return fmt.Sprintf("adopted=%d adopted_paused=%d marked_dead=%d removed_containers=%d removed_dirs=%d removed_mounts=%d removed_loops=%d removed_cgroups=%d",
		len(r.Adopted), len(r.AdoptedPaused), len(r.MarkedDead), len(r.RemovedContainers), len(r.RemovedDirs), len(r.RemovedMounts), len(r.RemovedLoops), len(r.RemovedCgroups))
}

// Reconcile makes the host match the records after a start or a crash:
// sandboxes whose container still runs are adopted again (their agent dials
// back in), paused sandboxes whose state is still on the host (mounted
// writable layer, plus the checkpoint image or the frozen container) stay
// paused and can be resumed, records whose container or paused state is gone
// are marked dead, and containers, mounts, cgroups and directories that no
// record explains are removed.
func (m *Manager) Reconcile(ctx context.Context) (ReconcileReport, error) {
	var rep ReconcileReport
	rows, err := m.cfg.Store.ListSandboxes(ctx)
	if err != nil {
		return rep, err
	}
	containers, err := m.cfg.Runtime.List(ctx)
	if err != nil {
		return rep, fmt.Errorf("list %s containers: %w", m.cfg.Runtime.Name(), err)
	}
	live := map[string]bool{}
	for _, id := range containers {
		live[id] = true
	}
	keep := map[string]bool{}          // sandbox IDs whose host resources (dir, mounts) stay
	keepContainer := map[string]bool{} // sandbox IDs whose container and cgroups stay

	type found struct {
		row store.Sandbox
		rec record
		sb  *Sandbox
	}
	var recs []found
	for _, row := range rows {
		var rec record
		if err := json.Unmarshal(row.Record, &rec); err != nil {
			m.log.Error("unreadable sandbox record, dropping it", "id", row.ID, "err", err)
			_ = m.cfg.Store.DeleteSandbox(ctx, row.ID)
			continue
		}
		if rec.Options.TeamID == "" {
			// A record from before teams: the team its key had (the
			// migration's backfill of the column), else the admin's.
			rec.Options.TeamID = cmp.Or(row.TeamID, tenant.AdminTeam)
		}
		sb := &Sandbox{
			ID: row.ID, TemplateID: row.TemplateID, Runtime: row.Runtime, Options: rec.Options,
			StartedAt: row.StartedAt.UTC(), EnvdAccessToken: rec.EnvdAccessToken, channelTokens: rec.tokens(),
			Dir: filepath.Join(sandboxesDir(m.cfg.DataDir), row.ID), state: row.State, endAt: row.EndAt.UTC(), err: rec.Error,
			pauseMode: rec.PauseMode, agent: m.agentOf(rec.Agent),
		}
		sb.restoreLifecycle(rec) // lifecycle.go
		recs = append(recs, found{row, rec, sb})
	}

	// Running sandboxes are adopted all at once: each adoption waits for its
	// agent to dial back, which the agent does on its own redial backoff (up
	// to 2 s), so adopting them one after the other kept a restarted daemon
	// from serving for about a second per sandbox (53 s for 50), and an agent
	// late by the time its turn came was taken for dead.
	// The runtime's state commands are processes: a few at a time.
	adopted := make([]bool, len(recs))
	var wg sync.WaitGroup
	states := make(chan struct{}, 8)
	for i, f := range recs {
		if f.row.State != StateRunning || f.row.Runtime != m.cfg.Runtime.Name() || !live[f.row.ID] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			states <- struct{}{}
			st, err := m.cfg.Runtime.State(ctx, f.row.ID)
			<-states
			if err != nil || st != runtime.StatusRunning {
				return
			}
			if err := m.adopt(f.sb, f.rec.NetSlot); err != nil {
				m.log.Warn("cannot adopt sandbox", "id", f.row.ID, "err", err)
				return
			}
			adopted[i] = true
		}()
	}
	wg.Wait()

	for i, f := range recs {
		row, rec, sb := f.row, f.rec, f.sb
		if adopted[i] {
			keep[row.ID] = true
			keepContainer[row.ID] = true
			rep.Adopted = append(rep.Adopted, row.ID)
			continue
		}
		if row.State == StatePaused && row.Runtime == m.cfg.Runtime.Name() {
			err := m.adoptPaused(ctx, sb, live[row.ID], rec.NetSlot)
			if err == nil {
				keep[row.ID] = true
				keepContainer[row.ID] = sb.pauseMode == PauseFrozen
				rep.AdoptedPaused = append(rep.AdoptedPaused, row.ID)
				continue
			}
			m.log.Warn("cannot keep paused sandbox", "id", row.ID, "err", err)
			sb.err = "paused sandbox lost while the daemon was down: " + err.Error()
		}
		if row.State == StateRunning || row.State == StatePaused {
			if sb.err == "" {
				sb.err = "sandbox stopped while the daemon was down (its container was gone at restart)"
			}
			sb.state = StateDead
			if row.Runtime != m.cfg.Runtime.Name() {
				sb.err = fmt.Sprintf("sandbox belongs to runtime %s, but the daemon restarted with %s", row.Runtime, m.cfg.Runtime.Name())
			}
			rep.MarkedDead = append(rep.MarkedDead, row.ID)
			if err := m.persist(ctx, sb); err != nil {
				return rep, err
			}
		}
		// Dead records stay readable; their host resources go.
		m.mu.Lock()
		m.sandboxes[sb.ID] = sb
		m.mu.Unlock()
	}

	for _, id := range containers {
		if keepContainer[id] {
			continue
		}
		if err := m.cfg.Runtime.Destroy(ctx, id); err != nil {
			m.log.Error("remove orphan container", "id", id, "err", err)
			continue
		}
		rep.RemovedContainers = append(rep.RemovedContainers, id)
	}

	prefix := sandboxesDir(m.cfg.DataDir) + "/"
	mounts, err := rootfs.FindMounts(prefix)
	if err != nil {
		return rep, fmt.Errorf("find leftover mounts: %w", err)
	}
	for _, mp := range mounts {
		id := strings.SplitN(strings.TrimPrefix(mp, prefix), "/", 2)[0]
		if keep[id] {
			continue
		}
		rep.RemovedMounts = append(rep.RemovedMounts, mp)
	}
	entries, err := os.ReadDir(sandboxesDir(m.cfg.DataDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return rep, err
	}
	for _, e := range entries {
		if keep[e.Name()] {
			continue
		}
		dir := filepath.Join(sandboxesDir(m.cfg.DataDir), e.Name())
		if err := rootfs.UnmountAll(dir); err != nil {
			m.log.Error("unmount leftover", "dir", dir, "err", err)
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			m.log.Error("remove leftover dir", "dir", dir, "err", err)
			continue
		}
		m.releaseTemplate(dir)
		rep.RemovedDirs = append(rep.RemovedDirs, dir)
	}
	// Unmounting a layer frees its loop device (AUTOCLEAR); one still
	// attached to an image of this data dir that no kept sandbox explains
	// is held by a mount outside this daemon's view: mark it to detach.
	// Only images under this data dir are looked at, never another
	// daemon's.
	for _, l := range diskimage.Loops(sandboxesDir(m.cfg.DataDir)) {
		id := strings.SplitN(strings.TrimPrefix(l.BackingFile, prefix), "/", 2)[0]
		if keep[id] {
			continue
		}
		if err := diskimage.Detach(l.Device); err != nil {
			m.log.Warn("detach leftover loop device", "device", l.Device, "image", l.BackingFile, "err", err)
			continue
		}
		rep.RemovedLoops = append(rep.RemovedLoops, l.Device)
	}
	// Containers this daemon owns were destroyed above through its
	// runtime's own state; what is left are host resources no container
	// uses any more (the runtime leaves those of other daemons' containers
	// alone: they are shared by every daemon on the host).
	removed, err := m.cfg.Runtime.RemoveOrphans(ctx, func(id string) bool { return keepContainer[id] })
	if err != nil {
		m.log.Error("remove orphan cgroups", "err", err)
	}
	rep.RemovedCgroups = append(rep.RemovedCgroups, removed...)
	m.removeOrphanArchives()      // lifecycle.go
	m.pruneTemplateSnapshots(ctx) // build.go: templates removed or rebuilt while the daemon was down
	m.pruneAgents(ctx)            // agents.go: what only the sandboxes and snapshots gone meanwhile ran
	if n := m.cfg.Network; n != nil {
		// Slots kept for sandboxes that turned out dead go now.
		if k, err := n.Slots.ReapUnadopted(); err != nil {
			m.log.Error("remove unadopted network slots", "err", err)
		} else if k > 0 {
			m.log.Info("removed network slots of sandboxes gone while the daemon was down", "files", k)
		}
	}
	m.log.Info("reconciled host with records", "report", rep.String())
	return rep, nil
}

// adopt re-attaches a sandbox whose container survived a daemon restart: its
// root filesystem is still mounted, its agent dials the socket again, and
// its network slot gets the proxy back.
func (m *Manager) adopt(sb *Sandbox, netSlot string) error {
	layer, err := rootfs.Open(sb.Dir)
	if err != nil {
		return fmt.Errorf("re-attach rootfs: %w", err)
	}
	ln, err := m.listen(sb) // agentchannel.go
	if err != nil {
		return err
	}
	sb.layer = layer
	sb.listener = ln
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	conn, err := m.takeAgent(ctx, sb, ln, true)
	cancel()
	if err != nil {
		ln.Close()
		return fmt.Errorf("agent did not dial back: %w", err)
	}
	sb.setConn(conn)
	m.adoptNetwork(sb, netSlot) // network.go
	m.mu.Lock()
	m.sandboxes[sb.ID] = sb
	m.mu.Unlock()
	go m.supervise(sb, sb.gen)
	return nil
}

// adoptPaused keeps a paused sandbox paused across a daemon restart when
// what resume needs is still on the host: its writable layer (its image on
// disk, mounted again if a host reboot unmounted it), and the checkpoint
// image or the frozen container. Its channel is listened on again at
// resume.
func (m *Manager) adoptPaused(ctx context.Context, sb *Sandbox, containerLive bool, netSlot string) error {
	if sb.lc.archived {
		return m.adoptArchived(sb) // lifecycle.go
	}
	if sb.pauseMode == PauseFrozen && !containerLive {
		return errors.New("its frozen container is gone")
	}
	layer, err := rootfs.Remount(sb.Dir)
	if err != nil {
		return fmt.Errorf("its filesystem is gone: %w", err)
	}
	switch sb.pauseMode {
	case PauseCheckpoint:
		if _, err := os.Stat(filepath.Join(checkpointDir(sb), "checkpoint.img")); err != nil {
			return fmt.Errorf("its memory checkpoint is gone: %w", err)
		}
	case PauseFrozen:
		if st, err := m.cfg.Runtime.State(ctx, sb.ID); err != nil || st != runtime.StatusPaused {
			return fmt.Errorf("its container is no longer frozen (%s, %v)", st, err)
		}
	case PauseStopped:
	default:
		return fmt.Errorf("unknown pause mode %q", sb.pauseMode)
	}
	if sb.pauseMode == PauseFrozen {
		m.adoptNetwork(sb, netSlot) // the frozen container keeps its slot
	}
	sb.layer = layer
	m.mu.Lock()
	m.sandboxes[sb.ID] = sb
	m.mu.Unlock()
	return nil
}
