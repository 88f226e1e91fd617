// Package channel is the one link between the daemon and the agent inside a
// sandbox: the agent dials a unix socket that the daemon listens on (the
// sandbox has no network route to the host at all), says hello, and then the
// connection carries yamux streams opened by the daemon. Each stream starts
// with the target port inside the sandbox: the agent serves its own API on
// its port (agentapi.Port) and pipes any other port to 127.0.0.1:<port> in
// the sandbox. What is spoken over the streams is not this package's
// business (internal/agentapi is the agent's contract).
//
// Because the agent connects out, its readiness is pushed to the daemon the
// moment it starts, and every request afterwards reuses one persistent
// connection instead of spawning anything on the host.
package channel

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"
)

// Hello is the first line the agent sends, as JSON.
type Hello struct {
	SandboxID string `json:"sandbox_id"`
	Token     string `json:"token"`
	Version   string `json:"version"`
	PID       int    `json:"pid"`
}

func yamuxConfig() *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	cfg.EnableKeepAlive = true
	cfg.KeepAliveInterval = 15 * time.Second
	cfg.ConnectionWriteTimeout = 30 * time.Second
	// Larger windows keep 1 GB file transfers from stalling on round trips.
	cfg.MaxStreamWindowSize = 4 << 20
	cfg.StreamOpenTimeout = 10 * time.Second
	return cfg
}

// ---- agent side ----

// AgentSession is the agent's end of the channel.
type AgentSession struct {
	sess *yamux.Session
}

// DialDaemon connects to the daemon's socket and says hello.
func DialDaemon(ctx context.Context, socketPath string, hello Hello) (*AgentSession, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		return nil, fmt.Errorf("dial daemon at %s: %w", socketPath, err)
	}
	line, err := json.Marshal(hello)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if _, err := conn.Write(append(line, '\n')); err != nil {
		conn.Close()
		return nil, fmt.Errorf("send hello: %w", err)
	}
	sess, err := yamux.Server(conn, yamuxConfig())
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &AgentSession{sess: sess}, nil
}

// Accept returns the next stream the daemon opened and the port it targets.
func (a *AgentSession) Accept() (net.Conn, int, error) {
	for {
		st, err := a.sess.AcceptStream()
		if err != nil {
			return nil, 0, err
		}
		port, err := readPortHeader(st)
		if err != nil {
			st.Close()
			continue
		}
		return st, port, nil
	}
}

// Close ends the session.
func (a *AgentSession) Close() error { return a.sess.Close() }

// CloseChan is closed when the session ends.
func (a *AgentSession) CloseChan() <-chan struct{} { return a.sess.CloseChan() }

// Answers reports whether the daemon answers a ping within timeout.
func (a *AgentSession) Answers(timeout time.Duration) bool { return answers(a.sess, timeout) }

func readPortHeader(c net.Conn) (int, error) {
	// Read byte by byte: a buffered reader would swallow payload bytes.
	var b [1]byte
	var sb strings.Builder
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	for sb.Len() < 8 {
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return 0, err
		}
		if b[0] == '\n' {
			p, err := strconv.Atoi(sb.String())
			if err != nil || p <= 0 || p > 65535 {
				return 0, fmt.Errorf("bad port header %q", sb.String())
			}
			return p, nil
		}
		sb.WriteByte(b[0])
	}
	return 0, errors.New("port header too long")
}

// ---- daemon side ----

// helloTimeout bounds how long a connection may take to say hello: the
// agent writes it as soon as it is connected.
const helloTimeout = 5 * time.Second

// helloReaders bounds the hellos read at once, so connections that never
// say hello can neither hold the real agent's back nor make the daemon open
// unbounded file descriptors; beyond it they wait in the socket's backlog.
const helloReaders = 4

// answerTimeout is how long a session has to answer a ping before a new
// hello may take its place.
const answerTimeout = 2 * time.Second

// ListenOptions say which hellos a Listener takes and whom it tells about
// the others.
type ListenOptions struct {
	// Tokens returns the credentials a hello may carry now; it is called
	// for every hello, so a credential rotated since is in force at once.
	Tokens func() []string
	// OnRefuse hears of every connection refused (nil: nobody). It runs
	// on the goroutine that read the hello.
	OnRefuse func(Refusal)
}

// Refusal is a connection to a sandbox's socket that was not taken as its
// agent.
type Refusal struct {
	// Hello is what the connection claimed (the zero Hello if it said
	// nothing readable), without its token.
	Hello  Hello
	Reason string
}

// Reasons for a Refusal.
const (
	RefusedNoHello   = "no valid hello"
	RefusedBadToken  = "wrong channel credential"
	RefusedLiveAgent = "the agent's session is live"
)

