package sandbox

import (
	"context"
	"time"
)

// deadRetention is how long a dead sandbox's record stays readable.
const deadRetention = time.Hour

// reaper kills sandboxes whose time is up and forgets old dead ones.
func (m *Manager) reaper() {
	defer close(m.reaperDone)
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-m.reaperStop:
			return
		case now := <-t.C:
			for _, sb := range m.List() {
				sb.mu.Lock()
				state, endAt := sb.state, sb.endAt
				sb.mu.Unlock()
				expired := state == StateRunning && now.After(endAt)
				stale := state == StateDead && now.After(endAt.Add(deadRetention))
				if !expired && !stale {
					continue
				}
				if expired {
					m.log.Info("sandbox timed out", "id", sb.ID, "end_at", endAt)
				}
				if err := m.Kill(context.Background(), sb.ID); err != nil {
					m.log.Debug("reap sandbox", "id", sb.ID, "err", err)
				}
			}
		}
	}
}
