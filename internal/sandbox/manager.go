package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/metrics"
	"github.com/cella-sandbox/cella/internal/rootfs"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/template"
	"github.com/cella-sandbox/cella/internal/tenant"
	"github.com/cella-sandbox/cella/internal/volume"
)

// Config configures a Manager.
type Config struct {
	DataDir   string
	Runtime   runtime.Runtime
	Templates *template.Store
	Store     *store.Store
	// Agents are the agent binaries on the host (agents.go); Agent is the
	// hash of the one cold boots use.
	Agents AgentBinaries
	Agent  string
	Log    *slog.Logger
	// AgentTimeout bounds how long create waits for the agent's hello.
	AgentTimeout time.Duration
	// BuildProgress receives progress lines when a template is built on
	// first use (the daemon's log).
	BuildProgress io.Writer
	// Volumes is the named-volume store (nil: creates with volumes fail);
	// Lifecycle the daemon's default policy (lifecycle.go).
	Volumes   *volume.Manager
	Lifecycle Lifecycle
	// AgentAudit receives the agents' audit feeds (nil: not followed).
	AgentAudit AgentAudit
	// Events receives lifecycle events (E2B's events API and webhooks);
	// nil: none.
	Events EventSink
	// Network gives sandboxes egress through the proxy (network.go); nil
	// runs them with no network at all.
	Network *Network
	// SecretValue reads a secret for Options.SecretEnv (nil: none exist).
	SecretValue func(name string) (string, error)
	// MetricsInterval is how often running sandboxes' resource use is
	// sampled (metrics.go); 0 means DefaultMetricsInterval.
	MetricsInterval time.Duration
	// Maxima bound every sandbox's limits; zero fields are the host's
	// (HostMaxima of DataDir).
	Maxima Maxima
	// PoolMemoryBudget is the memory warm pools may hold beyond their set
	// sizes as recent demand grows them (adapt.go); 0 is
	// DefaultPoolMemoryBudget, a quarter of the host's RAM.
	PoolMemoryBudget int64
	// Metrics receives lifecycle latencies and deaths (nil: none kept).
	Metrics *metrics.Metrics
	// KeyLimits returns the quota of an API key (quota.go); nil: no key
	// has one.
	KeyLimits func(ctx context.Context, keyID string) (KeyQuota, error)
	// Archive, when set, is where paused sandboxes go so that they outlive
	// this node (cella serve --archive; remote.go). Claim, when set, takes
	// a sandbox for this node before its archive is restored or deleted
	// (a cluster's record moves here; ErrMoved: another node holds it);
	// NodeName names this node in manifests.
	Archive  Archive
	Claim    func(ctx context.Context, id string) error
	NodeName string
	// ClusterQuota, when set, holds key quotas across the nodes of a
	// cluster (clusterquota.go).
	ClusterQuota ClusterQuota
}

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.DataDir == "":
		return errors.New("sandbox manager: DataDir is required")
	case c.Runtime == nil:
		return errors.New("sandbox manager: Runtime is required")
	case c.Templates == nil:
		return errors.New("sandbox manager: Templates is required")
	case c.Store == nil:
		return errors.New("sandbox manager: Store is required")
	case c.Agents == nil || c.Agent == "":
		return errors.New("sandbox manager: Agents and Agent are required")
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.AgentTimeout == 0 {
		c.AgentTimeout = 30 * time.Second
	}
	if c.BuildProgress == nil {
		c.BuildProgress = io.Discard
	}
	var err error
	if c.Maxima, err = c.Maxima.Resolve(c.DataDir); err != nil {
		return fmt.Errorf("sandbox manager: %w", err)
	}
	switch {
	case c.MetricsInterval == 0:
		c.MetricsInterval = DefaultMetricsInterval
	case c.MetricsInterval < 100*time.Millisecond || c.MetricsInterval > MetricsRetention:
		return fmt.Errorf("sandbox manager: metrics interval %v is out of range (100ms to %v)", c.MetricsInterval, MetricsRetention)
	}
	return nil
}

