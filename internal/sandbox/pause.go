package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/metrics"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// checkpointDir is where a paused sandbox's memory image lives.
func checkpointDir(sb *Sandbox) string { return filepath.Join(sb.Dir, "checkpoint") }

// Pause stops a running sandbox and keeps it for a later Resume. With
// keepMemory its processes survive: the runtime checkpoints them to disk
// (gVisor: the container is gone and its memory freed) or, if it cannot,
// freezes them in RAM (namespaces). Without keepMemory only the filesystem
// is kept and resume boots a fresh container on it. The writable layer stays
// mounted either way (an image on disk). A second pause is a Conflict.
func (m *Manager) Pause(ctx context.Context, p tenant.Principal, id string, keepMemory bool) error {
	sb, err := m.Lookup(p, id)
	if err != nil {
		return err
	}
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	if !m.isTracked(sb) {
		return errdefs.NotFound("sandbox %q not found", id)
	}
	mode := PauseStopped
	if keepMemory {
		mode = PauseFrozen
		if m.cfg.Runtime.Capabilities().MemoryCheckpoint {
			mode = PauseCheckpoint
		}
	}

	sb.mu.Lock()
	switch sb.state {
	case StatePaused:
		sb.mu.Unlock()
		return errdefs.Conflict("sandbox %q is already paused", id)
	case StateDead:
		sb.mu.Unlock()
		return errdefs.Conflict("sandbox %q is dead: %s", id, sb.Err())
	}
	// From here the running supervision stands down: the channel is about
	// to end, and that is not a death.
	sb.gen++
	conn, ln := sb.conn, sb.listener
	sb.mu.Unlock()

	start := time.Now()
	var perr error
	switch mode {
	case PauseCheckpoint:
		dir := checkpointDir(sb)
		if err := os.RemoveAll(dir); err != nil {
			perr = err
		} else if err := os.Mkdir(dir, 0o700); err != nil {
			perr = err
		} else {
			perr = m.cfg.Runtime.Checkpoint(ctx, sb.ID, dir)
		}
	case PauseFrozen:
		perr = m.cfg.Runtime.Freeze(ctx, sb.ID)
	case PauseStopped:
		perr = m.cfg.Runtime.Destroy(ctx, sb.ID)
	}
	if perr != nil {
		m.pauseFailed(sb, mode, perr)
		return fmt.Errorf("pause sandbox %s: %w", id, perr)
	}
	// Nothing writes to the layer any more: put it on disk (its overlay
	// skips the sandbox's own syncs), so that the paused sandbox's files
	// survive a host crash.
	if err := sb.layer.Sync(); err != nil {
		m.log.Warn("sync the paused sandbox's layer", "id", id, "err", err)
	}
	// The agent (frozen, checkpointed or gone) redials when it runs again:
	// a restored or thawed agent finds its old connection broken at once.
	if conn != nil {
		conn.Close()
	}
	if mode != PauseFrozen {
		m.detachNetwork(sb) // network.go: the container is gone
	}
	if ln != nil {
		ln.Close()
	}
	sb.mu.Lock()
	sb.setConnLocked(nil)
	sb.listener = nil
	sb.setStateLocked(StatePaused)
	sb.pauseMode = mode
	sb.markPausedLocked() // lifecycle.go
	sb.mu.Unlock()
	sb.metricsBarrier() // metrics.go: a paused sandbox gets no new samples
	if err := m.persist(context.WithoutCancel(ctx), sb); err != nil {
		return err
	}
	m.cfg.Metrics.Pause(sb.TemplateID, time.Since(start))
	m.log.Info("sandbox paused", "id", id, "mode", mode, "took", time.Since(start).Round(time.Millisecond))
	m.lifecycleEvent(id, "paused (%s)", mode)
	m.emit(sb, EventPaused, mode)
	if m.cfg.Archive != nil && mode != PauseFrozen {
		// With an archive store the paused state lives there, so that any
		// node can resume it (remote.go). A failed upload leaves the
		// sandbox paused here, whole.
		if err := m.archiveLocked(context.WithoutCancel(ctx), sb); err != nil { // lifecycle.go
			m.log.Error("paused sandbox not archived: it resumes on this node only", "id", id, "err", err)
		}
	}
	return nil
}

// pauseFailed puts a sandbox whose pause failed back to running if its
// container still runs, and marks it dead otherwise.
func (m *Manager) pauseFailed(sb *Sandbox, mode string, cause error) {
	st, err := m.cfg.Runtime.State(context.Background(), sb.ID)
	sb.mu.Lock()
	if err == nil && st == runtime.StatusRunning {
		sb.gen++
		gen := sb.gen
		sb.mu.Unlock()
		m.log.Warn("pause failed; the sandbox goes on running", "id", sb.ID, "mode", mode, "err", cause)
		go m.supervise(sb, gen)
		return
	}
	sb.gen++
	gen := sb.gen
	sb.mu.Unlock()
	m.markDead(sb, gen, death{metrics.DeathCrash, fmt.Sprintf("pause (%s) failed and the container is gone: %v", mode, cause)})
}

