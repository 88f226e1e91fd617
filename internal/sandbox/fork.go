package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/agentclient"
	"github.com/cella-sandbox/cella/internal/channel"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// MaxForkCount bounds one fork request.
const MaxForkCount = 32

// ForkParallel is how many forks restore at once: each restore is mostly
// one runsc process loading kernel state on one core. (cella bench state
// restores its raw floor as many at a time.)
const ForkParallel = 4

// ForkResult is one fork: a sandbox or why it failed.
type ForkResult struct {
	Sandbox *Sandbox
	Err     error
}

// Fork snapshots a running sandbox (memory and files; it keeps running) and
// starts count sandboxes from that state. Each fork gets its own ID, tokens
// and writable layer over the shared snapshot layer; under gVisor each
// restores the original's processes. timeout 0 means the default TTL. The
// snapshot is hidden and goes away with the last fork. The forks belong to
// p and have only p's rights (restrictTo).
func (m *Manager) Fork(ctx context.Context, p tenant.Principal, id string, count int, timeout time.Duration) ([]ForkResult, error) {
	if count < 1 || count > MaxForkCount {
		return nil, errdefs.InvalidArgument("count must be between 1 and %d (got %d)", MaxForkCount, count)
	}
	if timeout < 0 || timeout > MaxTimeout {
		return nil, errdefs.InvalidArgument("timeout must be between 0 and %v (got %v)", MaxTimeout, timeout)
	}
	sb, err := m.Lookup(p, id)
	if err != nil {
		return nil, err
	}
	// Refuse before the snapshot when the forks could not be made anyway:
	// beyond p's rights, or its quota (all count forks or none).
	t0 := time.Now()
	forkOpts, _, err := restrictTo(p, sb.Info().Options, m.memorySnapshots())
	if err != nil {
		return nil, err
	}
	res, err := m.reserve(ctx, forkOpts, count) // quota.go
	if err != nil {
		return nil, err
	}
	defer res.release()
	ctx = withReservation(ctx, res)
	sn, err := m.snapshot(ctx, p, id, "", true, "")
	if err != nil {
		return nil, err
	}
	row, err := m.cfg.Store.GetSnapshot(ctx, "", sn.ID)
	if err != nil {
		return nil, err
	}
	var rec snapshotRecord
	if err := json.Unmarshal(row.Record, &rec); err != nil {
		return nil, err
	}
	opts := rec.Options
	opts.Timeout = timeout
	if timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	out := make([]ForkResult, count)
	var wg sync.WaitGroup
	sem := make(chan struct{}, ForkParallel)
	for i := range out {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sb, err := m.fromSnapshot(ctx, p, opts, row, rec, false)
			out[i] = ForkResult{Sandbox: sb, Err: err}
		}()
	}
	wg.Wait()
	// The forks hold the layers now; the hidden record is not needed.
	if err := m.cfg.Store.DeleteSnapshot(context.WithoutCancel(ctx), sn.ID); err != nil {
		m.log.Warn("drop fork snapshot record", "snapshot", sn.ID, "err", err)
	}
	m.gcSnapshots(context.WithoutCancel(ctx))
	m.cfg.Metrics.Fork(sb.TemplateID, time.Since(t0))
	return out, nil
}

// CreateFromSnapshot is Create when the template ID names a snapshot: the
// sandbox starts from the snapshot's state with the request's timeout,
// metadata, env vars and lifecycle, and the snapshot's resources, owned by
// p with p's rights (restrictTo).
func (m *Manager) createFromSnapshot(ctx context.Context, p tenant.Principal, req Options, row store.Snapshot, rec snapshotRecord) (*Sandbox, error) {
	opts := rec.Options
	opts.Timeout = req.Timeout
	opts.Metadata = req.Metadata
	opts.EnvVars = maps.Clone(opts.EnvVars)
	if opts.EnvVars == nil {
		opts.EnvVars = map[string]string{}
	}
	maps.Copy(opts.EnvVars, req.EnvVars)
	opts.AutoPause, opts.AutoPauseMemory, opts.AutoResume = req.AutoPause, req.AutoPauseMemory, req.AutoResume
	opts.Lifecycle = req.Lifecycle
	opts.APIKeyID, opts.TeamID = p.Key, p.Team
	res, err := m.reserve(ctx, opts, 1) // quota.go
	if err != nil {
		return nil, err
	}
	defer res.release()
	return m.fromSnapshot(withReservation(ctx, res), p, opts, row, rec, true)
}

