package sandbox

// The agent channel's credential and the agent's config file.
//
// A sandbox's root can read anything the sandbox can see and dial the
// daemon's socket, so neither the credential nor a way to replace the
// agent's session may be in its reach:
//
//   - The config file (tokens, env vars) is written into the run dir, which
//     the sandbox mounts read-only, only right before a cold boot, when no
//     process but the agent will run before the agent's hello; once the
//     hello is in, the file goes (retireConfig), keeping a host-only copy
//     that later cold boots start from. A container restored from memory
//     gets no file at all: its agent already knows everything.
//   - After every hello the daemon sends the agent its next credential over
//     the established channel (rotateChannel); the agent holds it only in
//     its memory, which nothing in the sandbox can read (the agent is not
//     dumpable, commands lack CAP_SYS_PTRACE). The record keeps the one
//     sent until the agent is known to have it, so that a daemon crashing
//     in between still takes the agent back.
//   - channel.Listener refuses every hello without a current credential,
//     and any hello at all while the agent's session still answers; each
//     refusal is a security entry in the sandbox's audit log.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/agentclient"
	"github.com/cella-sandbox/cella/internal/channel"
)

// savedConfigName is the host-only copy of a sandbox's agent config (in
// its directory, beside run/, which the sandbox mounts), without a channel
// credential: what a later cold boot of the sandbox starts from.
const savedConfigName = "agent-config.json"

// acceptedTokens are the credentials a hello of sb's agent may carry.
func (s *Sandbox) acceptedTokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.channelTokens)
}

// currentToken is the credential a cold-booted agent gets.
func (s *Sandbox) currentToken() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.channelTokens) == 0 {
		return ""
	}
	return s.channelTokens[0]
}

// listen opens sb's agent socket (replacing a stale one).
func (m *Manager) listen(sb *Sandbox) (*channel.Listener, error) {
	sock := filepath.Join(sb.Dir, "run", agentapi.SocketName)
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("agent channel for %s: %w", sb.ID, err)
	}
	ln, err := channel.Listen(sock, channel.ListenOptions{
		Tokens:   sb.acceptedTokens,
		OnRefuse: func(r channel.Refusal) { m.refusedHello(sb, r) },
	})
	if err != nil {
		return nil, fmt.Errorf("agent channel for %s: %w", sb.ID, err)
	}
	return ln, nil
}

// takeAgent waits for sb's agent to say hello on ln, then retires its
// config and rotates its credential. recorded says whether sb has a record
// to keep the credential in (a sandbox being created or pooled has none
// yet: its first persist writes what rotation left).
func (m *Manager) takeAgent(ctx context.Context, sb *Sandbox, ln *channel.Listener, recorded bool) (*channel.Conn, error) {
	conn, hello, err := m.acceptAgent(ctx, sb, ln)
	if err != nil {
		return nil, err
	}
	m.rotateChannel(ctx, sb, conn, hello.Token, recorded)
	return conn, nil
}

// acceptAgent waits for the agent's hello; from then on the agent has read
// its config, which leaves the sandbox's view.
func (m *Manager) acceptAgent(ctx context.Context, sb *Sandbox, ln *channel.Listener) (*channel.Conn, channel.Hello, error) {
	conn, hello, err := ln.Accept(ctx)
	if err != nil {
		return nil, hello, err
	}
	if err := m.retireConfig(sb); err != nil {
		m.log.Error("remove the agent's config from the sandbox's view", "id", sb.ID, "err", err)
	}
	return conn, hello, nil
}