// Manager creates, tracks and destroys the sandboxes of one daemon.
type Manager struct {
	cfg Config
	log *slog.Logger

	buildMu sync.Mutex // serializes first-use template builds

	mu        sync.Mutex
	sandboxes map[string]*Sandbox
	closed    bool

	// reserved are the quota reservations of creates and resumes in
	// flight (quota.go).
	reserved map[*reservation]struct{}
	// clusterUsage is what this node last wrote of keys' usage to the
	// cluster (clusterquota.go).
	clusterUsage clusterUsage
	keyUsageDone chan struct{} // closed when syncKeyUsage returns

	reaperStop  chan struct{} // closed by Shutdown: stops the reaper and the metrics sampler
	reaperDone  chan struct{}
	samplerDone chan struct{}

	pools poolSet    // warm pools (pool.go)
	cold  *coldQueue // cold starts of creates, in turns (coldqueue.go)

	snapsMu sync.Mutex
	// pendingSnaps are template snapshots whose template does not name
	// them yet: the pruning of template snapshots leaves them (build.go).
	pendingSnaps map[string]bool

	layers *rootfs.Layers // makes the writable layers (blank images in <data>/layers)

	// snapshotting are the snapshots being made, whose directories have no
	// record yet: gcSnapshots leaves them (guarded by snapMu).
	snapshotting map[string]bool

	// agentsMu serializes pruning the agent binaries with holding one
	// (agents.go); agentHolds counts the holds per hash.
	agentsMu   sync.Mutex
	agentHolds map[string]int
	// agentUpMu guards agentUp: the agent binaries (by hash) this daemon
	// put in the archive store (remote.go).
	agentUpMu sync.Mutex
	agentUp   map[string]bool
}

// NewManager makes a manager; call Reconcile before serving.
func NewManager(cfg Config) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(sandboxesDir(cfg.DataDir), 0o700); err != nil {
		return nil, fmt.Errorf("create sandboxes dir: %w", err)
	}
	layers, err := rootfs.NewLayers(filepath.Join(cfg.DataDir, "layers"))
	if err != nil {
		return nil, err
	}
	m := &Manager{
		layers:      layers,
		cfg:         cfg,
		log:         cfg.Log,
		sandboxes:   map[string]*Sandbox{},
		reaperStop:  make(chan struct{}),
		reaperDone:  make(chan struct{}),
		samplerDone: make(chan struct{}),
		cold:        newColdQueue(coldStartSlots()),
	}
	m.pools.budget = cmp.Or(cfg.PoolMemoryBudget, DefaultPoolMemoryBudget()) // adapt.go
	// Layers of the default size wait ready: a create then takes one in
	// about 0.1 ms instead of attaching and mounting one (1.5-4 ms).
	layers.Keep(mib(DefaultDiskMB), readyLayers)
	go m.reaper()
	go m.sampleMetrics()
	m.keyUsageDone = make(chan struct{})
	if cfg.ClusterQuota != nil {
		go m.syncKeyUsage() // clusterquota.go
	} else {
		close(m.keyUsageDone)
	}
	return m, nil
}

// readyLayers is how many writable layers of the default size are kept
// mounted ahead (rootfs.Layers.Keep): enough for a warm pool's refill and
// the next create.
const readyLayers = 2

func sandboxesDir(dataDir string) string { return filepath.Join(dataDir, "sandboxes") }

// Maxima are the bounds this manager holds sandboxes' limits to.
func (m *Manager) Maxima() Maxima { return m.cfg.Maxima }

// RuntimeName is the runtime this manager drives.
func (m *Manager) RuntimeName() string { return m.cfg.Runtime.Name() }

// record is what the store keeps of a sandbox beyond its columns.
type record struct {
	Options         Options `json:"options"`
	EnvdAccessToken string  `json:"envd_access_token"`
	ChannelToken    string  `json:"channel_token"`
	// NextChannelToken is a credential sent to the agent and not yet seen
	// taken (agentchannel.go): the agent holds one of the two.
	NextChannelToken string `json:"next_channel_token,omitempty"`
	Error            string `json:"error,omitempty"`
	PauseMode        string `json:"pause_mode,omitempty"`
	// Lifecycle state (lifecycle.go): when it was paused, whether archived.
	PausedAt time.Time `json:"paused_at,omitempty"`
	Archived bool      `json:"archived,omitempty"`
	// Remote: objects of the sandbox may be in the archive store
	// (remote.go), which its kill deletes.
	Remote bool `json:"remote,omitempty"`
	// NetSlot is the network slot its container runs in (network.go), so
	// that a daemon restarting after a crash can adopt it with the sandbox.
	NetSlot string `json:"net_slot,omitempty"`
	// Agent is the SHA-256 of the agent binary it runs (agents.go).
	Agent string `json:"agent,omitempty"`
}

// tokens are the agent credentials the record keeps.
func (r record) tokens() []string {
	out := []string{r.ChannelToken}
	if r.NextChannelToken != "" {
		out = append(out, r.NextChannelToken)
	}
	return out
}

