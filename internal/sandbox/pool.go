package sandbox

// Warm pools: per template, the manager keeps up to Size sandboxes made in
// advance — runtime started, agent answering, network slot attached with
// no egress — and a create the pool can serve takes one instead of booting
// a new sandbox; the pool then refills in the background.
//
// A pooled sandbox is in the manager's accounting (poolSet) but not in
// m.sandboxes: GET /sandboxes does not list it, the proxy cannot reach it,
// the reaper does not expire it. It has no record in the store until it is
// handed out, so after a crash Reconcile removes its container, mounts,
// cgroups and directory as it removes anything without a record; Shutdown
// destroys it (stopPools).
//
// At hand-out the request's options replace the pooled defaults: env vars
// (the agent's POST /init, and its config file for a later cold boot),
// metadata, timeout/endAt, lifecycle, autoPause/autoResume, API key,
// traffic token and the egress policy (set on the sandbox's live
// egress.Sandbox). Then the record is persisted under the pooled ID. What a
// pool cannot serve (other limits, volume mounts, a snapshot as template)
// is a cold create, as is any create while the pool is empty or whose
// hand-out fails.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cella-sandbox/cella/internal/agentclient"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// MaxPoolSize bounds one template's warm pool.
const MaxPoolSize = 64

const (
	// poolPrune is how often an idle filler looks for pooled sandboxes
	// whose agent went away.
	poolPrune = 5 * time.Second
	// poolQuiet is how long a refill waits after the last create ended:
	// the new sandbox's first commands usually follow at once, and a
	// runtime booting beside them on a small host slows them down.
	poolQuiet = 200 * time.Millisecond
	// poolDeferMax bounds how long a refill waits for creates in progress
	// to finish: under a steady stream of creates the pool still refills.
	poolDeferMax = 10 * time.Second
	// poolBackoffMax caps the wait between failed fills of one template.
	poolBackoffMax = time.Minute
)

// PoolStatus is one template's warm pool.
type PoolStatus struct {
	Template string
	// Size is the set size; Ready the sandboxes waiting (more than Size
	// while recent demand grew the pool: adapt.go); Filling the ones being
	// made (up to fillWorkers at a time across all pools).
	Size    int
	Ready   int
	Filling int
	// HandedOut counts creates served from the pool, Misses creates of the
	// template that went cold (options the pool cannot serve, an empty
	// pool, a failed hand-out), since the daemon started.
	HandedOut int64
	Misses    int64
	// LastError is the last fill or hand-out failure since the pool last
	// filled a sandbox ("" when fine).
	LastError string
}

// poolSet is the manager's warm pools; its zero value is ready to use.
type poolSet struct {
	setMu  sync.Mutex // serializes SetPool: the stored size is the size in force
	mu     sync.Mutex
	byTpl  map[string]*pool
	closed bool
	// budget is the memory pools may hold beyond their set sizes
	// (adapt.go; Config.PoolMemoryBudget).
	budget int64
	// destroying counts pooled sandboxes taken out of their pools (a trim,
	// a fill no pool wants) whose destruction has not ended: SetPool
	// answers only once they are gone.
	destroying inflight

	// The filler: workers started by StartPools or the first SetPool,
	// ended by stopPools.
	kickC  chan struct{}
	cancel context.CancelFunc
	done   chan struct{}

	// creates counts Manager.Create calls in progress, lastCreate is when
	// the last one ended (unix nanos): refills wait while any runs and
	// for poolQuiet after, so a pool does not slow API creates down.
	creates    atomic.Int64
	lastCreate atomic.Int64
}

type pool struct {
	template  string
	size      int
	base      Options // the options pooled sandboxes are made with
	ready     []*pooled
	filling   int
	fills     inflight // the fills in progress
	handedOut int64
	misses    int64
	lastErr   string
	failures  int
	retryAt   time.Time
	demand    demandMeter // the creates it could serve, recently (adapt.go)
	memEach   int64       // what its last pooled sandbox was charged, 0 = not measured
}

// pooled is a ready sandbox and the template it was made from.
type pooled struct {
	sb     *Sandbox
	tpl    *template.Template
	made   time.Time
	memory int64 // its memory charge once booted and warmed (0: unknown)
}

// inflight counts work in progress (guarded by its owner's mutex) and
// says when none is left.
type inflight struct {
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n is 0
}

