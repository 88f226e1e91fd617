package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/agentclient"
	"github.com/cella-sandbox/cella/internal/channel"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// A snapshot is a sandbox frozen in time, under <data>/snapshots/<id>/:
//
//	layer/   a copy of the sandbox's writable layer (its overlay upper dir),
//	         used as a read-only overlay lower by every sandbox made from it
//	memory/  (gVisor) the memory image of `runsc checkpoint --leave-running`
//
// plus a store record with the sandbox's options and tokens. A snapshot of
// a sandbox that was itself made from a snapshot stacks on its parent's
// layers instead of copying them, so its layer list is [own, parent's...].
// Layers are removed once no snapshot record and no sandbox uses them.

// SnapshotInfo describes one snapshot.
type SnapshotInfo struct {
	ID         string
	Names      []string
	SandboxID  string
	TemplateID string
	CreatedAt  time.Time
	// Memory: the snapshot holds a memory image, and sandboxes made from it
	// go on with the original's processes. Without it (runtimes with no
	// memory checkpoint) they boot fresh on the snapshot's files.
	Memory    bool
	SizeBytes int64 // on disk: the frozen layer plus the memory image
	Took      time.Duration
}

type snapshotRecord struct {
	Options      Options `json:"options"`
	Runtime      string  `json:"runtime"`
	Memory       bool    `json:"memory"`
	ChannelToken string  `json:"channel_token"` // before channel_tokens
	// ChannelTokens are the original agent's credentials around the
	// checkpoint: the restored agent's hello carries one of them.
	ChannelTokens   []string `json:"channel_tokens,omitempty"`
	EnvdAccessToken string   `json:"envd_access_token"`
	Layers          []string `json:"layers"` // snapshot IDs, top first
	SizeBytes       int64    `json:"size_bytes"`
	TookMS          int64    `json:"took_ms"`
	// Template is the template whose start command the snapshot holds
	// running (build.go); it goes once the template no longer names it.
	Template string `json:"template,omitempty"`
	// Agent is the SHA-256 of the agent binary a memory image was saved
	// with, which its restores run (agents.go).
	Agent string `json:"agent,omitempty"`
}

// tokens are the credentials a restored agent's hello may carry.
func (r snapshotRecord) tokens() []string {
	if len(r.ChannelTokens) > 0 {
		return r.ChannelTokens
	}
	return []string{r.ChannelToken}
}

// origin is what a sandbox made from a snapshot keeps in its directory: the
// snapshot layers it is stacked on (they must outlive it).
type origin struct {
	SnapshotID     string   `json:"snapshot_id"`
	Layers         []string `json:"layers"`
	MemoryRestored bool     `json:"memory_restored"`
}

const originFile = "origin.json"

// snapMu serializes snapshot garbage collection with the creation of
// sandboxes and snapshots that start to use a layer.
var snapMu sync.Mutex

func snapshotsDir(dataDir string) string { return filepath.Join(dataDir, "snapshots") }
func (m *Manager) snapshotDir(id string) string {
	return filepath.Join(snapshotsDir(m.cfg.DataDir), id)
}
func (m *Manager) layerDir(id string) string  { return filepath.Join(m.snapshotDir(id), "layer") }
func (m *Manager) memoryDir(id string) string { return filepath.Join(m.snapshotDir(id), "memory") }

func readOrigin(sandboxDir string) (origin, bool) {
	var o origin
	b, err := os.ReadFile(filepath.Join(sandboxDir, originFile))
	if err != nil || json.Unmarshal(b, &o) != nil {
		return o, false
	}
	return o, true
}

// Snapshot freezes a running sandbox into a new snapshot; the sandbox keeps
// running. Under gVisor the memory is checkpointed first (the sandbox stops
// for the checkpoint only), then the container is frozen for as long as its
// writable layer takes to copy. name may be empty. The snapshot belongs to
// p (who must be able to act on the sandbox).
func (m *Manager) Snapshot(ctx context.Context, p tenant.Principal, id, name string) (SnapshotInfo, error) {
	t0 := time.Now()
	info, err := m.snapshot(ctx, p, id, name, false, "")
	if err == nil {
		m.cfg.Metrics.Snapshot(info.TemplateID, time.Since(t0))
	}
	return info, err
}