// Create makes a sandbox owned by p and returns once its agent answers.
func (m *Manager) Create(ctx context.Context, p tenant.Principal, opts Options) (*Sandbox, error) {
	t0 := time.Now()
	opts.APIKeyID, opts.TeamID = p.Key, p.Team
	if err := opts.Normalize(m.cfg.Maxima); err != nil {
		return nil, err
	}
	releaseVolumes, err := m.holdVolumes(ctx, p, &opts) // volumes.go
	if err != nil {
		return nil, err
	}
	defer releaseVolumes()
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return nil, errdefs.Unavailable("daemon is shutting down")
	}
	defer m.pools.creating()() // pool.go: refills wait while creates run
	if row, rec, ok := m.lookupSnapshot(ctx, p, opts.TemplateID); ok {
		sb, err := m.createFromSnapshot(ctx, p, opts, row, rec) // fork.go
		if err == nil {
			m.cfg.Metrics.Create(metrics.CreateSnapshot, sb.TemplateID, time.Since(t0))
		}
		return sb, err
	}
	tpl, err := m.templateFor(ctx, opts) // build.go
	if err != nil {
		return nil, err
	}
	if err := m.checkEngine(tpl); err != nil { // engine.go
		return nil, err
	}
	if tpl.Snapshot != "" && opts.Image == "" {
		// A built template with its start command captured running.
		if sb, ok, err := m.fromTemplateSnapshot(ctx, p, opts, tpl); ok { // build.go
			if err == nil {
				m.cfg.Metrics.Create(metrics.CreateSnapshot, sb.TemplateID, time.Since(t0))
			}
			return sb, err
		}
	}
	res, err := m.reserve(ctx, opts, 1) // quota.go: the key's slot, before anything starts
	if err != nil {
		return nil, err
	}
	defer res.release()
	ctx = withReservation(ctx, res)
	if sb, ok := m.fromPool(ctx, opts); ok { // pool.go: a warm sandbox, else cold below
		m.cfg.Metrics.Create(metrics.CreatePooled, sb.TemplateID, time.Since(t0))
		return sb, nil
	}

	sb := &Sandbox{
		ID:              store.NewID(),
		TemplateID:      opts.TemplateID,
		Runtime:         m.cfg.Runtime.Name(),
		Options:         opts,
		StartedAt:       time.Now().UTC(),
		EnvdAccessToken: newToken(),
		channelTokens:   []string{newToken()},
		state:           StateRunning,
	}
	sb.endAt = sb.StartedAt.Add(opts.Timeout)
	sb.Dir = filepath.Join(sandboxesDir(m.cfg.DataDir), sb.ID)

	release, err := m.cold.wait(ctx) // coldqueue.go: a burst boots in turns
	if err != nil {
		return nil, err
	}
	// A refill may have landed while this create waited for its turn.
	if pooled, ok := m.takePooled(ctx, opts); ok {
		release()
		m.cfg.Metrics.Create(metrics.CreatePooled, pooled.TemplateID, time.Since(t0))
		return pooled, nil
	}
	err = m.start(ctx, sb, tpl)
	release()
	if err != nil {
		m.cleanup(context.WithoutCancel(ctx), sb)
		return nil, err
	}
	if err := m.persistNew(ctx, sb); err != nil {
		m.cleanup(context.WithoutCancel(ctx), sb)
		return nil, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.cleanup(context.WithoutCancel(ctx), sb)
		return nil, errdefs.Unavailable("daemon is shutting down")
	}
	m.addLocked(ctx, sb) // quota.go
	m.mu.Unlock()
	go m.supervise(sb, sb.gen)
	m.cfg.Metrics.Create(metrics.CreateCold, sb.TemplateID, time.Since(t0))
	m.log.Info("sandbox created", "id", sb.ID, "opts", opts.String(), "runtime", sb.Runtime)
	m.lifecycleEvent(sb.ID, "created on %s: %s; egress %s", sb.Runtime, opts.String(), egressSummary(opts.Egress))
	m.emit(sb, EventCreated, "")
	return sb, nil
}

func (m *Manager) template(ctx context.Context, name string) (*template.Template, error) {
	tpl, err := m.cfg.Templates.Get(name)
	if err == nil {
		return tpl, nil
	}
	if !errors.Is(err, template.ErrNotFound) {
		return nil, fmt.Errorf("look up template %s: %w", name, err)
	}
	if !template.IsBuiltin(name) {
		return nil, errdefs.NotFound("template %q not found (build it with: cella template build %s ...)", name, name)
	}
	m.buildMu.Lock()
	defer m.buildMu.Unlock()
	if tpl, err := m.cfg.Templates.Get(name); err == nil {
		return tpl, nil
	}
	m.log.Warn("template is missing: building it now from Debian packages (minutes, once per machine)", "template", name)
	start := time.Now()
	tpl, err = m.cfg.Templates.EnsureNamed(ctx, name, m.cfg.BuildProgress)
	if err != nil {
		return nil, fmt.Errorf("build template %s: %w", name, err)
	}
	m.cfg.Metrics.TemplateBuild(name, time.Since(start))
	return tpl, nil
}

