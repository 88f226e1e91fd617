package daemon

import (
	"github.com/cella-sandbox/cella/internal/agent"
	"github.com/cella-sandbox/cella/internal/audit"
)

// agentAudit stores what agents report (sandbox.AgentAudit) in the audit log.
type agentAudit struct{ log *audit.Log }

func (a agentAudit) AgentEvent(sandboxID string, ev agent.AuditEvent) {
	e := audit.Entry{
		Time: ev.Time, SandboxID: sandboxID, Kind: ev.Kind, Source: audit.SourceAgent, Seq: ev.Seq,
		PID: ev.PID, Cmd: ev.Cmd, User: ev.User, Cwd: ev.Cwd, Status: ev.Status,
		Path: ev.Path, Size: ev.Size, Error: ev.Error,
	}
	if ev.ExitCode != nil {
		code := int(*ev.ExitCode)
		e.ExitCode = &code
	}
	a.log.Append(e)
}

func (a agentAudit) LastAgentSeq(sandboxID string) uint64 {
	seq, _ := a.log.LastSeq(sandboxID, audit.SourceAgent)
	return seq
}
