package channel

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// refusals collects what a Listener refused.
type refusals struct {
	mu  sync.Mutex
	got []Refusal
	new chan struct{}
}

func newRefusals() *refusals { return &refusals{new: make(chan struct{}, 64)} }

func (r *refusals) add(x Refusal) {
	r.mu.Lock()
	r.got = append(r.got, x)
	r.mu.Unlock()
	r.new <- struct{}{}
}

// next waits for the next refusal.
func (r *refusals) next(t *testing.T) Refusal {
	t.Helper()
	select {
	case <-r.new:
	case <-time.After(30 * time.Second):
		t.Fatal("no refusal reported")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[len(r.got)-1]
}

func (r *refusals) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// tokens is a credential set the test can change.
type tokens struct {
	mu  sync.Mutex
	set []string
}

func (k *tokens) get() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.set...)
}
func (k *tokens) put(s ...string) {
	k.mu.Lock()
	k.set = s
	k.mu.Unlock()
}

func listen(t *testing.T, k *tokens, r *refusals) (*Listener, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := Listen(sock, ListenOptions{Tokens: k.get, OnRefuse: r.add})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, sock
}

func dial(t *testing.T, sock, token string, pid int) *AgentSession {
	t.Helper()
	a, err := DialDaemon(context.Background(), sock, Hello{SandboxID: "sbx", Token: token, Version: "test", PID: pid})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func accept(t *testing.T, ln *Listener) (*Conn, Hello) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, h, err := ln.Accept(ctx)
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, h
}

// closedByDaemon waits until the daemon has closed the agent side's session.
func closedByDaemon(t *testing.T, a *AgentSession) {
	t.Helper()
	select {
	case <-a.CloseChan():
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon did not close a refused connection")
	}
}

const tokA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

// TestListenerTakesOnlyTheAgent: a hello without a current credential is
// refused; a hello with one is refused too while the agent's session still
// answers, and taken once it no longer does.
func TestListenerTakesOnlyTheAgent(t *testing.T) {
	k, r := &tokens{set: []string{tokA}}, newRefusals()
	ln, sock := listen(t, k, r)

	bad := dial(t, sock, "guessed", 100)
	closedByDaemon(t, bad)
	if got := r.next(t); got.Reason != RefusedBadToken || got.Hello.PID != 100 || got.Hello.Token != "" {
		t.Fatalf("refusal %+v, want %q with the claimed pid and no token", got, RefusedBadToken)
	}

	agent := dial(t, sock, tokA, 1)
	conn, hello := accept(t, ln)
	if hello.PID != 1 || hello.Token != tokA {
		t.Fatalf("accepted hello %+v", hello)
	}

	// A second hello with the right credential while the agent answers.
	twin := dial(t, sock, tokA, 2)
	closedByDaemon(t, twin)
	if got := r.next(t); got.Reason != RefusedLiveAgent || got.Hello.PID != 2 {
		t.Fatalf("refusal %+v, want %q", got, RefusedLiveAgent)
	}
	if conn.IsClosed() || !conn.Answers(5*time.Second) {
		t.Fatal("the agent's session suffered from the refused twin")
	}

	// The agent's session ends (a checkpoint broke it): its redial is taken.
	agent.Close()
	<-conn.Closed()
	dial(t, sock, tokA, 3)
	if _, hello := accept(t, ln); hello.PID != 3 {
		t.Fatalf("redial hello %+v", hello)
	}
	if n := r.count(); n != 2 {
		t.Fatalf("%d refusals, want 2", n)
	}
}

// TestListenerReplacesDeadSession: a session that no longer answers, though
// not yet seen closed, gives way to the agent's new hello.
func TestListenerReplacesDeadSession(t *testing.T) {
	k, r := &tokens{set: []string{tokA}}, newRefusals()
	ln, sock := listen(t, k, r)
	// A raw connection that says hello and then never answers a ping.
	raw, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write([]byte(`{"token":"` + tokA + `","pid":1}` + "\n")); err != nil {
		t.Fatal(err)
	}
	stale, _ := accept(t, ln)
	dial(t, sock, tokA, 2)
	if _, hello := accept(t, ln); hello.PID != 2 {
		t.Fatalf("hello %+v, want the redial's", hello)
	}
	if !stale.IsClosed() {
		t.Fatal("the dead session was not closed")
	}
	if n := r.count(); n != 0 {
		t.Fatalf("refusals %+v", r.got)
	}
}

// TestListenerRotation: once the credential changes, the old one is
// refused and the new one taken.
func TestListenerRotation(t *testing.T) {
	const tokB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	k, r := &tokens{set: []string{tokA}}, newRefusals()
	ln, sock := listen(t, k, r)
	agent := dial(t, sock, tokA, 1)
	conn, _ := accept(t, ln)
	k.put(tokB)
	agent.Close()
	<-conn.Closed()
	old := dial(t, sock, tokA, 2)
	closedByDaemon(t, old)
	if got := r.next(t); got.Reason != RefusedBadToken {
		t.Fatalf("refusal %+v", got)
	}
	dial(t, sock, tokB, 3)
	if _, hello := accept(t, ln); hello.PID != 3 {
		t.Fatalf("hello %+v", hello)
	}
}

// TestListenerSilentConnections: connections that never say hello are
// refused when their time is up and do not keep the agent out.
func TestListenerSilentConnections(t *testing.T) {
	k, r := &tokens{set: []string{tokA}}, newRefusals()
	ln, sock := listen(t, k, r)
	for range helloReaders + 2 {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	dial(t, sock, tokA, 1)
	if _, hello := accept(t, ln); hello.PID != 1 {
		t.Fatalf("hello %+v", hello)
	}
	for range helloReaders {
		if got := r.next(t); !strings.HasPrefix(got.Reason, RefusedNoHello) {
			t.Fatalf("refusal %+v, want %q", got, RefusedNoHello)
		}
	}
}

// TestListenerClose: a session taken but never handed out goes with the
// listener, and Accept then fails.
func TestListenerClose(t *testing.T) {
	k, r := &tokens{set: []string{tokA}}, newRefusals()
	ln, sock := listen(t, k, r)
	agent := dial(t, sock, tokA, 1)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ln.mu.Lock()
		taken := ln.current != nil
		ln.mu.Unlock()
		if taken {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent's hello was never taken")
		}
	}
	ln.Close()
	closedByDaemon(t, agent)
	if _, _, err := ln.Accept(context.Background()); err == nil {
		t.Fatal("Accept after Close succeeded")
	}
}