// Listener is the daemon's end of one sandbox's socket. It reads every
// connection's hello as it arrives, a few at a time, and takes one only
// when it carries a current credential and no session of this listener is
// still answering: a second agent while the first one answers is not the
// agent, whatever it knows. The rest are refused (closed) and reported.
// Accept hands out the session taken.
type Listener struct {
	ln    *net.UnixListener
	path  string
	opts  ListenOptions
	slots chan struct{}
	done  chan struct{} // closed by Close
	loop  chan struct{} // closed when the accept loop has returned

	mu      sync.Mutex
	current *Conn         // the session taken last (handed out or not)
	handed  bool          // whether Accept has returned current
	wake    chan struct{} // closed when current changes
	reading map[net.Conn]struct{}
	closed  bool
}

// Listen creates the socket the agent of one sandbox will dial and starts
// reading hellos.
func Listen(socketPath string, o ListenOptions) (*Listener, error) {
	addr := &net.UnixAddr{Name: socketPath, Net: "unix"}
	ln, err := net.ListenUnix("unix", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", socketPath, err)
	}
	ln.SetUnlinkOnClose(true)
	if o.Tokens == nil {
		o.Tokens = func() []string { return nil }
	}
	l := &Listener{ln: ln, path: socketPath, opts: o, slots: make(chan struct{}, helloReaders),
		done: make(chan struct{}), loop: make(chan struct{}), wake: make(chan struct{}), reading: map[net.Conn]struct{}{}}
	go l.acceptLoop()
	return l, nil
}

// Close stops listening and removes the socket file. A session taken but
// not handed out is closed; one handed out is its owner's to close.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	var pending *Conn
	if !l.handed {
		pending = l.current
	}
	for c := range l.reading {
		c.Close() // its check ends at once, unreported
	}
	l.mu.Unlock()
	err := l.ln.Close()
	<-l.loop
	if pending != nil {
		pending.Close()
	}
	return err
}

func (l *Listener) acceptLoop() {
	defer close(l.loop)
	for {
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			return
		}
		c, err := l.ln.Accept()
		if err != nil {
			<-l.slots
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: try again shortly.
			select {
			case <-l.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			<-l.slots
			return
		}
		l.reading[c] = struct{}{}
		l.mu.Unlock()
		go func() {
			defer func() { <-l.slots }()
			l.check(c)
			l.mu.Lock()
			delete(l.reading, c)
			l.mu.Unlock()
		}()
	}
}

// check takes c as the agent's session or refuses it.
func (l *Listener) check(c net.Conn) {
	hello, err := readHello(c)
	if err != nil {
		l.refuse(c, Hello{}, RefusedNoHello+": "+err.Error())
		return
	}
	if !tokenIn(hello.Token, l.opts.Tokens()) {
		l.refuse(c, hello, RefusedBadToken)
		return
	}
	l.mu.Lock()
	prev := l.current
	l.mu.Unlock()
	if prev != nil && !prev.IsClosed() {
		if prev.Answers(answerTimeout) {
			l.refuse(c, hello, RefusedLiveAgent)
			return
		}
		// The agent's old session is dead (a checkpoint broke it) and it
		// has dialed again.
		prev.Close()
	}
	widenSendBuffer(c)
	sess, err := yamux.Client(c, yamuxConfig())
	if err != nil {
		c.Close()
		return
	}
	conn := newConn(sess)
	conn.hello = hello
	l.mu.Lock()
	if l.closed || l.current != prev {
		// Closed, or another hello won the race: the one in place stays.
		closed := l.closed
		l.mu.Unlock()
		conn.Close()
		if !closed {
			l.report(hello, RefusedLiveAgent)
		}
		return
	}
	l.current, l.handed = conn, false
	close(l.wake)
	l.wake = make(chan struct{})
	l.mu.Unlock()
}

// sendBuffer is the send buffer of the daemon's end of a session. A unix
// stream socket holds at most its sender's buffer in flight (212992 bytes
// by default here), so the agent, which under gVisor pays trips through the
// sentry for every wake and read, took a 1 GiB upload in 200 KiB turns:
// 1.9-2.7 s beside 2.8-3.4 s for 1 GiB with 4 MiB, five rounds each, same
// hour. It is a bound, not memory held while a session idles; but a
// sandbox that stops reading can make the daemon's kernel hold it (twice
// it, as Linux counts), hence 1 MiB and not more.
const sendBuffer = 1 << 20

// widenSendBuffer raises c's send buffer to sendBuffer, past the system's
// cap (SO_SNDBUFFORCE: the daemon runs as root); failing leaves it as it was.
func widenSendBuffer(c net.Conn) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendBuffer)
	})
}

