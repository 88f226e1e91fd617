package sandbox

import (
	"context"
	"time"

	"github.com/cella-sandbox/cella/internal/metrics"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// deadRetention is how long a dead sandbox's record stays readable.
const deadRetention = time.Hour

// reaper kills sandboxes whose time is up (or pauses them, with autoPause)
// and forgets old dead ones. Paused sandboxes do not expire.
func (m *Manager) reaper() {
	defer close(m.reaperDone)
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-m.reaperStop:
			return
		case now := <-t.C:
			for _, sb := range m.List(tenant.System) {
				if m.lifecycleTick(sb, now) { // lifecycle.go: idle stop, archive, delete
					continue
				}
				sb.mu.Lock()
				state, endAt := sb.state, sb.endAt
				sb.mu.Unlock()
				expired := state == StateRunning && now.After(endAt)
				stale := state == StateDead && now.After(endAt.Add(deadRetention))
				if !expired && !stale {
					continue
				}
				if expired {
					m.log.Info("sandbox timed out", "id", sb.ID, "end_at", endAt, "auto_pause", sb.Options.AutoPause)
					if sb.Options.AutoPause && m.pauseOnTimeout(sb) {
						continue
					}
				}
				if err := m.kill(context.Background(), tenant.System, sb.ID, metrics.DeathTimeout); err != nil {
					m.log.Debug("reap sandbox", "id", sb.ID, "err", err)
				}
			}
		}
	}
}

// pauseOnTimeout pauses an expired autoPause sandbox; false means it could
// not and is to be killed as any expired sandbox.
func (m *Manager) pauseOnTimeout(sb *Sandbox) bool {
	keepMemory := sb.Options.AutoPauseMemory == nil || *sb.Options.AutoPauseMemory
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := m.Pause(ctx, tenant.System, sb.ID, keepMemory)
	if err == nil || sb.State() == StatePaused {
		return true // paused now, by us or by a concurrent API call
	}
	if sb.State() == StateDead {
		return true // the record says why; the reaper forgets it later
	}
	m.log.Error("auto-pause on timeout failed; killing the sandbox", "id", sb.ID, "err", err)
	return false
}