// snapshot takes a snapshot of sandbox id for p; tmpl names the template
// whose start command it captures (build.go), "" for others.
func (m *Manager) snapshot(ctx context.Context, p tenant.Principal, id, name string, hidden bool, tmpl string) (SnapshotInfo, error) {
	if name != "" && !templateNameRe.MatchString(name) {
		return SnapshotInfo{}, errdefs.InvalidArgument("invalid snapshot name %q: use letters, digits, '.', '_' and '-'", name)
	}
	sb, err := m.Lookup(p, id)
	if err != nil {
		return SnapshotInfo{}, err
	}
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	if !m.isTracked(sb) {
		return SnapshotInfo{}, errdefs.NotFound("sandbox %q not found", id)
	}
	switch st := sb.State(); st {
	case StateRunning:
	case StatePaused:
		return SnapshotInfo{}, errdefs.Conflict("sandbox %q is paused: resume it to snapshot it", id)
	default:
		return SnapshotInfo{}, errdefs.Conflict("sandbox %q is %s: %s", id, st, sb.Err())
	}
	if sb.layer == nil {
		return SnapshotInfo{}, fmt.Errorf("sandbox %q has no root filesystem", id)
	}
	parent, _ := readOrigin(sb.Dir)

	start := time.Now()
	snID := store.NewID()
	// Until its record is written, nothing but this mark keeps a snapshot
	// collection (run by any sandbox's kill) from taking the directory.
	m.makingSnapshot(snID, true)
	defer m.makingSnapshot(snID, false)
	dir := m.snapshotDir(snID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
			m.releaseTemplate(dir)
		}
	}()
	// The snapshot's layers stack on the sandbox's image: keep it.
	tpl, err := m.templateOf(ctx, sb.Dir, sb.TemplateID)
	if err == nil {
		_, err = m.cfg.Templates.Acquire(dir, tpl)
	}
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	rt := m.cfg.Runtime
	snap, memory := rt.(runtime.Snapshotter)
	memory = memory && rt.Capabilities().MemoryCheckpoint
	var tokens []string
	if memory {
		if err := os.Mkdir(m.memoryDir(snID), 0o700); err != nil {
			return SnapshotInfo{}, err
		}
		sb.mu.Lock()
		oldConn := sb.conn
		sb.mu.Unlock()
		// The image holds the agent's credential of the moment, one of
		// those accepted around it (a rotation may be under way).
		tokens = sb.acceptedTokens()
		if err := snap.CheckpointRunning(ctx, sb.ID, m.memoryDir(snID)); err != nil {
			return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, err)
		}
		for _, t := range sb.acceptedTokens() {
			if !slices.Contains(tokens, t) {
				tokens = append(tokens, t)
			}
		}
		// The checkpoint breaks the agent's host socket as a restore does;
		// its supervisor takes the redial. Return once it answers again.
		if err := m.waitAgent(ctx, sb, oldConn); err != nil {
			return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, err)
		}
	}
	// The files: frozen so that the copy is one moment's state.
	if err := rt.Freeze(ctx, sb.ID); err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: freeze: %w", id, err)
	}
	cerr := sb.layer.Freeze(m.layerDir(snID))
	if err := rt.Thaw(context.WithoutCancel(ctx), sb.ID); err != nil {
		return SnapshotInfo{}, errors.Join(fmt.Errorf("snapshot %s: thaw: %w", id, err), cerr)
	}
	if cerr != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", id, cerr)
	}
	took := time.Since(start)
	rec := snapshotRecord{
		Options: sb.Options, Runtime: sb.Runtime, Memory: memory,
		ChannelTokens: tokens, EnvdAccessToken: sb.EnvdAccessToken,
		Layers: append([]string{snID}, parent.Layers...), SizeBytes: diskUsage(dir), TookMS: took.Milliseconds(),
		Template: tmpl,
	}
	if memory {
		sb.mu.Lock()
		rec.Agent = sb.agent
		sb.mu.Unlock()
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return SnapshotInfo{}, err
	}
	row := store.Snapshot{ID: snID, SandboxID: sb.ID, TemplateID: sb.TemplateID, Name: name, Hidden: hidden,
		CreatedAt: time.Now().UTC(), APIKeyID: p.Key, TeamID: p.Team, Record: b}
	if err := m.cfg.Store.PutSnapshot(context.WithoutCancel(ctx), row); err != nil {
		return SnapshotInfo{}, err
	}
	ok = true
	m.log.Info("sandbox snapshotted", "id", id, "snapshot", snID, "memory", memory, "bytes", rec.SizeBytes, "took", took.Round(time.Millisecond))
	return snapshotInfo(row, rec), nil
}