func (f *inflight) begin() {
	if f.n == 0 {
		f.idle = make(chan struct{})
	}
	f.n++
}

func (f *inflight) end() {
	f.n--
	if f.n == 0 {
		close(f.idle)
		f.idle = nil
	}
}

// doneDestroying ends what destroying.begin started.
func (ps *poolSet) doneDestroying(n int) {
	ps.mu.Lock()
	for range n {
		ps.destroying.end()
	}
	ps.mu.Unlock()
}

// creating marks a create in progress; call the result when it ends.
func (ps *poolSet) creating() (end func()) {
	ps.creates.Add(1)
	return func() {
		ps.lastCreate.Store(time.Now().UnixNano())
		ps.creates.Add(-1)
	}
}

func (ps *poolSet) kick() {
	ps.mu.Lock()
	c := ps.kickC
	ps.mu.Unlock()
	if c == nil {
		return
	}
	select {
	case c <- struct{}{}:
	default:
	}
}

// poolBase is what a pool's sandboxes are made with: the defaults, held
// to the daemon's maxima like any create.
func poolBase(name string, max Maxima) (Options, error) {
	o := Options{TemplateID: name}
	err := o.Normalize(max)
	return o, err
}

// StartPools restores the pool sizes set through the API (SQLite) over the
// daemon's configured ones (--pool) and starts filling. Call it after
// Reconcile: pooled sandboxes have no record, and Reconcile removes what
// has none.
func (m *Manager) StartPools(ctx context.Context, configured map[string]int) error {
	sizes := map[string]int{}
	for name, n := range configured {
		sizes[name] = n
	}
	saved, err := m.cfg.Store.ListPoolSizes(ctx)
	if err != nil {
		return err
	}
	for _, p := range saved {
		sizes[p.Template] = p.Size // the API's setting wins, 0 included
	}
	ps := &m.pools
	ps.mu.Lock()
	if ps.closed {
		ps.mu.Unlock()
		return errdefs.Unavailable("daemon is shutting down")
	}
	if ps.byTpl == nil {
		ps.byTpl = map[string]*pool{}
	}
	for name, n := range sizes {
		if n <= 0 {
			continue
		}
		if n > MaxPoolSize {
			ps.mu.Unlock()
			return errdefs.InvalidArgument("pool %s: size %d is above the maximum of %d", name, n, MaxPoolSize)
		}
		base, err := poolBase(name, m.cfg.Maxima)
		if err != nil {
			ps.mu.Unlock()
			return fmt.Errorf("pool %s: %w", name, err)
		}
		if p := ps.byTpl[name]; p != nil {
			p.size = n // StartPools runs once, at start: nothing to trim
			continue
		}
		ps.byTpl[name] = &pool{template: name, size: n, base: base}
	}
	m.startFillerLocked()
	ps.mu.Unlock()
	ps.kick()
	for name, n := range sizes {
		if n <= 0 {
			continue
		}
		if _, err := m.cfg.Templates.Get(name); err != nil && !template.IsBuiltin(name) {
			m.log.Warn("warm pool of a template that is not here: it fills once the template is built", "template", name, "size", n, "err", err)
			continue
		}
		m.log.Info("warm pool", "template", name, "size", n)
	}
	return nil
}

// startFillerLocked starts the filler once; ps.mu is held.
func (m *Manager) startFillerLocked() {
	ps := &m.pools
	if ps.done != nil || ps.closed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	ps.kickC = make(chan struct{}, 1)
	ps.cancel = cancel
	ps.done = make(chan struct{})
	go m.fillPools(ctx, ps.done)
}

