package sandbox

import (
	"context"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/quota"
)

// On a cluster a key's concurrency limits hold across every node: each
// node writes what a key holds on it to the cluster (ClusterQuota), and a
// claim is refused when it and what the other live nodes hold pass the
// limit. The node is where this belongs, not the gateway: only the node
// sees a sandbox's slot taken and given back — creates sent to it
// directly, forks, resumes (an autoResume sandbox resumes on its traffic),
// and the ends no request asks for (a timeout, an OOM, a crash).
//
// What a node writes is always what it holds, computed under m.mu with
// the claims of the key serialized on this node (lockKey), never an
// increment: a write that is lost, doubled or late is corrected by the
// next one. A node writes before it starts a create of a key with a quota,
// and again within a second of what it holds changing (a kill, a pause, a
// failed create: syncKeyUsage). A node's entry stops counting when its
// Lease lapses, so a node killed with claims in flight, or whose sandboxes
// died with it, gives them back.

// ClusterQuota is the cluster's record of what each key holds on each node
// (cluster.KeyUsages).
type ClusterQuota interface {
	// Hold writes held as what key holds on this node. With check, first:
	// check is given what the key holds on the other live nodes, and its
	// error is returned with nothing written.
	Hold(ctx context.Context, keyID string, held quota.Usage, check func(others quota.Usage) error) error
	// Held is what this node's entries say it holds, by key.
	Held(ctx context.Context) (map[string]quota.Usage, error)
	// Others is what key holds on the other live nodes.
	Others(ctx context.Context, keyID string) (quota.Usage, error)
}

// keyUsageSync is how often a node writes what changed of what keys hold
// on it; keyUsageFull how often it also rereads its own entries (a
// restart's leftovers, a write lost).
const (
	keyUsageSync = time.Second
	keyUsageFull = 30 * time.Second
)

// clusterUsage is the manager's side of ClusterQuota.
type clusterUsage struct {
	mu sync.Mutex
	// keyMu serializes the writes of one key's usage on this node.
	keyMu map[string]*sync.Mutex
	// written is what this node last wrote for each key.
	written map[string]quota.Usage
	// unlimited are keys found without a concurrency limit since the last
	// full pass (not asked again each second: the keys are one Secret
	// read per ask).
	unlimited map[string]bool
}

// lockKey takes key's write lock; the returned func gives it back.
func (m *Manager) lockKey(key string) func() {
	cu := &m.clusterUsage
	cu.mu.Lock()
	if cu.keyMu == nil {
		cu.keyMu = map[string]*sync.Mutex{}
	}
	km := cu.keyMu[key]
	if km == nil {
		km = &sync.Mutex{}
		cu.keyMu[key] = km
	}
	cu.mu.Unlock()
	km.Lock()
	return km.Unlock
}

func (m *Manager) setWritten(key string, u quota.Usage) {
	cu := &m.clusterUsage
	cu.mu.Lock()
	defer cu.mu.Unlock()
	if cu.written == nil {
		cu.written = map[string]quota.Usage{}
	}
	cu.written[key] = u
}

func (m *Manager) lastWritten(key string) (quota.Usage, bool) {
	cu := &m.clusterUsage
	cu.mu.Lock()
	defer cu.mu.Unlock()
	u, ok := cu.written[key]
	return u, ok
}

// holdInCluster writes local+asked (this node's usage of the key, the new
// claim included) if it and the other live nodes' fit q; called with the
// key's lock held.
func (m *Manager) holdInCluster(ctx context.Context, q KeyQuota, local, asked quota.Usage) error {
	var refused string
	held := local.Plus(asked)
	err := m.cfg.ClusterQuota.Hold(ctx, q.keyID, held, func(others quota.Usage) error {
		limit, err := overLimit(q, others.Plus(local), asked)
		refused = limit
		return err
	})
	if err == nil {
		m.setWritten(q.keyID, held)
		return nil
	}
	if refused != "" {
		m.cfg.Metrics.QuotaRejection(refused)
		return err
	}
	return errdefs.Unavailable("API key %q has a quota, and what it holds on the cluster's other nodes cannot be read: %v", q.Name, err)
}

// syncKeyUsage writes, every keyUsageSync, what each key with a quota
// holds on this node where that changed since the last write; until the
// manager shuts down.
func (m *Manager) syncKeyUsage() {
	defer close(m.keyUsageDone)
	tick := time.NewTicker(keyUsageSync)
	defer tick.Stop()
	var lastFull time.Time
	for {
		select {
		case <-m.reaperStop:
			return
		case <-tick.C:
		}
		full := time.Since(lastFull) >= keyUsageFull
		if full {
			lastFull = time.Now()
		}
		m.syncKeyUsageOnce(full)
	}
}

// syncKeyUsageOnce is one pass of syncKeyUsage; full also rereads this
// node's entries and corrects every one that is not what it holds.
func (m *Manager) syncKeyUsageOnce(full bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys := map[string]bool{}
	m.mu.Lock()
	for _, sb := range m.sandboxes {
		keys[sb.Options.APIKeyID] = true
	}
	for r := range m.reserved {
		keys[r.key] = true
	}
	m.mu.Unlock()
	m.clusterUsage.mu.Lock()
	for k := range m.clusterUsage.written {
		keys[k] = true
	}
	m.clusterUsage.mu.Unlock()
	if full {
		m.clusterUsage.mu.Lock()
		m.clusterUsage.unlimited = nil
		m.clusterUsage.mu.Unlock()
		held, err := m.cfg.ClusterQuota.Held(ctx)
		if err != nil {
			m.log.Warn("cluster: reading what keys hold on this node failed", "err", err)
		}
		for k, u := range held {
			keys[k] = true
			m.setWritten(k, u)
		}
	}
	delete(keys, "")
	for key := range keys {
		m.syncKey(ctx, key)
	}
}

// syncKey writes what key holds here if that is not what was last written.
func (m *Manager) syncKey(ctx context.Context, key string) {
	last, known := m.lastWritten(key)
	if !known {
		// Never written: only a key with a quota needs an entry (a key
		// given one later is written at the next full pass; its creates
		// write it at once).
		cu := &m.clusterUsage
		cu.mu.Lock()
		skip := cu.unlimited[key]
		cu.mu.Unlock()
		if skip {
			return
		}
		q, err := m.cfg.KeyLimits(ctx, key)
		if err != nil {
			return
		}
		if !q.Concurrent() {
			cu.mu.Lock()
			if cu.unlimited == nil {
				cu.unlimited = map[string]bool{}
			}
			cu.unlimited[key] = true
			cu.mu.Unlock()
			return
		}
	}
	unlock := m.lockKey(key)
	defer unlock()
	m.mu.Lock()
	u := m.usageLocked(key)
	m.mu.Unlock()
	if known && u == last {
		return
	}
	if err := m.cfg.ClusterQuota.Hold(ctx, key, u, nil); err != nil {
		m.log.Warn("cluster: writing what a key holds on this node failed", "key", key, "err", err)
		return
	}
	m.setWritten(key, u)
}
