package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
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
	hc := &http.Client{Transport: conn.Transport()}
	for ctx.Err() == nil {
		err := m.readAgentFeed(ctx, hc, sb)
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

func (m *Manager) readAgentFeed(ctx context.Context, hc *http.Client, sb *Sandbox) error {
	u := channel.AgentURL + agentapi.EventsPath + "?after=" + strconv.FormatUint(sb.follow.seq.Load(), 10)
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	if err != nil {
		return err
	}
	req.Header.Set(agentapi.AccessTokenHeader, sb.EnvdAccessToken)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &statusError{code: resp.StatusCode}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev agentapi.AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return err
		}
		if ev.Kind == agentapi.KindKeepalive || ev.Seq <= sb.follow.seq.Load() {
			continue
		}
		sb.follow.seq.Store(ev.Seq)
		m.cfg.AgentAudit.AgentEvent(sb.ID, ev)
	}
	return sc.Err()
}

type statusError struct{ code int }

func (e *statusError) Error() string { return "agent answered " + strconv.Itoa(e.code) }