// SetPool sets a template's pool size (0 removes the pool) and records it,
// so that the next daemon on this data dir keeps it. Sandboxes beyond the
// new size are destroyed before it returns.
func (m *Manager) SetPool(ctx context.Context, name string, size int) (PoolStatus, error) {
	if size < 0 || size > MaxPoolSize {
		return PoolStatus{}, errdefs.InvalidArgument("pool size must be between 0 and %d (got %d)", MaxPoolSize, size)
	}
	base, err := poolBase(name, m.cfg.Maxima)
	if err != nil {
		return PoolStatus{}, err
	}
	if size > 0 {
		if _, err := m.cfg.Templates.Get(name); err != nil {
			if !errors.Is(err, template.ErrNotFound) {
				return PoolStatus{}, err
			}
			if !template.IsBuiltin(name) {
				return PoolStatus{}, errdefs.NotFound("template %q not found (build it with: cella template build %s ...)", name, name)
			}
		}
		if m.IsSnapshot(ctx, tenant.System, name) {
			return PoolStatus{}, errdefs.InvalidArgument("%q is a snapshot: warm pools hold template sandboxes only", name)
		}
	}
	ps := &m.pools
	ps.setMu.Lock()
	defer ps.setMu.Unlock()
	ps.mu.Lock()
	closed := ps.closed
	ps.mu.Unlock()
	if closed {
		return PoolStatus{}, errdefs.Unavailable("daemon is shutting down")
	}
	if err := m.cfg.Store.PutPoolSize(ctx, store.PoolSize{Template: name, Size: size, UpdatedAt: time.Now().UTC()}); err != nil {
		return PoolStatus{}, err
	}

	ps.mu.Lock()
	if ps.byTpl == nil {
		ps.byTpl = map[string]*pool{}
	}
	p := ps.byTpl[name]
	var extra []*pooled
	var waitFill chan struct{}
	switch {
	case size == 0 && p != nil:
		delete(ps.byTpl, name)
		extra, p.ready = p.ready, nil
		waitFill = p.fills.idle
		p.size = 0
	case size > 0 && p == nil:
		p = &pool{template: name, size: size, base: base}
		ps.byTpl[name] = p
	case size > 0:
		p.size = size
		if len(p.ready) > size {
			extra = slices.Clone(p.ready[size:])
			p.ready = p.ready[:size]
		}
		if len(p.ready)+p.filling > size {
			waitFill = p.fills.idle
		}
		p.failures, p.retryAt = 0, time.Time{} // a new setting retries now
	}
	if size > 0 {
		m.startFillerLocked()
	}
	ps.mu.Unlock()
	ps.kick()
	m.destroyPooled(ctx, extra)
	if waitFill != nil {
		// The fills in progress will not fit: they are discarded when
		// they end.
		select {
		case <-waitFill:
		case <-ctx.Done():
		}
	}
	// Whatever a trim or a discarded fill took out of a pool is gone too
	// before the answer.
	ps.mu.Lock()
	destroying := ps.destroying.idle
	ps.mu.Unlock()
	if destroying != nil {
		select {
		case <-destroying:
		case <-ctx.Done():
		}
	}
	m.log.Info("warm pool size set", "template", name, "size", size, "destroyed", len(extra))
	for _, st := range m.Pools() {
		if st.Template == name {
			return st, nil
		}
	}
	return PoolStatus{Template: name}, nil
}

// Pools returns every pool, by template.
func (m *Manager) Pools() []PoolStatus {
	ps := &m.pools
	ps.mu.Lock()
	out := make([]PoolStatus, 0, len(ps.byTpl))
	for _, p := range ps.byTpl {
		out = append(out, PoolStatus{Template: p.template, Size: p.size, Ready: len(p.ready), Filling: p.filling,
			HandedOut: p.handedOut, Misses: p.misses, LastError: p.lastErr})
	}
	ps.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Template < out[j].Template })
	return out
}

// cannotServe says why a pool cannot serve these options ("" if it can).
func (p *pool) cannotServe(o Options) string {
	b := p.base
	switch {
	case len(o.Volumes) > 0:
		return "volume mounts"
	case len(o.SecretEnv) > 0:
		return "secret env vars"
	case o.CPUs != b.CPUs:
		return "cpus"
	case o.MemoryMB != b.MemoryMB:
		return "memory"
	case o.DiskMB != b.DiskMB:
		return "disk"
	case o.Pids != b.Pids:
		return "pids"
	case o.OutputMB != b.OutputMB:
		return "output limit"
	}
	return ""
}

// fromPool hands out a pooled sandbox for a create of normalized opts; false
// means the create goes cold (no pool, options it cannot serve, empty, or a
// failed hand-out).
func (m *Manager) fromPool(ctx context.Context, opts Options) (*Sandbox, bool) {
	return m.handOutFrom(ctx, opts, true)
}

// takePooled is fromPool for a create that already went cold and waited
// for its turn (coldqueue.go): a refill that landed meanwhile serves it,
// and an empty pool is no new miss.
func (m *Manager) takePooled(ctx context.Context, opts Options) (*Sandbox, bool) {
	return m.handOutFrom(ctx, opts, false)
}

