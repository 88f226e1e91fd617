package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/quota"
)

// KeyQuota is an API key's name and quota (Config.KeyLimits).
type KeyQuota struct {
	Name string
	quota.Limits
	keyID string // set by reserve
}

// What a key holds is derived from the sandboxes that exist — its running
// ones in the manager's table (adopted again after a restart) — plus the
// reservations of creates and resumes in flight, all under m.mu: a create
// reserves its slot before anything starts, so concurrent creates of one
// key can never pass its limit together. A paused sandbox holds no slot
// (E2B counts running sandboxes only); its resume takes one again.

// reservation is what one create, fork or resume claims for a key until
// its sandboxes run or it fails. Each slot is one sandbox. A new sandbox
// takes its slot in the same critical section that adds it to the table
// (addLocked); a resume's slot is bound to the sandbox's ID, which then
// counts once, by the slot, until release.
type reservation struct {
	m     *Manager
	key   string
	slots []slot // guarded by m.mu
}

type slot struct {
	cpus  float64
	memMB int64
	id    string // "" until bound
}

// reserve claims n sandboxes of opts' size for the key that owns them
// (opts.APIKeyID), or refuses with a 429 naming the limit. Keys without a
// quota (the admin, the daemon itself, deleted keys) get an empty
// reservation. The caller releases it when done, whatever happened. On a
// cluster (Config.ClusterQuota) the claim is also written to the cluster's
// record of the key's usage, checked against every other live node's,
// before anything starts (clusterquota.go).
func (m *Manager) reserve(ctx context.Context, opts Options, n int) (*reservation, error) {
	res := &reservation{m: m, key: opts.APIKeyID}
	if m.cfg.KeyLimits == nil || opts.APIKeyID == "" {
		return res, nil
	}
	q, err := m.cfg.KeyLimits(ctx, opts.APIKeyID)
	if err != nil {
		return nil, fmt.Errorf("quota of API key %s: %w", opts.APIKeyID, err)
	}
	if !q.Concurrent() {
		return res, nil
	}
	q.keyID = opts.APIKeyID
	if m.cfg.ClusterQuota != nil {
		// One claim of a key at a time on this node: the usage it writes
		// is then exactly this node's, this claim included.
		unlock := m.lockKey(opts.APIKeyID)
		defer unlock()
	}
	asked := quota.Usage{Sandboxes: n, CPUs: opts.CPUs * float64(n), MemoryMB: opts.MemoryMB * int64(n)}
	m.mu.Lock()
	u := m.usageLocked(opts.APIKeyID)
	if limit, err := overLimit(q, u, asked); err != nil {
		m.mu.Unlock()
		m.cfg.Metrics.QuotaRejection(limit)
		return nil, err
	}
	for range n {
		res.slots = append(res.slots, slot{cpus: opts.CPUs, memMB: opts.MemoryMB})
	}
	if m.reserved == nil {
		m.reserved = map[*reservation]struct{}{}
	}
	m.reserved[res] = struct{}{}
	m.mu.Unlock()
	if m.cfg.ClusterQuota == nil {
		return res, nil
	}
	if err := m.holdInCluster(ctx, q, u, asked); err != nil {
		res.release()
		return nil, err
	}
	return res, nil
}

// overLimit is the 429 of the first of q's limits that u and asked
// together pass (and that limit's name, for the metric), or nil.
func overLimit(q KeyQuota, u, asked quota.Usage) (string, error) {
	l := q.Limits
	hint := "cella key update " + q.Name
	switch {
	case l.MaxSandboxes > 0 && u.Sandboxes+asked.Sandboxes > l.MaxSandboxes:
		return "maxSandboxes", errdefs.ResourceExhausted("API key %q is at its limit of %d running sandboxes (maxSandboxes; %d running or starting, %d more asked): kill or pause one, or raise the limit with `%s --max-sandboxes N`",
			q.Name, l.MaxSandboxes, u.Sandboxes, asked.Sandboxes, hint)
	case l.MaxVCPUs > 0 && u.CPUs+asked.CPUs > float64(l.MaxVCPUs):
		return "maxVcpus", errdefs.ResourceExhausted("API key %q is at its limit of %d vCPUs (maxVcpus; %g in use by running sandboxes, %g more asked): kill or pause one, or raise the limit with `%s --max-vcpus N`",
			q.Name, l.MaxVCPUs, u.CPUs, asked.CPUs, hint)
	case l.MaxMemoryMB > 0 && u.MemoryMB+asked.MemoryMB > l.MaxMemoryMB:
		return "maxMemoryMB", errdefs.ResourceExhausted("API key %q is at its limit of %d MiB of memory (maxMemoryMB; %d MiB in use by running sandboxes, %d MiB more asked): kill or pause one, or raise the limit with `%s --max-memory SIZE`",
			q.Name, l.MaxMemoryMB, u.MemoryMB, asked.MemoryMB, hint)
	}
	return "", nil
}

// bind ties every slot to sandbox id (a resume: its one sandbox).
func (r *reservation) bind(id string) {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	for i := range r.slots {
		r.slots[i].id = id
	}
}

type reservationCtx struct{}

// withReservation carries res to the place where the create's sandbox
// enters the table (addLocked), through the create paths.
func withReservation(ctx context.Context, res *reservation) context.Context {
	return context.WithValue(ctx, reservationCtx{}, res)
}

// addLocked puts a new sandbox in the table and, in the same critical
// section, gives back the slot its create reserved: it counts by itself
// from now on, never twice and never not at all.
func (m *Manager) addLocked(ctx context.Context, sb *Sandbox) {
	m.sandboxes[sb.ID] = sb
	if r, _ := ctx.Value(reservationCtx{}).(*reservation); r != nil {
		for i := range r.slots {
			if r.slots[i].id == "" {
				r.slots = append(r.slots[:i], r.slots[i+1:]...)
				break
			}
		}
	}
}

// release gives back every slot: from now on the sandboxes that run count
// by themselves.
func (r *reservation) release() {
	r.m.mu.Lock()
	delete(r.m.reserved, r)
	r.m.mu.Unlock()
}

// usageLocked is what key holds: its reservations' slots and its running
// sandboxes that no slot stands for.
func (m *Manager) usageLocked(key string) quota.Usage {
	var u quota.Usage
	bound := map[string]bool{}
	for r := range m.reserved {
		if r.key != key {
			continue
		}
		for _, s := range r.slots {
			u.Sandboxes++
			u.CPUs += s.cpus
			u.MemoryMB += s.memMB
			if s.id != "" {
				bound[s.id] = true
			}
		}
	}
	for id, sb := range m.sandboxes {
		if sb.Options.APIKeyID != key || bound[id] || sb.State() != StateRunning {
			continue
		}
		u.Sandboxes++
		u.CPUs += sb.Options.CPUs
		u.MemoryMB += sb.Options.MemoryMB
	}
	return u
}

// Usage is what the key holds now (running sandboxes and creates in
// flight), for GET /keys/self: on a cluster, on every live node (this
// node's alone when the others' cannot be read).
func (m *Manager) Usage(key string) (sandboxes int, cpus float64, memMB int64) {
	m.mu.Lock()
	u := m.usageLocked(key)
	m.mu.Unlock()
	if m.cfg.ClusterQuota != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if others, err := m.cfg.ClusterQuota.Others(ctx, key); err == nil {
			u = u.Plus(others)
		}
	}
	return u.Sandboxes, u.CPUs, u.MemoryMB
}
