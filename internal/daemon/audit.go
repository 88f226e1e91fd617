package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/audit"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

// agentAudit stores what agents report (sandbox.AgentAudit) in the audit log.
type agentAudit struct{ log *audit.Log }

func (a agentAudit) AgentEvent(sandboxID string, ev agentapi.AuditEvent) {
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

func (a agentAudit) Lifecycle(sandboxID, message string) {
	a.log.Append(audit.Entry{SandboxID: sandboxID, Kind: audit.KindLifecycle, Source: audit.SourceDaemon, Message: message})
}

func (a agentAudit) Security(sandboxID, message string) {
	a.log.Append(audit.Entry{SandboxID: sandboxID, Kind: audit.KindSecurity, Source: audit.SourceDaemon, Message: message})
}

func (a agentAudit) LastAgentSeq(sandboxID string) uint64 {
	seq, _ := a.log.LastSeq(sandboxID, audit.SourceAgent)
	return seq
}

// pruneAuditLogs removes, at start and every few hours, the audit logs of
// sandboxes that are gone and quiet for longer than retention.
func pruneAuditLogs(al *audit.Log, mgr *sandbox.Manager, retention time.Duration, log *slog.Logger) (stop func()) {
	if retention <= 0 {
		retention = 7 * 24 * time.Hour
	}
	done := make(chan struct{})
	keep := func(id string) bool { return mgr.Tracked(id) }
	prune := func() {
		if n, err := al.Prune(retention, keep); err != nil {
			log.Warn("prune audit logs", "err", err)
		} else if n > 0 {
			log.Info("pruned audit logs of sandboxes gone", "count", n, "retention", retention)
		}
		// Who owned a sandbox is kept for as long as its log is.
		if err := mgr.PruneOwners(context.Background(), al.Exists); err != nil {
			log.Warn("prune sandbox owners", "err", err)
		}
	}
	go func() {
		prune()
		t := time.NewTicker(6 * time.Hour)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				prune()
			}
		}
	}()
	return func() { close(done) }
}
