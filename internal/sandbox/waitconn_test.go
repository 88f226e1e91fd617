package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/channel"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// agentConns makes real channel connections (an agent's session dialed in
// this process) for the tests of WaitConn.
type agentConns struct {
	t    *testing.T
	sock string
	ln   *channel.Listener
}

func newAgentConns(t *testing.T) *agentConns {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := channel.Listen(sock, channel.ListenOptions{Tokens: func() []string { return []string{"tok"} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &agentConns{t: t, sock: sock, ln: ln}
}

// next dials as the agent and returns the daemon's end; closing the
// returned session ends it.
func (a *agentConns) next() *channel.Conn {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := channel.DialDaemon(ctx, a.sock, channel.Hello{Token: "tok"})
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { sess.Close() })
	c, _, err := a.ln.Accept(ctx)
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { c.Close() })
	return c
}

type waited struct {
	c   *channel.Conn
	err error
}

func waitConn(ctx context.Context, sb *Sandbox) <-chan waited {
	out := make(chan waited, 1)
	go func() { c, err := sb.WaitConn(ctx); out <- waited{c, err} }()
	return out
}

// TestWaitConnSignals: WaitConn returns the live connection at once, waits
// while there is none or it closed, and is woken by the next connection or
// by the state leaving running, never by a clock. Without the wake-ups each
// wait below lasts until the test's deadline and fails.
func TestWaitConnSignals(t *testing.T) {
	a := newAgentConns(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sb := &Sandbox{ID: "sbwait", state: StateRunning}

	// No connection yet: the wait ends with the supervisor's next one.
	w := waitConn(ctx, sb)
	c1 := a.next()
	sb.setConn(c1)
	if got := <-w; got.err != nil || got.c != c1 {
		t.Fatalf("first connection: %+v", got)
	}
	// Live: at once.
	if c, err := sb.WaitConn(ctx); err != nil || c != c1 {
		t.Fatalf("live connection: %v %v", c, err)
	}
	// Closed (the agent is re-dialing): the wait skips it for the next.
	c1.Close()
	<-c1.Closed()
	w = waitConn(ctx, sb)
	c2 := a.next()
	sb.mu.Lock()
	sb.setConnLocked(c2)
	sb.mu.Unlock()
	if got := <-w; got.err != nil || got.c != c2 {
		t.Fatalf("redialed connection: %+v", got)
	}
	// A pause: every waiter learns that there will be none.
	sb.mu.Lock()
	sb.setConnLocked(nil)
	sb.mu.Unlock()
	w1, w2 := waitConn(ctx, sb), waitConn(ctx, sb)
	sb.mu.Lock()
	sb.setStateLocked(StatePaused)
	sb.mu.Unlock()
	for _, w := range []<-chan waited{w1, w2} {
		if got := <-w; got.err == nil || !strings.Contains(got.err.Error(), "sandbox sbwait is paused") {
			t.Fatalf("waiter at pause: %+v", got)
		}
	}
	// Not running: no wait at all.
	if _, err := sb.WaitConn(ctx); err == nil {
		t.Fatal("WaitConn of a paused sandbox succeeded")
	}
	// The caller's context bounds the wait.
	sb.mu.Lock()
	sb.setStateLocked(StateRunning)
	sb.mu.Unlock()
	cctx, ccancel := context.WithCancel(ctx)
	w = waitConn(cctx, sb)
	ccancel()
	if got := <-w; !errors.Is(got.err, context.Canceled) {
		t.Fatalf("cancelled wait: %+v", got)
	}
	// The agent client waits the redial grace, then says Unavailable.
	if _, err := sb.Agent().Conn(ctx); !errdefs.Is(err, errdefs.KindUnavailable) || !strings.Contains(err.Error(), "the agent of sandbox sbwait is not connected") {
		t.Fatalf("agent client without a connection: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the test's deadline ended a wait")
	}
}