// templateOf is the template a sandbox or snapshot directory runs on: the
// image it leased (its name may point at another image by now), else what
// the name says (state from a cella without leases).
func (m *Manager) templateOf(ctx context.Context, dir, name string) (*template.Template, error) {
	if t, err := m.cfg.Templates.Leased(dir); err == nil {
		return t, nil
	}
	return m.template(ctx, name)
}

// releaseTemplate drops the lease of a removed sandbox or snapshot dir.
func (m *Manager) releaseTemplate(dir string) {
	if err := m.cfg.Templates.Release(dir); err != nil {
		m.log.Warn("release template lease", "dir", dir, "err", err)
	}
}

// start brings up everything a sandbox runs on; on error the caller cleans up.
func (m *Manager) start(ctx context.Context, sb *Sandbox, tpl *template.Template) error {
	bundleDir := filepath.Join(sb.Dir, "bundle")
	st := newStepTimer()
	defer func() { m.log.Debug("create steps", append([]any{"id", sb.ID}, st.attrs()...)...) }()
	for _, d := range []string{sb.Dir, bundleDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("create dirs for %s: %w", sb.ID, err)
		}
	}
	if _, err := m.openRunDir(sb); err != nil { // rundir.go
		return err
	}
	// The lease keeps the template's image and layers while sb.Dir exists.
	lowers, err := m.cfg.Templates.Acquire(sb.Dir, tpl)
	if err != nil {
		return fmt.Errorf("template for %s: %w", sb.ID, err)
	}
	layer, err := m.layers.MountStack(lowers, sb.Dir, mib(sb.Options.DiskMB))
	st.step("rootfs")
	if err != nil {
		return fmt.Errorf("create rootfs for %s: %w", sb.ID, err)
	}
	sb.layer = layer

	ln, err := m.listen(sb) // agentchannel.go
	if err != nil {
		return err
	}
	sb.listener = ln

	if err := m.prepareGuestNetwork(sb, layer.Root); err != nil { // network.go
		return err
	}
	if err := prepareGuestHosts(layer.Root); err != nil { // hosts.go
		return fmt.Errorf("hosts file for %s: %w", sb.ID, err)
	}
	if _, err := m.attachNetwork(ctx, sb); err != nil {
		return err
	}
	st.step("network")
	if err := m.writeAgentConfig(sb, m.agentConfig(sb, tpl), true); err != nil {
		return err
	}
	agent, err := m.bootAgent(sb) // agents.go
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	spec := m.spec(sb, agent)
	if err := m.cfg.Runtime.Start(ctx, spec); err != nil {
		return fmt.Errorf("start %s container for %s: %w", m.cfg.Runtime.Name(), sb.ID, err)
	}
	st.step("runtime_start")
	actx, cancel := context.WithTimeout(ctx, m.cfg.AgentTimeout)
	defer cancel()
	conn, hello, err := m.acceptAgent(actx, sb, ln) // agentchannel.go
	if err != nil {
		return fmt.Errorf("sandbox %s: agent did not answer within %v (%w); agent log: %s",
			sb.ID, m.cfg.AgentTimeout, err, tail(spec.LogPath, 800))
	}
	st.step("agent_hello")
	m.rotateChannel(ctx, sb, conn, hello.Token, false)
	st.step("channel_credential")
	sb.setConn(conn)
	if err := m.sendSecretEnv(ctx, sb, conn); err != nil { // secretenv.go
		return err
	}
	return nil
}

// stepTimer records how long each step of a create took, for the debug log
// (docs/ARCHITECTURE.md "where create's time goes").
type stepTimer struct {
	last  time.Time
	steps []any
}

func newStepTimer() *stepTimer { return &stepTimer{last: time.Now()} }

func (t *stepTimer) step(name string) {
	now := time.Now()
	t.steps = append(t.steps, name, now.Sub(t.last).Round(10*time.Microsecond))
	t.last = now
}

func (t *stepTimer) attrs() []any { return t.steps }

// spec is the container of a sandbox whose layer is mounted: the same for
// its first start, a cold boot after a pause without memory, and a restore,
// but for agent, the host file of the agent binary it runs (agents.go).
func (m *Manager) spec(sb *Sandbox, agent string) runtime.Spec {
	return runtime.Spec{
		ID:          sb.ID,
		BundleDir:   filepath.Join(sb.Dir, "bundle"),
		RootFS:      sb.layer.Root,
		AgentBinary: agent,
		Args:        []string{runtime.AgentGuestPath, "agent"},
		Env:         []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		RunDir:      runDir(sb),
		Hostname:    guestHostname, // hosts.go
		Limits:      m.ceilings(sb.Options),
		LogPath:     agentLog(sb),
		Mounts:      m.volumeMounts(sb), // volumes.go
		NetNSPath:   sb.netNSPath(),
		// engine.go
		ContainerEngine: m.engineOf(sb),
	}
}