// Resume brings a paused sandbox back and returns once its agent answers;
// resumed is false when it was running already. keepMemory=false discards
// saved processes and boots fresh on the kept filesystem (E2B's connect
// with "memory": false). A sandbox whose resume fails stays paused when
// what it was paused with is still there.
func (m *Manager) Resume(ctx context.Context, p tenant.Principal, id string, keepMemory bool) (resumed bool, err error) {
	if m.cfg.Archive != nil {
		// A resume here may claim the sandbox (importArchived, unarchive:
		// the cluster's record moves to this node, its old node forgets
		// its copy), and from then on only this node can finish it: one
		// ended halfway by a caller that went away left it nowhere, its
		// objects behind and its old node to record it again. So it runs
		// to its end whatever the caller does, bounded.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), claimedResumeTimeout)
		defer cancel()
	}
	sb, err := m.Lookup(p, id)
	if errdefs.Is(err, errdefs.KindNotFound) && m.cfg.Archive != nil {
		// Archived by another node, or by this one before it forgot it.
		sb, err = m.importArchived(ctx, p, id) // remote.go
	}
	if err != nil {
		return false, err
	}
	sb.opMu.Lock()
	defer sb.opMu.Unlock()
	if m.cfg.Archive != nil {
		defer m.endResume(ctx, sb) // before opMu is unlocked
		sb.mu.Lock()
		sb.resuming = true
		sb.mu.Unlock()
	}
	if !m.isTracked(sb) {
		return false, errdefs.NotFound("sandbox %q not found", id)
	}
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return false, errdefs.Unavailable("daemon is shutting down")
	}
	sb.mu.Lock()
	state, mode := sb.state, sb.pauseMode
	sb.mu.Unlock()
	switch state {
	case StateRunning:
		return false, nil
	case StateDead:
		return false, errdefs.NotFound("sandbox %q is not running: %s", id, sb.Err())
	}
	start := time.Now()
	st := newStepTimer() // manager.go
	defer func() { m.log.Debug("resume steps", append([]any{"id", id, "mode", mode}, st.attrs()...)...) }()
	// A paused sandbox holds no slot of its key's quota: running again
	// takes one (quota.go), bound to it until it is running.
	res, err := m.reserve(ctx, sb.Options, 1)
	if err != nil {
		return false, err
	}
	res.bind(sb.ID)
	defer res.release()
	st.step("quota")
	if err := m.unarchive(ctx, sb); err != nil { // lifecycle.go
		return false, err
	}
	st.step("unarchive")
	if sb.layer == nil {
		return false, fmt.Errorf("sandbox %q has no root filesystem to resume on", id)
	}
	if !keepMemory && mode != PauseStopped {
		if err := m.cfg.Runtime.Destroy(ctx, sb.ID); err != nil {
			return false, fmt.Errorf("resume sandbox %s without memory: %w", id, err)
		}
		_ = os.RemoveAll(checkpointDir(sb))
		mode = m.setPauseMode(ctx, sb, PauseStopped)
	}

	if mode != PauseFrozen {
		// A new container binds the run dir: make it the tmpfs it has to
		// be (an archive or a reboot took it).
		if _, err := m.openRunDir(sb); err != nil { // rundir.go
			return false, fmt.Errorf("resume sandbox %s: %w", id, err)
		}
	}
	if mode == PauseStopped {
		// A cold boot: its agent reads a config (agentchannel.go).
		if err := m.bootConfig(sb); err != nil {
			return false, fmt.Errorf("resume sandbox %s: %w", id, err)
		}
	}
	ln, err := m.listen(sb) // agentchannel.go
	if err != nil {
		return false, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	if mode != PauseFrozen {
		// A restored or rebooted container needs a fresh slot: gVisor
		// consumed the old one's addresses (and gave it back at pause).
		if _, err := m.attachNetwork(ctx, sb); err != nil {
			ln.Close()
			return false, fmt.Errorf("resume sandbox %s: %w", id, err)
		}
	}
	st.step("rundir_listen_network")
	switch mode {
	case PauseCheckpoint:
		// With the agent binary it was checkpointed with (agents.go).
		var agent string
		if agent, err = m.cfg.Agents.Path(sb.agentHash()); err == nil {
			err = m.cfg.Runtime.Restore(ctx, m.spec(sb, agent), checkpointDir(sb))
		}
	case PauseFrozen:
		err = m.cfg.Runtime.Thaw(ctx, sb.ID)
	default:
		// A cold boot: the current agent.
		var agent string
		if agent, err = m.bootAgent(sb); err == nil {
			err = m.cfg.Runtime.Start(ctx, m.spec(sb, agent))
		}
	}
	if err != nil {
		ln.Close()
		if mode != PauseFrozen {
			m.detachNetwork(sb)
		}
		return false, fmt.Errorf("resume sandbox %s (%s): %w", id, mode, err)
	}
	st.step("runtime")
	actx, cancel := context.WithTimeout(ctx, m.cfg.AgentTimeout)
	conn, hello, err := m.acceptAgent(actx, sb, ln) // agentchannel.go
	cancel()
	st.step("agent_hello")
	if err == nil {
		m.rotateChannel(ctx, sb, conn, hello.Token, true)
		st.step("channel_credential")
	}
	if err != nil {
		ln.Close()
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		derr := m.cfg.Runtime.Destroy(dctx, sb.ID)
		dcancel()
		m.detachNetwork(sb)
		if mode == PauseFrozen {
			// Its memory went with the container; the filesystem is left.
			m.setPauseMode(context.WithoutCancel(ctx), sb, PauseStopped)
		}
		return false, errors.Join(fmt.Errorf("resume sandbox %s (%s): the agent did not answer within %v (%w); agent log: %s",
			id, mode, m.cfg.AgentTimeout, err, tail(agentLog(sb), 800)), derr)
	}
	if mode == PauseStopped {
		// A fresh agent: its secret environment comes over the channel.
		if err := m.sendSecretEnv(ctx, sb, conn); err != nil {
			m.log.Error("resumed sandbox without its secret environment variables", "id", sb.ID, "err", err)
		}
	}
	sb.mu.Lock()
	sb.setConnLocked(conn)
	sb.listener = ln
	sb.setStateLocked(StateRunning)
	sb.pauseMode = ""
	sb.markResumedLocked() // lifecycle.go
	sb.gen++
	gen := sb.gen
	sb.mu.Unlock()
	go m.supervise(sb, gen)
	if mode == PauseCheckpoint {
		// In line, not in the background: removing the image of a sandbox
		// holding 100 MiB takes 6-7 ms here, and moved beside the agent's
		// redial it took as long from the resume (cella bench state, three
		// runs each way, on 2 cores the restore keeps busy).
		if err := os.RemoveAll(checkpointDir(sb)); err != nil {
			m.log.Warn("remove checkpoint image", "id", id, "err", err)
		}
	}
	st.step("remove_checkpoint")
	// Running again: an archived copy would be a past state another node
	// could resume (remote.go).
	m.deleteRemote(ctx, sb)
	if err := m.persist(context.WithoutCancel(ctx), sb); err != nil {
		return true, err
	}
	st.step("record")
	m.cfg.Metrics.Resume(sb.TemplateID, time.Since(start))
	m.log.Info("sandbox resumed", "id", id, "mode", mode, "took", time.Since(start).Round(time.Millisecond))
	m.lifecycleEvent(id, "resumed (%s)", mode)
	m.emit(sb, EventResumed, mode)
	return true, nil
}