// rotateChannel gives the agent, which said hello with used, the
// credential of its next hello. Failing is not fatal: the session stands,
// and the next hello may carry either credential.
func (m *Manager) rotateChannel(ctx context.Context, sb *Sandbox, conn *channel.Conn, used string, recorded bool) {
	next := newToken()
	sb.mu.Lock()
	sb.channelTokens = []string{used, next}
	sb.mu.Unlock()
	if recorded {
		// The record knows the next credential before the agent does.
		if err := m.persist(context.WithoutCancel(ctx), sb); err != nil {
			m.log.Error("persist the agent's next channel credential", "id", sb.ID, "err", err)
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	err := agentclient.New(sb.ID, agentclient.On(conn), sb.EnvdAccessToken).SetChannelToken(sctx, next)
	cancel()
	if err != nil {
		m.log.Warn("agent channel credential not rotated; the current one stays valid", "id", sb.ID, "err", err)
		return
	}
	sb.mu.Lock()
	if slices.Equal(sb.channelTokens, []string{used, next}) {
		sb.channelTokens = []string{next}
	}
	sb.mu.Unlock()
	if recorded {
		if err := m.persist(context.WithoutCancel(ctx), sb); err != nil {
			m.log.Error("persist the agent's channel credential", "id", sb.ID, "err", err)
		}
	}
}

// writeAgentConfig keeps cfg as the sandbox's agent config: the host-only
// copy always, and with boot also the file the agent about to start reads,
// carrying the current channel credential.
func (m *Manager) writeAgentConfig(sb *Sandbox, cfg agentapi.Config, boot bool) error {
	cfg.ChannelToken = ""
	if err := agentapi.WriteConfigFile(filepath.Join(sb.Dir, savedConfigName), cfg); err != nil {
		return err
	}
	if !boot {
		return nil
	}
	cfg.ChannelToken = sb.currentToken()
	return agentapi.WriteConfig(filepath.Join(sb.Dir, "run"), cfg)
}

// bootConfig writes the config of a cold boot of an existing sandbox (a
// resume without memory) from its host-only copy.
func (m *Manager) bootConfig(sb *Sandbox) error {
	cfg, err := agentapi.ReadConfigFile(filepath.Join(sb.Dir, savedConfigName))
	if errors.Is(err, os.ErrNotExist) {
		// Paused by a daemon that kept the config in the run dir only.
		cfg, err = agentapi.ReadConfig(filepath.Join(sb.Dir, "run"))
	}
	if err != nil {
		return fmt.Errorf("agent config of %s: %w", sb.ID, err)
	}
	cfg.SandboxID, cfg.AccessToken = sb.ID, sb.EnvdAccessToken
	return m.writeAgentConfig(sb, cfg, true)
}

// retireConfig removes the agent's config from the run dir once the agent
// has read it. A sandbox made before the host-only copy existed gets its
// copy from the file first.
func (m *Manager) retireConfig(sb *Sandbox) error {
	runCfg := filepath.Join(sb.Dir, "run", agentapi.ConfigName)
	if _, err := os.Stat(filepath.Join(sb.Dir, savedConfigName)); errors.Is(err, os.ErrNotExist) {
		if cfg, err := agentapi.ReadConfig(filepath.Join(sb.Dir, "run")); err == nil {
			if err := m.writeAgentConfig(sb, cfg, false); err != nil {
				return err
			}
		}
	}
	if err := os.Remove(runCfg); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// refusalLog bounds the audit entries of refused hellos, so a loop of
// them inside a sandbox cannot flood its log: a burst of refusalBurst, then
// one a second, each counting those left out since the one before.
type refusalLog struct {
	mu      sync.Mutex
	limiter *rate.Limiter
	skipped int
}

const refusalBurst = 10

// refusedHello records a connection to sb's socket that was not taken as
// its agent: someone inside the sandbox tried to pass for it (or the agent
// was frozen between connecting and saying hello).
func (m *Manager) refusedHello(sb *Sandbox, r channel.Refusal) {
	rl := &sb.refusals
	rl.mu.Lock()
	if rl.limiter == nil {
		rl.limiter = rate.NewLimiter(rate.Every(time.Second), refusalBurst)
	}
	if !rl.limiter.Allow() {
		rl.skipped++
		rl.mu.Unlock()
		return
	}
	skipped := rl.skipped
	rl.skipped = 0
	rl.mu.Unlock()
	msg := fmt.Sprintf("agent channel: refused a connection to the agent's socket (%s); it claimed pid %d, sandbox %q, version %q",
		r.Reason, r.Hello.PID, r.Hello.SandboxID, r.Hello.Version)
	if skipped > 0 {
		msg += fmt.Sprintf("; %d more refused since the previous entry", skipped)
	}
	m.log.Warn("refused a connection to a sandbox's agent socket", "id", sb.ID, "reason", r.Reason, "claimed_pid", r.Hello.PID, "skipped", skipped)
	if m.cfg.AgentAudit != nil {
		m.cfg.AgentAudit.Security(sb.ID, msg)
	}
}
