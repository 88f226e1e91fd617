package sandbox

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/agentclient"
	"github.com/cella-sandbox/cella/internal/channel"
)

// AgentAudit receives what the agents report doing on the API's behalf
// (processes started and ended, files written) for the audit log.
type AgentAudit interface {
	AgentEvent(sandboxID string, ev agentapi.AuditEvent)
	// LastAgentSeq is the newest agent sequence number already kept for a
	// sandbox, so a daemon that restarts does not log events twice.
	LastAgentSeq(sandboxID string) uint64
	// Lifecycle records what the daemon did to a sandbox (created, paused,
	// resumed, policy changed, killed, died).
	Lifecycle(sandboxID, message string)
	// Security records something the daemon refused a sandbox (a hello on
	// its agent socket that was not the agent's: agentchannel.go).
	Security(sandboxID, message string)
}

// lifecycleEvent writes a lifecycle line into the sandbox's audit log.
func (m *Manager) lifecycleEvent(id, format string, args ...any) {
	if m.cfg.AgentAudit != nil {
		m.cfg.AgentAudit.Lifecycle(id, fmt.Sprintf(format, args...))
	}
}

// agentFollow is a sandbox's position in its agent's audit feed.
type agentFollow struct {
	seq     atomic.Uint64
	started atomic.Bool
}

// followAgent copies the agent's audit feed into the audit log for as long
// as conn lives; supervise starts one per channel.
func (m *Manager) followAgent(sb *Sandbox, conn *channel.Conn) {
	if m.cfg.AgentAudit == nil {
		return
	}
	if !sb.follow.started.Swap(true) {
		sb.follow.seq.Store(m.cfg.AgentAudit.LastAgentSeq(sb.ID))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-conn.Closed()
		cancel()
	}()
	agent := agentclient.New(sb.ID, agentclient.On(conn), sb.EnvdAccessToken)
	for ctx.Err() == nil {
		err := agent.Events(ctx, sb.follow.seq.Load(), func(ev agentapi.AuditEvent) error {
			if ev.Seq > sb.follow.seq.Load() {
				sb.follow.seq.Store(ev.Seq)
				m.cfg.AgentAudit.AgentEvent(sb.ID, ev)
			}
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		m.log.Debug("agent audit feed ended; following again", "id", sb.ID, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}