func (l *Listener) refuse(c net.Conn, hello Hello, reason string) {
	c.Close()
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if !closed { // a read Close interrupted is no refusal
		l.report(hello, reason)
	}
}

func (l *Listener) report(hello Hello, reason string) {
	if l.opts.OnRefuse != nil {
		hello.Token = ""
		l.opts.OnRefuse(Refusal{Hello: hello, Reason: reason})
	}
}

func tokenIn(got string, want []string) bool {
	ok := false
	for _, w := range want {
		if w != "" && subtle.ConstantTimeCompare([]byte(got), []byte(w)) == 1 {
			ok = true
		}
	}
	return ok
}

// Accept waits for the agent's next session: one taken since the last
// Accept (or before the first).
func (l *Listener) Accept(ctx context.Context) (*Conn, Hello, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, Hello{}, net.ErrClosed
		}
		if c := l.current; c != nil && !l.handed && !c.IsClosed() {
			l.handed = true
			l.mu.Unlock()
			return c, c.hello, nil
		}
		wake := l.wake
		l.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, Hello{}, ctx.Err()
		case <-l.done:
		}
	}
}

func readHello(c net.Conn) (Hello, error) {
	_ = c.SetReadDeadline(time.Now().Add(helloTimeout))
	defer c.SetReadDeadline(time.Time{})
	var line []byte
	var b [1]byte
	for len(line) < 4096 {
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return Hello{}, err
		}
		if b[0] == '\n' {
			var h Hello
			if err := json.Unmarshal(line, &h); err != nil {
				return Hello{}, err
			}
			return h, nil
		}
		line = append(line, b[0])
	}
	return Hello{}, errors.New("hello too long")
}

// Conn is the daemon's end of one agent's channel.
type Conn struct {
	sess  *yamux.Session
	hello Hello

	mu        sync.Mutex
	transport *http.Transport
}

func newConn(sess *yamux.Session) *Conn {
	c := &Conn{sess: sess}
	c.transport = &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			_, portStr, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			port, err := strconv.Atoi(portStr)
			if err != nil {
				return nil, err
			}
			return c.DialPort(ctx, port)
		},
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return c
}

// DialPort opens a stream to a port inside the sandbox.
func (c *Conn) DialPort(ctx context.Context, port int) (net.Conn, error) {
	st, err := c.sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("open agent stream: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = st.SetWriteDeadline(dl)
	}
	if _, err := st.Write([]byte(strconv.Itoa(port) + "\n")); err != nil {
		st.Close()
		return nil, fmt.Errorf("open agent stream: %w", err)
	}
	_ = st.SetWriteDeadline(time.Time{})
	return bulkStream{st}, nil
}

// bodyChunk is the most a copy into a stream sends per frame. io.Copy's
// 32 KiB would make a 1 GiB upload 32768 frames, and each frame costs the
// agent under gVisor trips through the sentry whatever its size; the
// sentry reads at most its socket's receive buffer (208 KiB) at a time
// anyway, and a buffer is held for the whole of each body being sent.
const bodyChunk = 256 << 10

var bodyBuffers = sync.Pool{New: func() any { b := make([]byte, bodyChunk); return &b }}

// bulkStream is a stream whose ReadFrom (what the HTTP transport uses to
// send a request body, through io.Copy) reads up to bodyChunk at a time.
// Each read is sent as it comes, so a streamed body is not held back.
type bulkStream struct{ *yamux.Stream }

func (s bulkStream) ReadFrom(r io.Reader) (int64, error) {
	bp := bodyBuffers.Get().(*[]byte)
	defer bodyBuffers.Put(bp)
	return io.CopyBuffer(struct{ io.Writer }{s.Stream}, r, *bp)
}

// Transport is an HTTP transport whose connections are streams of this
// channel; the request URL's port picks the port inside the sandbox (the
// host is only a name: http://sandbox:8080/...). Idle streams are kept for
// reuse.
func (c *Conn) Transport() *http.Transport { return c.transport }

// Closed is closed when the agent's connection ends.
func (c *Conn) Closed() <-chan struct{} { return c.sess.CloseChan() }

// IsClosed reports whether the agent's connection has ended.
func (c *Conn) IsClosed() bool { return c.sess.IsClosed() }

// Answers reports whether the other end answers a ping within timeout.
func (c *Conn) Answers(timeout time.Duration) bool { return answers(c.sess, timeout) }

func answers(sess *yamux.Session, timeout time.Duration) bool {
	res := make(chan error, 1)
	go func() { _, err := sess.Ping(); res <- err }()
	select {
	case err := <-res:
		return err == nil
	case <-time.After(timeout):
		return false
	}
}

// Close ends the channel.
func (c *Conn) Close() error {
	c.transport.CloseIdleConnections()
	return c.sess.Close()
}
