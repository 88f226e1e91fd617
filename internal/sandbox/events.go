package sandbox

import (
	"maps"
	"time"

	"github.com/cella-sandbox/cella/internal/tenant"
)

// E2B's lifecycle event types (sandbox.lifecycle.*), the `type` of its
// events API and webhooks.
const (
	EventCreated = "sandbox.lifecycle.created"
	EventKilled  = "sandbox.lifecycle.killed"
	EventPaused  = "sandbox.lifecycle.paused"
	EventResumed = "sandbox.lifecycle.resumed"
	EventUpdated = "sandbox.lifecycle.updated"
)

// EventTypes are every lifecycle event type, in E2B's order.
var EventTypes = []string{EventCreated, EventKilled, EventPaused, EventResumed, EventUpdated}

// LifecycleEvent is one change of a sandbox's lifecycle, as the manager
// saw it happen.
type LifecycleEvent struct {
	Type       string
	Time       time.Time
	SandboxID  string
	TemplateID string
	Owner      tenant.Owner
	Metadata   map[string]string
	// Execution is set on killed and paused: the run that ended.
	Execution *Execution
	// Detail is what changed, for updated ("timeout", "network").
	Detail string
}

// Execution describes the run of a sandbox that a kill or pause ended.
type Execution struct {
	StartedAt time.Time
	CPUs      float64
	MemoryMB  int64
	Duration  time.Duration
}

// EventSink receives lifecycle events. SandboxEvent is called on the
// lifecycle operation's goroutine after the change is made and must not
// block (queue and return).
type EventSink interface {
	SandboxEvent(LifecycleEvent)
}

// emit hands a lifecycle event of sb to the sink.
func (m *Manager) emit(sb *Sandbox, typ, detail string) {
	if m.cfg.Events == nil || sb == nil {
		return
	}
	now := time.Now().UTC()
	ev := LifecycleEvent{Type: typ, Time: now, SandboxID: sb.ID, TemplateID: sb.TemplateID, Owner: sb.Owner(),
		Metadata: maps.Clone(sb.Options.Metadata), Detail: detail}
	if typ == EventKilled || typ == EventPaused {
		ev.Execution = &Execution{StartedAt: sb.StartedAt, CPUs: sb.Options.CPUs, MemoryMB: sb.Options.MemoryMB, Duration: now.Sub(sb.StartedAt)}
	}
	m.cfg.Events.SandboxEvent(ev)
}