// agentLog is the host file the agent's stderr goes to.
func agentLog(sb *Sandbox) string { return filepath.Join(sb.Dir, "agent.log") }

func (m *Manager) agentConfig(sb *Sandbox, tpl *template.Template) agentapi.Config {
	env := map[string]string{}
	for _, kv := range tpl.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	if m.cfg.Network != nil && len(m.cfg.Network.CAPEM) > 0 {
		for k, v := range caEnv() { // network.go
			env[k] = v
		}
	}
	for k, v := range sb.Options.EnvVars {
		env[k] = v
	}
	// No secret values: the config is a file (secretenv.go).
	return agentapi.Config{
		SandboxID:      sb.ID,
		TemplateID:     sb.TemplateID,
		Runtime:        m.cfg.Runtime.Name(),
		AccessToken:    sb.EnvdAccessToken,
		EnvVars:        env,
		DefaultUser:    tpl.User,
		DefaultWorkdir: tpl.Workdir,
		Services:       tpl.Services,
		Limits: agentapi.Limits{
			CPUs:        sb.Options.CPUs,
			MemoryBytes: mib(sb.Options.MemoryMB),
			Pids:        sb.Options.Pids,
			DiskBytes:   mib(sb.Options.DiskMB),
			OutputBytes: mib(sb.Options.OutputMB),
		},
	}
}

// ceilings are the host cgroup limits: the agent enforces the nominal
// limits inside and kills only the offending command; these stay above them
// as a backstop because under gVisor hitting the cgroup limit kills the whole
// sandbox, and gVisor's own sentry and stub processes count too.
func (m *Manager) ceilings(o Options) runtime.Limits {
	mem := mib(o.MemoryMB)
	// Under systrap each guest process costs about two host tasks (its
	// address space's stub process, kept in gVisor's pool after the process
	// ends), plus the sentry's threads, and gVisor dies when this ceiling
	// refuses one. What keeps a fork bomb below it is the guest's own pids
	// cgroup, which the agent caps at the limit + agentapi.CommandPidsSlack
	// tasks: measured, a bomb under pids 64 (cap 128) peaks at 300-380 host
	// tasks of 512, under the default 256 (cap 320) at ~720 of 1280.
	l := runtime.Limits{CPUs: o.CPUs, MemoryBytes: mem + mem/4 + mib(256), Pids: o.Pids*4 + 256}
	if m.cfg.Runtime.Name() == runtime.Namespaces {
		l.MemoryBytes = mem + mib(128)
		l.Pids = o.Pids + 64
	}
	return l
}

func (m *Manager) persist(ctx context.Context, sb *Sandbox) error {
	sb.persistMu.Lock()
	defer sb.persistMu.Unlock()
	if sb.recordGone {
		return nil // killed meanwhile: a late write must not bring it back
	}
	row, err := m.rowOf(sb)
	if err != nil {
		return err
	}
	return m.cfg.Store.PutSandbox(ctx, row)
}

// rowOf is the store's row of sb as it is now, its record included.
func (m *Manager) rowOf(sb *Sandbox) (store.Sandbox, error) {
	sb.mu.Lock()
	rec := record{Options: sb.Options, EnvdAccessToken: sb.EnvdAccessToken,
		Error: sb.err, PauseMode: sb.pauseMode, PausedAt: sb.lc.pausedAt, Archived: sb.lc.archived, Remote: sb.lc.remote, Agent: sb.agent}
	if t := sb.channelTokens; len(t) > 0 {
		rec.ChannelToken = t[0]
		if len(t) > 1 {
			rec.NextChannelToken = t[1]
		}
	}
	if sb.net != nil {
		rec.NetSlot = sb.net.slot.ID
	}
	row := store.Sandbox{ID: sb.ID, TemplateID: sb.TemplateID, Runtime: sb.Runtime, State: sb.state,
		StartedAt: sb.StartedAt, EndAt: sb.endAt, APIKeyID: sb.Options.APIKeyID, TeamID: sb.Options.TeamID}
	sb.mu.Unlock()
	b, err := json.Marshal(rec)
	if err != nil {
		return row, err
	}
	row.Record = b
	return row, nil
}

// persistNew stores the record of a sandbox that has just been made, and
// who owns it: the owner row outlives the record, for its audit log.
func (m *Manager) persistNew(ctx context.Context, sb *Sandbox) error {
	if err := m.cfg.Store.PutSandboxOwner(ctx, sb.ID, sb.Options.TeamID, sb.Options.APIKeyID); err != nil {
		return err
	}
	return m.persist(ctx, sb)
}