// memorySnapshots says whether this daemon's snapshots hold memory.
func (m *Manager) memorySnapshots() bool {
	_, ok := m.cfg.Runtime.(runtime.Snapshotter)
	return ok && m.cfg.Runtime.Capabilities().MemoryCheckpoint
}

func (m *Manager) fromSnapshot(ctx context.Context, p tenant.Principal, opts Options, row store.Snapshot, rec snapshotRecord, named bool) (*Sandbox, error) {
	rt := m.cfg.Runtime
	snap, memory := rt.(runtime.Snapshotter)
	memory = memory && rec.Memory && rec.Runtime == rt.Name()
	opts, dropped, err := restrictTo(p, opts, memory) // rights.go
	if err != nil {
		return nil, err
	}
	if err := opts.Normalize(m.cfg.Maxima); err != nil {
		return nil, err
	}
	releaseVolumes, err := m.holdVolumes(ctx, p, &opts) // the original's volumes, if p may use them
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
	// The image the snapshot was taken on, not what its name says now.
	tpl, err := m.templateOf(ctx, m.snapshotDir(row.ID), opts.TemplateID)
	if err != nil {
		return nil, err
	}

	sb := &Sandbox{
		ID:              store.NewID(),
		TemplateID:      opts.TemplateID,
		Runtime:         rt.Name(),
		Options:         opts,
		StartedAt:       time.Now().UTC(),
		EnvdAccessToken: newToken(),
		channelTokens:   []string{newToken()},
		state:           StateRunning,
	}
	if memory {
		// The restored agent still holds the original's config and dials
		// with the original's channel credential as it was at the
		// checkpoint; it learns its new identity via /init, and its own
		// credential at once (agentchannel.go).
		sb.channelTokens = rec.tokens()
	}
	sb.endAt = sb.StartedAt.Add(opts.Timeout)
	sb.Dir = filepath.Join(sandboxesDir(m.cfg.DataDir), sb.ID)

	fail := func(err error) (*Sandbox, error) {
		m.cleanup(context.WithoutCancel(ctx), sb)
		return nil, err
	}
	bundleDir := filepath.Join(sb.Dir, "bundle")
	for _, d := range []string{sb.Dir, bundleDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fail(fmt.Errorf("create dirs for %s: %w", sb.ID, err))
		}
	}
	if _, err := m.openRunDir(sb); err != nil { // rundir.go
		return fail(err)
	}
	// Claim the layers before mounting them, under the GC's lock.
	snapMu.Lock()
	tplLayers, err := m.cfg.Templates.Acquire(sb.Dir, tpl)
	var lowers []string
	if err == nil {
		lowers, err = m.layersOf(rec, tplLayers)
	}
	if err == nil {
		var b []byte
		b, err = json.Marshal(origin{SnapshotID: row.ID, Layers: rec.Layers, MemoryRestored: memory})
		if err == nil {
			err = os.WriteFile(filepath.Join(sb.Dir, originFile), b, 0o600)
		}
	}
	snapMu.Unlock()
	if err != nil {
		return fail(fmt.Errorf("sandbox from snapshot %s: %w", row.ID, err))
	}
	layer, err := m.layers.MountStack(lowers, sb.Dir, mib(opts.DiskMB))
	if err != nil {
		return fail(fmt.Errorf("create rootfs for %s: %w", sb.ID, err))
	}
	sb.layer = layer
	ln, err := m.listen(sb) // agentchannel.go
	if err != nil {
		return fail(err)
	}
	sb.listener = ln
	// A memory restore resumes processes at once, the original's root
	// shells included: its agent needs no config file, so none is there for
	// them to read. A cold boot reads one before anything else runs.
	if err := m.writeAgentConfig(sb, m.agentConfig(sb, tpl), !memory); err != nil {
		return fail(err)
	}
	if _, err := m.attachNetwork(ctx, sb); err != nil { // network.go
		return fail(err)
	}
	// A memory image restores with the agent it was saved with; a cold
	// boot takes the current one (agents.go).
	var agent string
	if memory {
		hash := m.agentOf(rec.Agent)
		var release func()
		if agent, release, err = m.holdAgent(hash); err != nil {
			return fail(fmt.Errorf("sandbox from snapshot %s: %w", row.ID, err))
		}
		defer release() // once sb is in the table, or gone
		sb.mu.Lock()
		sb.agent = hash
		sb.mu.Unlock()
	} else if agent, err = m.bootAgent(sb); err != nil {
		return fail(fmt.Errorf("sandbox from snapshot %s: %w", row.ID, err))
	}
	spec := m.spec(sb, agent)
	if memory {
		err = snap.RestoreFrom(ctx, spec, m.memoryDir(row.ID))
	} else {
		err = rt.Start(ctx, spec)
	}
	if err != nil {
		return fail(fmt.Errorf("start %s container for %s from snapshot %s: %w", rt.Name(), sb.ID, row.ID, err))
	}
	actx, cancel := context.WithTimeout(ctx, m.cfg.AgentTimeout)
	conn, err := m.takeAgent(actx, sb, ln, false)
	cancel()
	if err != nil {
		return fail(fmt.Errorf("sandbox %s: agent did not answer within %v (%w); agent log: %s",
			sb.ID, m.cfg.AgentTimeout, err, tail(spec.LogPath, 800)))
	}
	sb.setConn(conn)
	if memory {
		if err := reinitAgent(ctx, conn, rec.EnvdAccessToken, sb, opts.EnvVars); err != nil {
			return fail(fmt.Errorf("sandbox %s from snapshot %s: %w", sb.ID, row.ID, err))
		}
	} else if err := m.sendSecretEnv(ctx, sb, conn); err != nil { // secretenv.go
		return fail(err)
	}
	if err := m.persistNew(ctx, sb); err != nil {
		return fail(err)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return fail(errdefs.Unavailable("daemon is shutting down"))
	}
	m.addLocked(ctx, sb) // quota.go
	m.mu.Unlock()
	go m.supervise(sb, sb.gen)
	m.log.Info("sandbox created from snapshot", "id", sb.ID, "snapshot", row.ID, "memory", memory, "opts", opts.String())
	m.lifecycleEvent(sb.ID, "created from snapshot %s (memory %v): %s; egress %s", row.ID, memory, opts.String(), egressSummary(opts.Egress))
	m.emit(sb, EventCreated, "")
	if len(dropped) > 0 {
		m.lifecycleEvent(sb.ID, "not carried over from snapshot %s (beyond the rights of API key %s): %s", row.ID, p.Key, strings.Join(dropped, "; "))
	}
	return sb, nil
}

// reinitAgent gives a running agent its sandbox's own identity: the envd
// access token (for a restored agent the original's, oldToken, authorizes
// the call), env vars merged into its environment, and sandbox ID.
func reinitAgent(ctx context.Context, conn *channel.Conn, oldToken string, sb *Sandbox, env map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	token, id := sb.EnvdAccessToken, sb.ID
	req := agentapi.InitRequest{AccessToken: &token, EnvVars: env, SandboxID: &id}
	if err := agentclient.New(sb.ID, agentclient.On(conn), oldToken).Init(ctx, req); err != nil {
		return fmt.Errorf("re-init restored agent: %w", err)
	}
	return nil
}

// SnapshotOrigin reports the snapshot a sandbox was made from and whether
// its memory was restored from it ("" when it was not made from one).
func (m *Manager) SnapshotOrigin(sb *Sandbox) (snapshotID string, memoryRestored bool) {
	o, ok := readOrigin(sb.Dir)
	if !ok {
		return "", false
	}
	return o.SnapshotID, o.MemoryRestored
}
