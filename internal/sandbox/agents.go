package sandbox

// The agent binary each sandbox runs.
//
// A sandbox runs the agent binary it was last booted with until its next
// cold boot: its record names it by its SHA-256 (record.Agent), and so does
// a snapshot with memory (snapshotRecord.Agent), because a memory image
// restores only with the agent file its pages came from (gVisor pages the
// restored agent's code in from the bound file again: a different binary
// there and the agent never answers). A cold boot (create, a pool fill, a
// resume of a sandbox paused without memory, a fork without memory) takes
// the daemon's current agent. Binaries nothing names any more go (prune).

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"

	"github.com/cella-sandbox/cella/internal/store"
)

// AgentBinaries are the agent binaries on the host, by SHA-256
// (agentpin.Store).
type AgentBinaries interface {
	// Path is the host file a sandbox running the agent of hash binds.
	Path(hash string) (string, error)
	// Prune removes every binary whose hash keep does not hold.
	Prune(keep map[string]bool) ([]string, error)
	// Hashes lists the binaries stored.
	Hashes() ([]string, error)
	// Add stores a binary (one carried from another node with a sandbox's
	// memory: remote.go) and returns its hash.
	Add(bin []byte) (string, error)
}

// agentOf is the agent a record names. Records and snapshots from before
// agents were recorded bound the daemon's single pinned binary: the current
// one is all that is known of it.
func (m *Manager) agentOf(recorded string) string { return cmp.Or(recorded, m.cfg.Agent) }

// bootAgent makes sb run the current agent from its next boot on and
// returns the file to bind.
func (m *Manager) bootAgent(sb *Sandbox) (string, error) {
	path, err := m.cfg.Agents.Path(m.cfg.Agent)
	if err != nil {
		return "", err
	}
	sb.mu.Lock()
	sb.agent = m.cfg.Agent
	sb.mu.Unlock()
	return path, nil
}

// holdAgent keeps the agent binary of hash from being pruned until
// release, for an operation that restores a sandbox that is in no table
// yet (a fork of a snapshot that may be deleted meanwhile), and returns the
// file to bind.
func (m *Manager) holdAgent(hash string) (path string, release func(), err error) {
	m.agentsMu.Lock()
	defer m.agentsMu.Unlock()
	if path, err = m.cfg.Agents.Path(hash); err != nil {
		return "", nil, err
	}
	if m.agentHolds == nil {
		m.agentHolds = map[string]int{}
	}
	m.agentHolds[hash]++
	return path, func() {
		m.agentsMu.Lock()
		defer m.agentsMu.Unlock()
		if m.agentHolds[hash]--; m.agentHolds[hash] == 0 {
			delete(m.agentHolds, hash)
		}
	}, nil
}

// pruneAgents removes the agent binaries that neither the current agent,
// nor a sandbox that is not dead, nor a snapshot with memory, nor an
// operation in flight uses (after a kill, a snapshot's removal, and at
// start).
func (m *Manager) pruneAgents(ctx context.Context) {
	m.agentsMu.Lock()
	defer m.agentsMu.Unlock()
	if stored, err := m.cfg.Agents.Hashes(); err == nil && !slices.ContainsFunc(stored, func(h string) bool { return h != m.cfg.Agent }) {
		return // only the current one: the common case, without a query
	}
	keep := map[string]bool{m.cfg.Agent: true}
	for h := range m.agentHolds {
		keep[h] = true
	}
	m.mu.Lock()
	for _, sb := range m.sandboxes {
		sb.mu.Lock()
		if sb.state != StateDead {
			keep[sb.agent] = true
		}
		sb.mu.Unlock()
	}
	m.mu.Unlock()
	rows, err := m.cfg.Store.ListSnapshots(ctx, store.SnapshotFilter{IncludeHidden: true})
	if err != nil {
		m.log.Warn("agent binaries: list snapshots", "err", err)
		return
	}
	for _, row := range rows {
		var rec snapshotRecord
		if json.Unmarshal(row.Record, &rec) == nil && rec.Memory {
			keep[m.agentOf(rec.Agent)] = true
		}
	}
	removed, err := m.cfg.Agents.Prune(keep)
	if err != nil {
		m.log.Warn("agent binaries: prune", "err", err)
	}
	for _, h := range removed {
		m.log.Info("agent binary removed: no sandbox or snapshot runs it", "sha256", h)
	}
}