// supervise keeps the agent channel of a running sandbox: when the agent's
// connection drops it waits for the agent to dial again, and if the container
// is gone it marks the sandbox dead with the reason. gen is the supervision
// it runs for: once a pause has bumped sb.gen, supervise stands down, so the
// end of the channel a pause causes is never taken for a death.
func (m *Manager) supervise(sb *Sandbox, gen uint64) {
	for {
		sb.mu.Lock()
		conn, ln, state, cur := sb.conn, sb.listener, sb.state, sb.gen
		sb.mu.Unlock()
		if state != StateRunning || cur != gen || ln == nil {
			return
		}
		if conn != nil {
			go m.followAgent(sb, conn)
			<-conn.Closed()
		}
		if !m.isTracked(sb) || !sb.supervisedBy(gen) {
			return
		}
		st, err := m.cfg.Runtime.State(context.Background(), sb.ID)
		if err != nil || st == runtime.StatusStopped {
			m.markDead(sb, gen, m.deathReason(sb))
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		newConn, hello, err := m.acceptAgent(ctx, sb, ln) // agentchannel.go
		cancel()
		sb.mu.Lock()
		current := sb.gen == gen
		if current {
			sb.setConnLocked(newConn)
		}
		sb.mu.Unlock()
		if !m.isTracked(sb) || !current {
			if newConn != nil {
				newConn.Close()
			}
			return
		}
		if err == nil {
			m.rotateChannel(context.Background(), sb, newConn, hello.Token, true)
		} else {
			m.log.Warn("agent channel lost", "id", sb.ID, "err", err)
			if st, err := m.cfg.Runtime.State(context.Background(), sb.ID); err != nil || st == runtime.StatusStopped {
				m.markDead(sb, gen, m.deathReason(sb))
				return
			}
		}
	}
}

// supervisedBy reports whether gen is still the sandbox's supervision.
func (s *Sandbox) supervisedBy(gen uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen == gen && s.state == StateRunning
}

func (m *Manager) isTracked(sb *Sandbox) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sandboxes[sb.ID] == sb
}

// death is why a sandbox died: the cause the metrics count it under
// (metrics.Death*) and the words its record keeps.
type death struct{ cause, reason string }

func (m *Manager) deathReason(sb *Sandbox) death {
	// The host's counters of its limits outlive the container's processes
	// (until Destroy). The pids ceiling first: a fork bomb under gVisor
	// grows the sentry's memory too, and the process count is the cause
	// worth naming.
	st, err := m.cfg.Runtime.Stats(context.Background(), sb.ID)
	if err == nil && st.PidsMaxHits != 0 {
		return death{metrics.DeathPids, fmt.Sprintf("killed: sandbox hit its host process ceiling of %d (sandbox pids limit %d; raise with --pids)",
			m.ceilings(sb.Options).Pids, sb.Options.Pids)}
	}
	if err == nil && st.OOMKills != 0 {
		return death{metrics.DeathOOM, fmt.Sprintf("killed: sandbox exceeded its host memory ceiling of %d MiB (sandbox memory limit %d MiB; raise with --memory)",
			m.ceilings(sb.Options).MemoryBytes>>20, sb.Options.MemoryMB)}
	}
	return death{metrics.DeathCrash, "sandbox stopped unexpectedly: its container exited; agent log: " + tail(filepath.Join(sb.Dir, "agent.log"), 400)}
}

// markDead records why a sandbox died and frees its host resources, keeping
// the record so that GET /sandboxes/{id} can say what happened.
func (m *Manager) markDead(sb *Sandbox, gen uint64, d death) {
	reason := d.reason
	sb.mu.Lock()
	if sb.gen != gen || sb.state != StateRunning {
		sb.mu.Unlock() // a pause or kill took over
		return
	}
	sb.setStateLocked(StateDead)
	sb.err = reason
	sb.mu.Unlock()
	m.cfg.Metrics.Death(d.cause)
	m.log.Warn("sandbox died", "id", sb.ID, "reason", reason)
	m.lifecycleEvent(sb.ID, "died: %s", reason)
	m.emit(sb, EventKilled, "died: "+reason)
	ctx := context.Background()
	m.releaseHost(ctx, sb)
	if err := m.persist(ctx, sb); err != nil {
		m.log.Error("persist dead sandbox", "id", sb.ID, "err", err)
	}
}

// notFound is the answer for a sandbox that does not exist and for one the
// caller may not see: the same words, so that IDs of other teams cannot be
// probed.
func notFound(id string) error { return errdefs.NotFound("sandbox %q not found", id) }

// Lookup returns the sandbox id if p may act on it. Every request that acts
// on a sandbox — the API's routes, the sandbox proxy, PTY sessions, MCP —
// gets it here.
func (m *Manager) Lookup(p tenant.Principal, id string) (*Sandbox, error) {
	sb, err := m.get(id)
	if err != nil || !p.Can(sb.Owner()) {
		return nil, notFound(id)
	}
	return sb, nil
}