func (m *Manager) handOutFrom(ctx context.Context, opts Options, first bool) (*Sandbox, bool) {
	ps := &m.pools
	ps.mu.Lock()
	p := ps.byTpl[opts.TemplateID]
	if p == nil || ps.closed {
		ps.mu.Unlock()
		return nil, false
	}
	if why := p.cannotServe(opts); why != "" {
		if first {
			p.misses++
			m.log.Info("warm pool cannot serve this create (its "+why+" differs): cold start", "template", opts.TemplateID)
		}
		ps.mu.Unlock()
		return nil, false
	}
	if first {
		p.demand.add(time.Now()) // what the pool grows toward (adapt.go)
	}
	if len(p.ready) == 0 {
		if first {
			p.misses++
			m.log.Info("warm pool empty: cold start", "template", opts.TemplateID)
		}
		ps.mu.Unlock()
		return nil, false
	}
	pd := p.ready[0] // the oldest first
	p.ready = p.ready[1:]
	ps.mu.Unlock()
	ps.kick()

	start := time.Now()
	sb, err := m.handOut(ctx, pd, opts)
	ps.mu.Lock()
	if err != nil {
		p.misses++
		p.lastErr = "hand-out of " + pd.sb.ID + ": " + err.Error()
	} else {
		p.handedOut++
	}
	ps.mu.Unlock()
	if err != nil {
		m.log.Warn("warm pool hand-out failed: destroying the pooled sandbox, cold start", "template", opts.TemplateID, "id", pd.sb.ID, "err", err)
		m.cleanup(context.WithoutCancel(ctx), pd.sb)
		return nil, false
	}
	m.log.Info("sandbox created from warm pool", "id", sb.ID, "opts", opts.String(), "runtime", sb.Runtime,
		"took", time.Since(start).Round(time.Microsecond), "pooled_for", start.Sub(pd.made).Round(time.Millisecond))
	m.lifecycleEvent(sb.ID, "created from the warm pool on %s: %s; egress %s", sb.Runtime, opts.String(), egressSummary(opts.Egress))
	m.emit(sb, EventCreated, "")
	return sb, true
}

// handOut turns a pooled sandbox into the sandbox of a create request.
func (m *Manager) handOut(ctx context.Context, pd *pooled, opts Options) (*Sandbox, error) {
	sb := pd.sb
	conn := sb.currentConn()
	if conn == nil || conn.IsClosed() {
		return nil, errors.New("its agent channel closed while it waited in the pool")
	}
	// A template rebuilt since the sandbox was made: it would run the old
	// image.
	tpl, err := m.cfg.Templates.Get(sb.TemplateID)
	if err != nil {
		return nil, fmt.Errorf("look up template %s: %w", sb.TemplateID, err)
	}
	if tpl.Image != pd.tpl.Image || !slices.Equal(tpl.Services, pd.tpl.Services) {
		return nil, fmt.Errorf("template %s changed since the sandbox was made", sb.TemplateID)
	}
	now := time.Now().UTC()
	sb.mu.Lock()
	sb.Options = opts
	sb.StartedAt = now // not yet visible to anyone but us
	sb.endAt = now.Add(opts.Timeout)
	sn := sb.net
	sb.mu.Unlock()
	if sn != nil {
		if err := sn.eg.SetPolicy(opts.Egress); err != nil {
			return nil, errdefs.InvalidArgument("network policy: %v", err)
		}
	}
	// The host-only config is what a cold boot of this sandbox (a resume
	// after a pause without memory) starts from: it gets the request's env
	// too (agentchannel.go).
	if err := m.writeAgentConfig(sb, m.agentConfig(sb, pd.tpl), false); err != nil {
		return nil, err
	}
	if len(opts.EnvVars) > 0 {
		// The running agent merges these into its env: new processes see
		// them (fork.go's reinit; token and sandbox ID stay the same).
		if err := reinitAgent(ctx, conn, sb.EnvdAccessToken, sb, opts.EnvVars); err != nil {
			return nil, err
		}
	}
	if err := m.persistNew(ctx, sb); err != nil {
		return nil, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, errdefs.Unavailable("daemon is shutting down")
	}
	m.addLocked(ctx, sb) // quota.go
	m.mu.Unlock()
	go m.supervise(sb, sb.gen)
	return sb, nil
}

