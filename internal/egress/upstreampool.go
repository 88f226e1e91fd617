package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/cella-sandbox/cella/internal/network"
)

// upstreamPool is one sandbox's idle cleartext HTTP/1.1 upstream
// connections of one kind (by name or by address), keyed by where the
// request was decided to go (its URL's host:port), and the round tripper of
// the requests that may take them (replayable: no body; GET, HEAD, OPTIONS,
// TRACE).
//
// It does what net/http's Transport does for such requests, but in the
// request's own goroutine: the request is written and its answer read by
// the handler serving the sandbox's connection, where the Transport hands
// both to two goroutines of the connection's and back (wake-ups of other
// threads, a proxied GET's cost more than its bytes on two cores: ~9 %
// less time per GET through a sandbox without them). Framing stays net/http's: Request.Write writes the request as
// the Transport would, http.ReadResponse reads the answer.
type upstreamPool struct {
	dial func(ctx context.Context, t target) (net.Conn, error)
	idle time.Duration // how long an idle connection is kept

	mu     sync.Mutex
	conns  []*upConn // idle, oldest first
	closed bool      // the sandbox's listener closed: nothing is kept
}

// upConn is one upstream connection.
type upConn struct {
	net.Conn
	key   string
	br    *bufio.Reader
	bw    *bufio.Writer
	read  int64       // bytes read from the connection, for the retry rule
	left  int64       // bytes an answer's head may still take
	timer *time.Timer // closes it once idle too long
}

func (c *upConn) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, fmt.Errorf("the upstream's answer head is over %d bytes", maxAnswerHead)
	}
	n, err := c.Conn.Read(p)
	c.read += int64(n)
	c.left -= int64(n)
	return n, err
}

// maxAnswerHead bounds an answer's status line and header fields (and any
// informational answers before it) that the proxy holds in memory: an
// upstream cannot make it buffer more (net/http's transport allows 10 MB;
// a sandbox's request head may take 1 MiB too).
const maxAnswerHead = 1 << 20

// max1xx bounds the informational answers before the final one, as
// net/http's transport does.
const max1xx = 5

// RoundTrip sends a replayable request on an idle connection to its host,
// or a new one. A reused connection that its server closed before
// answering is replaced once, as the Transport replays such requests.
func (u *upstreamPool) RoundTrip(req *http.Request) (*http.Response, error) {
	t, ok := req.Context().Value(targetKey{}).(target)
	if !ok {
		return nil, errors.New("an upstream request without a decision")
	}
	// What net/http's transport refuses to send (the sandbox's own header
	// fields were checked by the server that read them; these are also
	// the proxy's own additions).
	for k, vs := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return nil, fmt.Errorf("invalid header field name %q", k)
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil, fmt.Errorf("invalid header field value for %q", k)
			}
		}
	}
	key := req.URL.Host
	trace := httptrace.ContextClientTrace(req.Context())
	for retry := false; ; retry = true {
		var c *upConn
		if !retry {
			c = u.take(key)
		}
		reused := c != nil
		if c == nil {
			nc, err := u.dial(req.Context(), t)
			if err != nil {
				return nil, err
			}
			c = &upConn{Conn: nc, key: key}
			c.br = bufio.NewReaderSize(c, 4<<10)
			c.bw = bufio.NewWriterSize(nc, 4<<10)
		}
		if trace != nil && trace.GotConn != nil {
			trace.GotConn(httptrace.GotConnInfo{Conn: c.Conn, Reused: reused})
		}
		resp, err := u.send(c, req, trace)
		if err == nil {
			return resp, nil
		}
		if reused && c.read == 0 && req.Context().Err() == nil {
			continue // closed by its server while idle: sent again on a new one
		}
		return nil, err
	}
}