func snapshotInfo(row store.Snapshot, rec snapshotRecord) SnapshotInfo {
	in := SnapshotInfo{ID: row.ID, SandboxID: row.SandboxID, TemplateID: row.TemplateID, CreatedAt: row.CreatedAt,
		Memory: rec.Memory, SizeBytes: rec.SizeBytes, Took: time.Duration(rec.TookMS) * time.Millisecond, Names: []string{}}
	if row.Name != "" {
		in.Names = []string{row.Name}
	}
	return in
}

// SnapshotFilter selects snapshots for ListSnapshots.
type SnapshotFilter = store.SnapshotFilter

// ListSnapshots returns the snapshots p may see that match f, newest
// first.
func (m *Manager) ListSnapshots(ctx context.Context, p tenant.Principal, f SnapshotFilter) ([]SnapshotInfo, error) {
	f.TeamID = ""
	if !p.Admin {
		f.TeamID = p.Team
	}
	rows, err := m.cfg.Store.ListSnapshots(ctx, f)
	if err != nil {
		return nil, err
	}
	out := make([]SnapshotInfo, 0, len(rows))
	for _, row := range rows {
		var rec snapshotRecord
		_ = json.Unmarshal(row.Record, &rec)
		out = append(out, snapshotInfo(row, rec))
	}
	return out, nil
}

// lookupSnapshot finds a visible snapshot that p may use, by ID or by the
// name it has in p's team. Another team's snapshot is not found.
func (m *Manager) lookupSnapshot(ctx context.Context, p tenant.Principal, idOrName string) (store.Snapshot, snapshotRecord, bool) {
	var rec snapshotRecord
	row, err := m.cfg.Store.GetSnapshot(ctx, p.Team, idOrName)
	if err != nil || row.Hidden || !p.Can(tenant.Owner{Team: row.TeamID, Key: row.APIKeyID}) {
		return row, rec, false
	}
	if json.Unmarshal(row.Record, &rec) != nil {
		return row, rec, false
	}
	return row, rec, true
}

// IsSnapshot reports whether idOrName names a snapshot p may use.
func (m *Manager) IsSnapshot(ctx context.Context, p tenant.Principal, idOrName string) bool {
	_, _, ok := m.lookupSnapshot(ctx, p, idOrName)
	return ok
}

// DeleteSnapshot removes a snapshot. Sandboxes made from it keep running:
// its layer goes when the last of them does.
func (m *Manager) DeleteSnapshot(ctx context.Context, p tenant.Principal, idOrName string) error {
	row, _, ok := m.lookupSnapshot(ctx, p, idOrName)
	if !ok {
		return errdefs.NotFound("snapshot %q not found", idOrName)
	}
	if err := m.cfg.Store.DeleteSnapshot(ctx, row.ID); err != nil {
		return err
	}
	m.log.Info("snapshot deleted", "snapshot", row.ID)
	m.gcSnapshots(ctx)
	m.pruneAgents(ctx) // agents.go
	return nil
}

