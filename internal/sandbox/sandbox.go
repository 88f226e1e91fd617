// Package sandbox owns the lifecycle of sandboxes: it turns a create request
// into a mounted root filesystem, a running container with the agent as PID 1
// and a live agent channel, keeps the durable record in the store, expires
// sandboxes when their time is up, and after a crash removes whatever the
// host still holds that no record explains.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/agentclient"
	"github.com/cella-sandbox/cella/internal/channel"
	"github.com/cella-sandbox/cella/internal/rootfs"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// States a sandbox can be in.
const (
	StateRunning = "running"
	// StatePaused is a sandbox stopped by Pause: its writable layer stays
	// mounted and, depending on PauseMode, its memory is in a checkpoint
	// image, frozen in RAM, or gone (filesystem only).
	StatePaused = "paused"
	// StateDead is a sandbox whose container ended without being killed
	// through cella (crash, host OOM); Error says why.
	StateDead = "dead"
)

// Sandbox is one sandbox. Its exported fields are fixed at creation;
// the mutable ones are read through methods.
type Sandbox struct {
	ID              string
	TemplateID      string
	Runtime         string
	Options         Options
	StartedAt       time.Time
	EnvdAccessToken string
	Dir             string

	layer *rootfs.Layer

	// opMu serializes lifecycle transitions (pause, resume, kill).
	opMu sync.Mutex

	mu    sync.Mutex
	state string
	// resuming says a resume detached from its caller (on a node with an
	// archive) holds opMu; killAfterResume is the cause of a kill that
	// came meanwhile, which the resume carries out as it ends.
	resuming        bool
	killAfterResume string
	endAt           time.Time
	err             string
	conn            *channel.Conn
	listener        *channel.Listener
	// connChanged is closed (and dropped) whenever conn or state changes:
	// what WaitConn waits on. Made by the first waiter.
	connChanged chan struct{}
	pauseMode   string // PauseCheckpoint, PauseFrozen or PauseStopped while paused
	// gen counts channel supervisions: a pause bumps it so that the
	// supervisor of the running sandbox stands down instead of taking the
	// channel's end for a death.
	gen uint64
	// channelTokens are the credentials a hello of the agent may carry,
	// the current one first: it, and while a rotation is unconfirmed the
	// one sent (agentchannel.go).
	channelTokens []string
	// persistMu orders the record's writes: each writes the state of its
	// moment, and none after the record was deleted (recordGone).
	persistMu  sync.Mutex
	recordGone bool       // guarded by persistMu
	refusals   refusalLog // refused hellos on its socket (agentchannel.go)

	lc lifecycleState // idle clock, pausedAt, archived (lifecycle.go)

	// agent is the SHA-256 of the agent binary its container binds
	// (agents.go); guarded by mu.
	agent string

	follow agentFollow // position in the agent's audit feed (agentaudit.go)
	net    *sandboxNet // its network slot while it runs (network.go); guarded by mu

	metrics metricsRing // resource samples (metrics.go); has its own mu
}

// How a paused sandbox keeps its state.
const (
	// PauseCheckpoint: processes and memory saved to <dir>/checkpoint by the
	// runtime, the container gone; resume restores them.
	PauseCheckpoint = "checkpoint"
	// PauseFrozen: the container's processes frozen in place, memory in RAM
	// (runtimes without memory checkpoints); resume thaws them.
	PauseFrozen = "frozen"
	// PauseStopped: only the filesystem kept; resume boots a fresh container
	// on it (a new agent, no processes).
	PauseStopped = "stopped"
)

// agentHash is the SHA-256 of the agent binary the sandbox runs.
func (s *Sandbox) agentHash() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.agent
}

// Owner is who the sandbox belongs to.
func (s *Sandbox) Owner() tenant.Owner { return s.Options.Owner() }

// State returns the current state.
func (s *Sandbox) State() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// EndAt returns when the sandbox expires.
func (s *Sandbox) EndAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endAt
}

// Err returns why a dead sandbox died.
func (s *Sandbox) Err() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// currentConn returns the agent channel, or nil when the sandbox is not
// running.
func (s *Sandbox) currentConn() *channel.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StateRunning {
		return nil
	}
	return s.conn
}

// WaitConn returns the agent's live channel connection. While the sandbox
// runs without one (its agent is re-dialing: a daemon restart, a snapshot,
// a redial after a broken session) it waits for the supervisor to take the
// next, until ctx ends; once the sandbox is not running it fails at once.
// Nothing polls: every change of the connection or the state wakes it.
func (s *Sandbox) WaitConn(ctx context.Context) (*channel.Conn, error) {
	for {
		s.mu.Lock()
		state, conn := s.state, s.conn
		if state != StateRunning {
			err := fmt.Errorf("sandbox %s is %s: %s", s.ID, state, s.err)
			s.mu.Unlock()
			return nil, err
		}
		if conn != nil && !conn.IsClosed() {
			s.mu.Unlock()
			return conn, nil
		}
		if s.connChanged == nil {
			s.connChanged = make(chan struct{})
		}
		changed := s.connChanged
		s.mu.Unlock()
		// A connection that closed is replaced by the supervisor's next
		// accept (setConnLocked), which is what wakes us.
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// setConn makes c the agent's connection and wakes WaitConn.
func (s *Sandbox) setConn(c *channel.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setConnLocked(c)
}

// setConnLocked makes c the agent's connection and wakes WaitConn.
func (s *Sandbox) setConnLocked(c *channel.Conn) {
	s.conn = c
	s.changedLocked()
}

// setStateLocked moves the sandbox to state and wakes WaitConn.
func (s *Sandbox) setStateLocked(state string) {
	s.state = state
	s.changedLocked()
}

func (s *Sandbox) changedLocked() {
	if s.connChanged != nil {
		close(s.connChanged)
		s.connChanged = nil
	}
}

// Agent is the daemon's client of the sandbox's agent: over its current
// channel connection (WaitConn), with its envd access token.
func (s *Sandbox) Agent() *agentclient.Client {
	return agentclient.New(s.ID, s, s.EnvdAccessToken)
}

// Info is a snapshot of a sandbox for the API.
type Info struct {
	ID              string
	TemplateID      string
	Runtime         string
	State           string
	Error           string
	StartedAt       time.Time
	EndAt           time.Time
	Options         Options
	EnvdAccessToken string
	DiskUsedBytes   int64
	PauseMode       string // set while paused
	Lifecycle       LifecycleInfo
}

// Info returns a consistent snapshot.
func (s *Sandbox) Info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := Info{
		ID: s.ID, TemplateID: s.TemplateID, Runtime: s.Runtime, State: s.state, Error: s.err,
		StartedAt: s.StartedAt, EndAt: s.endAt, Options: s.Options, EnvdAccessToken: s.EnvdAccessToken,
		PauseMode: s.pauseMode,
	}
	in.Lifecycle = s.lifecycleInfoLocked()
	if s.layer != nil {
		if used, _, err := s.layer.Usage(); err == nil {
			in.DiskUsedBytes = used
		}
	}
	return in
}

func newToken() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