// send writes req on c and reads the answer; the answer's body gives c
// back to the pool once read to its end. On an error c is closed.
func (u *upstreamPool) send(c *upConn, req *http.Request, trace *httptrace.ClientTrace) (resp *http.Response, err error) {
	// The request's end (its sandbox connection gone) unblocks a read or
	// write waiting on the upstream.
	stop := context.AfterFunc(req.Context(), func() { _ = c.SetDeadline(aLongTimeAgo) })
	handedOn := false
	defer func() {
		// Also when a hook panics (the server recovers a handler's
		// panic): the connection must not wait for a finalizer.
		if !handedOn {
			stop()
			_ = c.Close()
		}
	}()
	fail := func(err error) (*http.Response, error) {
		if ctxErr := req.Context().Err(); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, err
	}
	if err := req.Write(c.bw); err != nil {
		return fail(err)
	}
	if err := c.bw.Flush(); err != nil {
		return fail(err)
	}
	c.left = maxAnswerHead
	for n := 0; ; n++ {
		if resp, err = http.ReadResponse(c.br, req); err != nil {
			return fail(err)
		}
		if resp.StatusCode < 100 {
			return fail(fmt.Errorf("the upstream answered with status %d, which HTTP does not have", resp.StatusCode))
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		if n == max1xx {
			return fail(fmt.Errorf("more than %d informational answers", max1xx))
		}
		if trace != nil && trace.Got1xxResponse != nil {
			if err := trace.Got1xxResponse(resp.StatusCode, textproto.MIMEHeader(resp.Header)); err != nil {
				return fail(err)
			}
		}
	}
	c.left = math.MaxInt64 // the body is the caller's to read, at its pace
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// An upgrade (WebSocket): the connection is the answer's body,
		// both ways, and never goes back to the pool. Whether the request
		// asked for it is the proxy's check (upgrade.Check, in its
		// ModifyResponse), which closes this body when it did not.
		if !stop() {
			return fail(context.Canceled)
		}
		handedOn = true
		resp.Body = &upgradedBody{c: c}
		return resp, nil
	}
	handedOn = true
	pb := &pooledBody{u: u, c: c, body: resp.Body, stop: stop, keep: !resp.Close && !req.Close}
	if resp.Body == http.NoBody {
		pb.finish(true) // read to its end already: c goes back (or closes) now
		return resp, nil
	}
	resp.Body = pb
	return resp, nil
}

// aLongTimeAgo is a deadline that has passed: it wakes a blocked read.
var aLongTimeAgo = time.Unix(1, 0)

// take returns an idle connection to key, or nil. One that has something
// to read while idle (its server closed it, or sent what nobody asked for)
// is closed instead: an answer must never be read for the wrong request.
func (u *upstreamPool) take(key string) *upConn {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i := len(u.conns) - 1; i >= 0; i-- {
		c := u.conns[i]
		if c.key != key {
			continue
		}
		u.conns = append(u.conns[:i], u.conns[i+1:]...)
		c.timer.Stop()
		if c.br.Buffered() > 0 || !network.Quiet(c.Conn) {
			_ = c.Close()
			continue
		}
		c.read = 0
		return c
	}
	return nil
}

// put keeps c idle for its next request, the oldest idle one giving way.
func (u *upstreamPool) put(c *upConn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		_ = c.Close()
		return
	}
	if len(u.conns) >= plainIdle {
		_ = u.conns[0].Close()
		u.conns[0].timer.Stop()
		u.conns = u.conns[1:]
	}
	u.conns = append(u.conns, c)
	c.timer = time.AfterFunc(u.idle, func() { u.expire(c) })
}

// expire closes c if it is still idle.
func (u *upstreamPool) expire(c *upConn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i, ic := range u.conns {
		if ic == c {
			u.conns = append(u.conns[:i], u.conns[i+1:]...)
			_ = c.Close()
			return
		}
	}
}

// close closes the idle connections and keeps none from now on.
func (u *upstreamPool) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	for _, c := range u.conns {
		c.timer.Stop()
		_ = c.Close()
	}
	u.conns = nil
}

// pooledBody is an answer's body: read to its end, it gives its connection
// back; closed before, it closes it (what is left unread would be read as
// the next answer).
type pooledBody struct {
	u    *upstreamPool
	c    *upConn
	body io.ReadCloser
	stop func() bool
	keep bool

	mu   sync.Mutex
	done bool
}

func (b *pooledBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.finish(true)
	}
	return n, err
}

func (b *pooledBody) Close() error {
	b.finish(false)
	return nil
}

func (b *pooledBody) finish(atEOF bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return
	}
	b.done = true
	if b.stop() && atEOF && b.keep {
		b.u.put(b.c)
		return
	}
	_ = b.c.Close()
}

// upgradedBody is the connection after a 101: what the server sends is
// read (after whatever was buffered), what the client sends is written.
type upgradedBody struct{ c *upConn }

func (b *upgradedBody) Read(p []byte) (int, error)  { return b.c.br.Read(p) }
func (b *upgradedBody) Write(p []byte) (int, error) { return b.c.Conn.Write(p) }
func (b *upgradedBody) Close() error                { return b.c.Close() }
