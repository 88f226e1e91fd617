// Package channel is the one link between the daemon and the agent inside a
// sandbox: the agent dials a unix socket that the daemon listens on (the
// sandbox has no network route to the host at all), says hello, and then the
// connection carries yamux streams opened by the daemon. Each stream starts
// with the target port inside the sandbox: AgentPort reaches the agent's own
// HTTP API (envd), any other port is piped to 127.0.0.1:<port> in the sandbox.
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
)

// AgentPort is the port of the agent's own API, the same as E2B's envd.
const AgentPort = 49983

// SocketName is the socket's file name in the sandbox's run directory, which
// is mounted at GuestRunDir inside the sandbox.
const SocketName = "agent.sock"

// GuestRunDir is where the sandbox's run directory appears inside it.
const GuestRunDir = "/run/cella"

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

// Listener accepts exactly one agent on a sandbox's socket.
type Listener struct {
	ln   *net.UnixListener
	path string
}

// Listen creates the socket the agent of one sandbox will dial.
func Listen(socketPath string) (*Listener, error) {
	addr := &net.UnixAddr{Name: socketPath, Net: "unix"}
	ln, err := net.ListenUnix("unix", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", socketPath, err)
	}
	ln.SetUnlinkOnClose(true)
	return &Listener{ln: ln, path: socketPath}, nil
}

// Close stops listening and removes the socket file.
func (l *Listener) Close() error { return l.ln.Close() }

// Accept waits for the agent to connect and checks its token. Connections
// with a wrong token are dropped and waiting goes on.
func (l *Listener) Accept(ctx context.Context, wantToken string) (*Conn, Hello, error) {
	_ = l.ln.SetDeadline(time.Time{}) // an earlier Accept's expiry must not stick
	stop := context.AfterFunc(ctx, func() { _ = l.ln.SetDeadline(time.Now()) })
	defer stop()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil, Hello{}, ctx.Err()
			}
			return nil, Hello{}, err
		}
		hello, err := readHello(c)
		if err != nil || subtle.ConstantTimeCompare([]byte(hello.Token), []byte(wantToken)) != 1 {
			c.Close()
			continue
		}
		sess, err := yamux.Client(c, yamuxConfig())
		if err != nil {
			c.Close()
			return nil, Hello{}, err
		}
		return newConn(sess), hello, nil
	}
}

func readHello(c net.Conn) (Hello, error) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
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
	sess *yamux.Session

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
	return st, nil
}

// Transport is an HTTP transport whose connections are streams of this
// channel; the request URL's port picks the port inside the sandbox
// (http://agent:49983/...). Idle streams are kept for reuse.
func (c *Conn) Transport() *http.Transport { return c.transport }

// Closed is closed when the agent's connection ends.
func (c *Conn) Closed() <-chan struct{} { return c.sess.CloseChan() }

// IsClosed reports whether the agent's connection has ended.
func (c *Conn) IsClosed() bool { return c.sess.IsClosed() }

// Close ends the channel.
func (c *Conn) Close() error {
	c.transport.CloseIdleConnections()
	return c.sess.Close()
}

// AgentURL is the base URL to use with Transport for the agent's API.
const AgentURL = "http://agent:49983"

// PortURL is the base URL to use with Transport for a port in the sandbox.
func PortURL(port int) string { return "http://sandbox:" + strconv.Itoa(port) }