// endResume ends a detached resume of sb: a kill that came meanwhile
// (kill marked it) is done now, whatever the resume's outcome — running,
// still paused, or its archive left — so nothing of it outlives the kill.
// sb.opMu is held.
func (m *Manager) endResume(ctx context.Context, sb *Sandbox) {
	sb.mu.Lock()
	cause := sb.killAfterResume
	sb.resuming, sb.killAfterResume = false, ""
	sb.mu.Unlock()
	if cause == "" {
		return
	}
	if err := m.killLocked(context.WithoutCancel(ctx), sb, cause); err != nil {
		m.log.Warn("the kill of a sandbox that came while it resumed", "id", sb.ID, "err", err)
	}
}

// claimedResumeTimeout bounds a resume on a node with an archive store,
// which runs detached from its caller (Resume): the archive's download
// and the restore, at most a few GiB.
const claimedResumeTimeout = 10 * time.Minute

func (m *Manager) setPauseMode(ctx context.Context, sb *Sandbox, mode string) string {
	sb.mu.Lock()
	sb.pauseMode = mode
	sb.mu.Unlock()
	if err := m.persist(ctx, sb); err != nil {
		m.log.Error("persist sandbox", "id", sb.ID, "err", err)
	}
	return mode
}

// Connect is E2B's connect: a paused sandbox is resumed (resumed = true),
// and the TTL is extended to at least d from now, never shortened.
func (m *Manager) Connect(ctx context.Context, p tenant.Principal, id string, d time.Duration, keepMemory bool) (sb *Sandbox, resumed bool, err error) {
	resumed, err = m.Resume(ctx, p, id, keepMemory)
	if err != nil {
		return nil, false, err
	}
	sb, err = m.Extend(ctx, p, id, d)
	return sb, resumed, err
}