// get returns a tracked sandbox by ID, whoever owns it.
func (m *Manager) get(id string) (*Sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.sandboxes[id]
	if !ok {
		return nil, notFound(id)
	}
	return sb, nil
}

// Owner returns who owns sandbox id, live or gone (as long as its audit log
// may be read); ErrNotFound-kind error when nobody recorded one.
func (m *Manager) Owner(ctx context.Context, id string) (tenant.Owner, error) {
	if sb, err := m.get(id); err == nil {
		return sb.Owner(), nil
	}
	team, key, err := m.cfg.Store.SandboxOwner(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return tenant.Owner{}, notFound(id)
	}
	if err != nil {
		return tenant.Owner{}, err
	}
	return tenant.Owner{Team: team, Key: key}, nil
}

// Tracked reports whether sandbox id is one of this manager's (running,
// paused or dead), whoever owns it.
func (m *Manager) Tracked(id string) bool {
	_, err := m.get(id)
	return err == nil
}

// PruneOwners forgets the owners of sandboxes that are gone and whose audit
// log is gone too (hasLog reports a log that is still there).
func (m *Manager) PruneOwners(ctx context.Context, hasLog func(id string) bool) error {
	ids, err := m.cfg.Store.SandboxOwnerIDs(ctx)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if m.Tracked(id) || hasLog(id) {
			continue
		}
		if err := m.cfg.Store.DeleteSandboxOwner(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// List returns the tracked sandboxes p may see, oldest first.
func (m *Manager) List(p tenant.Principal) []*Sandbox {
	m.mu.Lock()
	out := make([]*Sandbox, 0, len(m.sandboxes))
	for _, sb := range m.sandboxes {
		if p.Can(sb.Owner()) {
			out = append(out, sb)
		}
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].ID < out[j].ID
		}
		return out[i].StartedAt.Before(out[j].StartedAt)
	})
	return out
}

// Kill destroys a sandbox and forgets it.
func (m *Manager) Kill(ctx context.Context, p tenant.Principal, id string) error {
	err := m.kill(ctx, p, id, metrics.DeathKilled)
	if errdefs.Is(err, errdefs.KindNotFound) && m.cfg.Archive != nil {
		// Archived by a node that is gone: its objects go (remote.go).
		return m.killArchived(ctx, p, id)
	}
	return err
}

// kill is Kill counting the end of a running or paused sandbox as cause (a
// dead one was counted when it died).
func (m *Manager) kill(ctx context.Context, p tenant.Principal, id, cause string) error {
	m.mu.Lock()
	sb, ok := m.sandboxes[id]
	if ok && p.Can(sb.Owner()) {
		delete(m.sandboxes, id)
	}
	m.mu.Unlock()
	if !ok || !p.Can(sb.Owner()) {
		return notFound(id)
	}
	sb.mu.Lock()
	if sb.resuming {
		// A detached resume (Resume) may hold opMu for minutes: it kills
		// the sandbox as it ends, and this kill answers now — the sandbox
		// is already gone from every list and route of this node.
		sb.killAfterResume = cause
		sb.mu.Unlock()
		m.log.Info("sandbox killed while it resumes: it goes as the resume ends", "id", id)
		return nil
	}
	sb.mu.Unlock()
	// Wait for a pause or resume in flight to finish first.
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	return m.killLocked(ctx, sb, cause)
}

// killLocked is kill's work once sb is out of the manager; sb.opMu is
// held.
func (m *Manager) killLocked(ctx context.Context, sb *Sandbox, cause string) error {
	id := sb.ID
	if err := m.movedAway(ctx, sb); err != nil { // remote.go
		return err
	}
	died := sb.State() == StateDead // it had its killed event when it died
	if !died {
		m.cfg.Metrics.Death(cause)
	}
	m.cleanup(ctx, sb)
	m.log.Info("sandbox killed", "id", id)
	m.lifecycleEvent(id, "killed")
	if !died {
		m.emit(sb, EventKilled, "")
	}
	go func() {
		// Its snapshot layers and agent binary may be unused now.
		m.gcSnapshots(context.WithoutCancel(ctx))
		m.pruneAgents(context.WithoutCancel(ctx)) // agents.go
	}()
	return nil
}

// SetTimeout makes the sandbox expire d from now (E2B: replaces the TTL).
func (m *Manager) SetTimeout(ctx context.Context, p tenant.Principal, id string, d time.Duration) error {
	if d < 0 {
		return errdefs.InvalidArgument("timeout must not be negative (got %v)", d)
	}
	if d > MaxTimeout {
		return errdefs.InvalidArgument("timeout %v is above the maximum of %v", d, MaxTimeout)
	}
	sb, err := m.Lookup(p, id)
	if err != nil {
		return err
	}
	if sb.State() == StateDead {
		return errdefs.Conflict("sandbox %q is dead: %s", id, sb.Err())
	}
	sb.Touch()
	sb.mu.Lock()
	sb.endAt = time.Now().UTC().Add(d)
	sb.mu.Unlock()
	if err := m.persist(ctx, sb); err != nil {
		return err
	}
	m.emit(sb, EventUpdated, "timeout")
	return nil
}