// makingSnapshot marks snapshot id as being made (its directory is in use
// before its record exists), or no longer.
func (m *Manager) makingSnapshot(id string, making bool) {
	snapMu.Lock()
	defer snapMu.Unlock()
	if !making {
		delete(m.snapshotting, id)
		return
	}
	if m.snapshotting == nil {
		m.snapshotting = map[string]bool{}
	}
	m.snapshotting[id] = true
}

// gcSnapshots removes the snapshot directories no record and no sandbox
// uses any more: deleted snapshots, and the hidden ones fork makes once its
// last fork is gone. Snapshots being made are left alone.
func (m *Manager) gcSnapshots(ctx context.Context) {
	snapMu.Lock()
	defer snapMu.Unlock()
	entries, err := os.ReadDir(snapshotsDir(m.cfg.DataDir))
	if err != nil {
		return
	}
	used := maps.Clone(m.snapshotting)
	if used == nil {
		used = map[string]bool{}
	}
	rows, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{IncludeHidden: true})
	if err != nil {
		m.log.Warn("snapshot gc: list", "err", err)
		return
	}
	for _, row := range rows {
		var rec snapshotRecord
		_ = json.Unmarshal(row.Record, &rec)
		used[row.ID] = true
		for _, l := range rec.Layers {
			used[l] = true
		}
	}
	sbs, _ := os.ReadDir(sandboxesDir(m.cfg.DataDir))
	for _, e := range sbs {
		if o, ok := readOrigin(filepath.Join(sandboxesDir(m.cfg.DataDir), e.Name())); ok {
			for _, l := range o.Layers {
				used[l] = true
			}
		}
	}
	for _, e := range entries {
		if used[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(snapshotsDir(m.cfg.DataDir), e.Name())); err != nil {
			m.log.Warn("snapshot gc: remove", "snapshot", e.Name(), "err", err)
		} else {
			m.releaseTemplate(filepath.Join(snapshotsDir(m.cfg.DataDir), e.Name()))
			m.log.Info("snapshot layer removed", "snapshot", e.Name())
		}
	}
}

// diskUsage is the bytes of disk blocks the files below dir use.
func diskUsage(dir string) int64 {
	var n int64
	seen := map[uint64]bool{}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := statT(info); ok {
			if st.Nlink > 1 {
				if seen[st.Ino] {
					return nil
				}
				seen[st.Ino] = true
			}
			n += st.Blocks * 512
		}
		return nil
	})
	return n
}

// layersOf lists the lower dirs of a sandbox made from rec: its snapshot
// layers top first, then the template's layers.
func (m *Manager) layersOf(rec snapshotRecord, templateLayers []string) ([]string, error) {
	var out []string
	for _, id := range rec.Layers {
		d := m.layerDir(id)
		if _, err := os.Stat(d); err != nil {
			return nil, fmt.Errorf("snapshot layer %s is gone: %w", id, err)
		}
		out = append(out, d)
	}
	return append(out, templateLayers...), nil
}

// waitAgent waits until a running sandbox's agent answers over its channel
// after a checkpoint: on a new connection, or on old if that one survived.
// It waits on signals, not a clock: the sandbox's connection changing
// (WaitConn) and old's end. A checkpoint that broke old leaves the health
// call on it hanging until old's end, which the agent brings about at once
// (the runtime's redial signal: it finds its session dead and redials).
func (m *Manager) waitAgent(parent context.Context, sb *Sandbox, old *channel.Conn) error {
	ctx, cancel := context.WithTimeout(parent, m.cfg.AgentTimeout)
	defer cancel()
	for {
		c, err := sb.WaitConn(ctx)
		switch {
		case err != nil && parent.Err() != nil:
			return parent.Err()
		case err != nil && ctx.Err() != nil:
			return fmt.Errorf("the agent did not answer within %v after the checkpoint", m.cfg.AgentTimeout)
		case err != nil:
			return err
		case c != old:
			return nil
		}
		if agentclient.New(sb.ID, agentclient.On(c), sb.EnvdAccessToken).Health(ctx) == nil {
			return nil
		}
		// Broken by the checkpoint: WaitConn returns the redialed one.
		select {
		case <-c.Closed():
		case <-ctx.Done():
		}
	}
}
