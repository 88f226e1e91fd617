package api

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// selfURL is the base URL of the API's in-process client. Nothing is dialed
// for it: the host only has to be one the sandbox proxy accepts with E2B's
// E2b-Sandbox-Id routing headers (an IP, localhost or sandbox.<domain>).
const selfURL = "http://localhost"

// selfClient is how the daemon calls its own API (MCP's tools, which act
// through the API with the caller's key): the requests are served in
// process by the API's own handler over an in-memory listener, so they
// never leave the daemon and nothing a request says (its Host header, say)
// decides where the caller's key goes. It is a real net/http server on
// connections made by net.Pipe: streaming, full duplex and upgrades behave
// as they do over TCP. The server starts with the first request.
type selfClient struct {
	h    http.Handler
	ln   *pipeListener
	http *http.Client

	once sync.Once
	srv  *http.Server // nil until the first request, or after close
}

func newSelfClient(h http.Handler) *selfClient {
	c := &selfClient{h: h, ln: newPipeListener()}
	c.http = &http.Client{Transport: &http.Transport{
		DialContext:         c.dial,
		Proxy:               nil,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}}
	return c
}

func (c *selfClient) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c.once.Do(func() {
		c.srv = &http.Server{Handler: c.h, ReadHeaderTimeout: 30 * time.Second}
		go func() { _ = c.srv.Serve(c.ln) }()
	})
	return c.ln.dial(ctx)
}

// close stops the in-memory server and its connections; later requests
// fail.
func (c *selfClient) close() {
	c.once.Do(func() {}) // no server starts after this
	c.ln.Close()
	if c.srv != nil {
		_ = c.srv.Close()
	}
}

// pipeListener is a net.Listener whose connections are net.Pipe pairs made
// by dial.
type pipeListener struct {
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

var errListenerClosed = errors.New("the API's in-process listener is closed")

func (l *pipeListener) dial(ctx context.Context) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
	case <-ctx.Done():
	}
	client.Close()
	server.Close()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, errListenerClosed
}

// Accept implements net.Listener.
func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (l *pipeListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

// Addr implements net.Listener.
func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "in-process" }