// Extend makes the sandbox live at least d from now (E2B connect: TTL is
// only extended, never shortened).
func (m *Manager) Extend(ctx context.Context, p tenant.Principal, id string, d time.Duration) (*Sandbox, error) {
	sb, err := m.Lookup(p, id)
	if err != nil {
		return nil, err
	}
	if sb.State() == StateDead {
		return nil, errdefs.NotFound("sandbox %q is not running: %s", id, sb.Err())
	}
	if d > MaxTimeout {
		d = MaxTimeout
	}
	sb.Touch()
	sb.mu.Lock()
	if want := time.Now().UTC().Add(d); want.After(sb.endAt) {
		sb.endAt = want
	}
	sb.mu.Unlock()
	return sb, m.persist(ctx, sb)
}

// cleanup removes everything of a sandbox: container, mounts, files, record.
func (m *Manager) cleanup(ctx context.Context, sb *Sandbox) {
	sb.mu.Lock()
	sb.setStateLocked(StateDead)
	sb.mu.Unlock()
	m.releaseHost(ctx, sb)
	sb.persistMu.Lock()
	sb.recordGone = true
	if err := m.cfg.Store.DeleteSandbox(ctx, sb.ID); err != nil {
		m.log.Error("delete sandbox record", "id", sb.ID, "err", err)
	}
	sb.persistMu.Unlock()
}

// releaseHost frees the host resources of a sandbox in the reverse order of
// their creation. Every step tolerates a resource that is already gone.
func (m *Manager) releaseHost(ctx context.Context, sb *Sandbox) {
	sb.mu.Lock()
	conn, ln := sb.conn, sb.listener
	sb.setConnLocked(nil)
	sb.listener = nil
	archived := sb.lc.archived
	sb.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	// An archived sandbox has no container (Archive drops a frozen one),
	// and what its ID names on this host may be another daemon's: the
	// daemon it moved to (remote.go), whose container has the same ID and
	// so the same cgroups, which Destroy removes with what is in them.
	if !archived {
		if err := retryShortOfFDs(func() error { return m.cfg.Runtime.Destroy(dctx, sb.ID) }); err != nil { // fdretry.go
			m.log.Error("destroy container", "id", sb.ID, "err", err)
		}
	}
	if ln != nil {
		ln.Close()
	}
	m.detachNetwork(sb) // after the container: it still sits in the slot
	if sb.layer != nil {
		if err := retryShortOfFDs(sb.layer.Unmount); err != nil {
			m.log.Error("unmount rootfs", "id", sb.ID, "err", err)
		}
	} else if sb.Dir != "" {
		if err := retryShortOfFDs(func() error { return rootfs.UnmountAll(sb.Dir) }); err != nil {
			m.log.Error("unmount rootfs", "id", sb.ID, "err", err)
		}
	}
	if sb.Dir != "" {
		if err := retryShortOfFDs(func() error { return os.RemoveAll(sb.Dir) }); err != nil {
			m.log.Error("remove sandbox dir", "id", sb.ID, "err", err)
		}
		m.releaseTemplate(sb.Dir)
	}
	m.removeArchive(sb)     // lifecycle.go
	m.deleteRemote(ctx, sb) // remote.go
}

// Shutdown stops every running sandbox (SIGTERM of the daemon) and removes
// its record: a stopped daemon leaves nothing running behind. Paused
// sandboxes stay paused, record, checkpoint and mounted writable layer
// included, and the next daemon on this data dir picks them up again.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	all := make([]*Sandbox, 0, len(m.sandboxes))
	for id, sb := range m.sandboxes {
		all = append(all, sb)
		delete(m.sandboxes, id)
	}
	m.mu.Unlock()
	close(m.reaperStop)
	<-m.reaperDone
	<-m.samplerDone
	<-m.keyUsageDone
	m.stopPools(ctx) // pool.go: pooled sandboxes go too
	var wg sync.WaitGroup
	var kept atomic.Int64
	sem := make(chan struct{}, 8)
	for _, sb := range all {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sb.opMu.Lock()
			defer sb.opMu.Unlock()
			if sb.State() == StatePaused {
				kept.Add(1)
				return
			}
			m.cleanup(ctx, sb)
		}()
	}
	wg.Wait()
	m.log.Info("all sandboxes stopped", "count", len(all)-int(kept.Load()), "paused_kept", kept.Load())
	return m.layers.Close()
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(none)"
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "(empty)"
	}
	return s
}