// makePooled starts a sandbox of the template with the default options and
// no egress, and returns it once its agent answers. It has no record.
func (m *Manager) makePooled(ctx context.Context, base Options) (*pooled, error) {
	tpl, err := m.template(ctx, base.TemplateID)
	if err != nil {
		return nil, err
	}
	if err := m.checkEngine(tpl); err != nil { // engine.go
		return nil, err
	}
	sb := &Sandbox{
		ID:              store.NewID(),
		TemplateID:      base.TemplateID,
		Runtime:         m.cfg.Runtime.Name(),
		Options:         base,
		StartedAt:       time.Now().UTC(),
		EnvdAccessToken: newToken(),
		channelTokens:   []string{newToken()},
		state:           StateRunning,
	}
	sb.endAt = sb.StartedAt.Add(base.Timeout)
	sb.Dir = filepath.Join(sandboxesDir(m.cfg.DataDir), sb.ID)
	if err := m.start(ctx, sb, tpl); err != nil {
		m.cleanup(context.WithoutCancel(ctx), sb)
		return nil, err
	}
	m.warmPooled(ctx, sb)
	pd := &pooled{sb: sb, tpl: tpl, made: time.Now()}
	if st, err := m.cfg.Runtime.Stats(ctx, sb.ID); err == nil {
		pd.memory = st.Memory
	}
	return pd, nil
}

// warmPooled runs an exec's command shape in a pooled sandbox, so that
// the first exec after its hand-out costs what later ones do: bash, its
// libraries and the login scripts paged in (under gVisor each through the
// sentry), the agent's exec path and its process service run once in both
// Connect codecs (agentclient.Warm), and the channel's stream to the agent
// open (the edge's requests and the daemon's share the name they are keyed
// by, agentapi.LinkHost). A sandbox whose warm-up fails is still handed
// out: its first exec is merely cold.
func (m *Manager) warmPooled(ctx context.Context, sb *Sandbox) {
	conn := sb.currentConn()
	if conn == nil {
		return
	}
	if err := agentclient.New(sb.ID, agentclient.On(conn), sb.EnvdAccessToken).Warm(ctx, ""); err != nil {
		m.log.Warn("warm pool: warming a pooled sandbox's exec path failed; its first exec will be slower", "id", sb.ID, "err", err)
	}
}

// fillPools is the filler: fillWorkers workers, each making one sandbox
// at a time for the pool furthest below its target, never while a create
// is in progress (up to poolDeferMax).
func (m *Manager) fillPools(ctx context.Context, done chan struct{}) {
	defer close(done)
	var wg sync.WaitGroup
	for i := range fillWorkers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.fillWorker(ctx, i == 0)
		}()
	}
	wg.Wait()
}

// fillWorker is one of the filler's workers; the first also prunes and
// trims.
func (m *Manager) fillWorker(ctx context.Context, first bool) {
	ps := &m.pools
	ps.mu.Lock()
	kick := ps.kickC
	ps.mu.Unlock()
	for ctx.Err() == nil {
		if first {
			m.prunePools(ctx)
			m.trimPools(ctx)
		}
		m.waitCreates(ctx)
		p, wait := ps.next(time.Now())
		if p == nil {
			select {
			case <-ctx.Done():
				return
			case <-kick:
			case <-time.After(wait):
			}
			continue
		}
		// Another worker may have a pool to fill too: pass the word on.
		ps.kick()
		start := time.Now()
		pd, err := m.makePooled(ctx, p.base)
		if discard := ps.put(p, pd, err, ctx.Err() != nil); discard != nil {
			m.cleanup(context.Background(), discard.sb)
			ps.doneDestroying(1)
			continue
		}
		if err != nil {
			if ctx.Err() == nil {
				m.log.Warn("warm pool refill failed", "template", p.template, "err", err)
			}
			continue
		}
		m.log.Info("warm pool refilled", "template", p.template, "id", pd.sb.ID, "took", time.Since(start).Round(time.Millisecond))
	}
}

// trimPools destroys the ready sandboxes above each pool's target, the
// newest first: what recent demand grew a pool by, once it has fallen.
func (m *Manager) trimPools(ctx context.Context) {
	ps := &m.pools
	now := time.Now()
	var extra []*pooled
	ps.mu.Lock()
	for _, p := range ps.byTpl {
		if t := p.target(now, ps.spareLocked()); len(p.ready) > t && len(p.ready) > p.size {
			keep := max(t, p.size)
			extra = append(extra, p.ready[keep:]...)
			clear(p.ready[keep:])
			p.ready = p.ready[:keep]
		}
	}
	for range extra {
		ps.destroying.begin()
	}
	ps.mu.Unlock()
	if len(extra) > 0 {
		m.log.Info("warm pools shrunk: demand fell", "destroyed", len(extra))
		m.destroyPooled(context.WithoutCancel(ctx), extra)
		ps.doneDestroying(len(extra))
	}
}

// waitCreates holds a refill back while creates run and for poolQuiet
// after the last one, up to poolDeferMax.
func (m *Manager) waitCreates(ctx context.Context) {
	ps := &m.pools
	busy := func() bool {
		return ps.creates.Load() > 0 || time.Since(time.Unix(0, ps.lastCreate.Load())) < poolQuiet
	}
	deadline := time.Now().Add(poolDeferMax)
	for busy() && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// next picks the pool to fill (marking its fill as started), or says how
// long to wait before looking again.
func (ps *poolSet) next(now time.Time) (*pool, time.Duration) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	wait := poolPrune
	var best *pool
	bestGap := 0
	spare := ps.spareLocked()
	for _, p := range ps.byTpl {
		gap := p.target(now, spare) - len(p.ready) - p.filling
		if ps.closed || gap <= 0 {
			continue
		}
		if now.Before(p.retryAt) {
			wait = min(wait, p.retryAt.Sub(now))
			continue
		}
		if best == nil || gap > bestGap || (gap == bestGap && p.template < best.template) {
			best, bestGap = p, gap
		}
	}
	if best != nil {
		best.filling++
		best.fills.begin()
	}
	return best, wait
}

// put ends a fill: the sandbox joins its pool, or is returned to be
// destroyed when the pool no longer wants it.
func (ps *poolSet) put(p *pool, pd *pooled, err error, stopping bool) (discard *pooled) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p.filling--
	p.fills.end()
	if err != nil {
		if !stopping {
			p.failures++
			p.lastErr = err.Error()
			p.retryAt = time.Now().Add(min(time.Second<<min(p.failures-1, 10), poolBackoffMax))
		}
		return nil
	}
	if ps.closed || ps.byTpl[p.template] != p || len(p.ready) >= p.target(time.Now(), ps.spareLocked()) {
		ps.destroying.begin() // the caller destroys it, then doneDestroying
		return pd
	}
	if pd.memory > 0 {
		p.memEach = pd.memory
	}
	p.ready = append(p.ready, pd)
	p.failures, p.lastErr, p.retryAt = 0, "", time.Time{}
	return nil
}

// prunePools drops pooled sandboxes whose agent went away (the container
// died, the channel broke): they could not be handed out.
func (m *Manager) prunePools(ctx context.Context) {
	ps := &m.pools
	var dead []*pooled
	ps.mu.Lock()
	for _, p := range ps.byTpl {
		kept := p.ready[:0]
		for _, pd := range p.ready {
			if c := pd.sb.currentConn(); c == nil || c.IsClosed() {
				dead = append(dead, pd)
				p.lastErr = "pooled sandbox " + pd.sb.ID + " lost its agent while it waited"
				continue
			}
			kept = append(kept, pd)
		}
		clear(p.ready[len(kept):])
		p.ready = kept
	}
	ps.mu.Unlock()
	for _, pd := range dead {
		m.log.Warn("pooled sandbox lost its agent: destroying it", "template", pd.sb.TemplateID, "id", pd.sb.ID,
			"reason", m.deathReason(pd.sb).reason)
	}
	m.destroyPooled(context.WithoutCancel(ctx), dead)
}

// destroyPooled destroys pooled sandboxes, a few at a time.
func (m *Manager) destroyPooled(ctx context.Context, all []*pooled) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, pd := range all {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			m.cleanup(context.WithoutCancel(ctx), pd.sb)
		}()
	}
	wg.Wait()
}

// stopPools ends the filler (a fill in progress is abandoned and cleaned
// up) and destroys every pooled sandbox: Shutdown leaves none behind.
func (m *Manager) stopPools(ctx context.Context) {
	ps := &m.pools
	ps.mu.Lock()
	ps.closed = true
	cancel, done := ps.cancel, ps.done
	var all []*pooled
	for _, p := range ps.byTpl {
		all = append(all, p.ready...)
		p.ready = nil
	}
	ps.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	m.destroyPooled(ctx, all)
	if len(all) > 0 {
		m.log.Info("warm pools stopped", "destroyed", len(all))
	}
}
