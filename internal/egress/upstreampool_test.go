package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// scriptedUpstream answers each request by its path, on connections it
// numbers, so that a test can make an upstream misbehave between and
// inside answers as real servers do.
type scriptedUpstream struct {
	ln net.Listener

	mu     sync.Mutex
	reqs   []string     // "conn path" in order
	closed map[int]bool // connections whose end the upstream saw
	drop   map[int]bool // connections that close at their next request
	paired int          // requests for /pair so far
}

func newScriptedUpstream(t *testing.T) *scriptedUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &scriptedUpstream{ln: ln, closed: map[int]bool{}, drop: map[int]bool{}}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for n := 1; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go u.serve(n, c)
		}
	}()
	return u
}

func (u *scriptedUpstream) serve(n int, c net.Conn) {
	defer func() {
		c.Close()
		u.mu.Lock()
		u.closed[n] = true
		u.mu.Unlock()
	}()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		u.mu.Lock()
		u.reqs = append(u.reqs, fmt.Sprintf("%d %s", n, req.URL.Path))
		drop := u.drop[n]
		u.mu.Unlock()
		if drop {
			return // a server closing a connection it kept idle, as the request came
		}
		const ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
		switch req.URL.Path {
		case "/drop-next":
			u.mu.Lock()
			u.drop[n] = true
			u.mu.Unlock()
			io.WriteString(c, ok)
		case "/extra":
			io.WriteString(c, ok+"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nevil!")
		case "/conn-close":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			io.Copy(io.Discard, br) // leaves the closing to the proxy
			return
		case "/no-content":
			io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
		case "/hints":
			io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"+ok)
		case "/099":
			io.WriteString(c, "HTTP/1.1 099 Odd\r\n\r\n"+ok)
		case "/101-bare":
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\n\r\ntunnelled\n")
		case "/101-other":
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: other\r\n\r\ntunnelled\n")
		case "/101-kelvin":
			// "websocket" with Kelvin's K (U+212A): the same under a
			// Unicode case fold, not under httputil's ASCII one.
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websoc\u212aet\r\n\r\ntunnelled\n")
		case "/pair":
			// Answered once two have come: two connections in use at once,
			// then both idle.
			u.mu.Lock()
			u.paired++
			u.mu.Unlock()
			for {
				u.mu.Lock()
				both := u.paired >= 2
				u.mu.Unlock()
				if both {
					break
				}
				time.Sleep(time.Millisecond)
			}
			io.WriteString(c, ok)
		case "/big-head":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Big: "+strings.Repeat("b", 2<<20)+"\r\nContent-Length: 2\r\n\r\nok")
		case "/endless":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
			chunk := make([]byte, 64<<10)
			for {
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
		default:
			io.WriteString(c, ok)
		}
	}
}

// dropOpen makes every open connection close at its next request.
func (u *scriptedUpstream) dropOpen() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, r := range u.reqs {
		var n int
		fmt.Sscanf(r, "%d", &n)
		if !u.closed[n] {
			u.drop[n] = true
		}
	}
}

// last is the connection the last request came on.
func (u *scriptedUpstream) last() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	var n int
	fmt.Sscanf(u.reqs[len(u.reqs)-1], "%d", &n)
	return n
}

// waitClosed waits until the upstream saw connection n end.
func (u *scriptedUpstream) waitClosed(t *testing.T, what string, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		u.mu.Lock()
		done := u.closed[n]
		u.mu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: upstream connection %d is still open", what, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestHTTPPoolUpstreamMisbehaves: what an upstream does to the connections
// the pool keeps never shows in another request's answer. A connection
// its server closes as the next request comes is replaced and the
// request sent again; bytes sent beyond an answer are never read as the
// next one; an answer that says Connection: close ends its connection; an
// answer whose head is over the limit is a 502 and costs the proxy no
// more memory than the limit; informational answers (103) pass before
// the final one; a body the sandbox stops reading ends its connection;
// an answer with a status HTTP does not have, or a switch of protocols the
// request did not ask for, is a 502 and ends its connection.
func TestHTTPPoolUpstreamMisbehaves(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test"}}, func(c *Config) { c.UpstreamIdle = time.Hour })
	up := newScriptedUpstream(t)
	h.serveOn(80, up.ln.Addr().String())
	dst := netip.AddrPortFrom(h.fake("pkg.test"), 80)
	allowed := 0
	get := func(path string) (int, string) {
		t.Helper()
		allowed++
		code, resp := h.sandboxSend(h.ln, h.sb, dst, "GET "+path+" HTTP/1.1\r\nHost: pkg.test\r\nConnection: close\r\n\r\n", allowed)
		if code != http.StatusOK {
			// Allowed too (the answer is the upstream's doing): waited
			// for, so that the next request finds the pool as this one
			// left it.
			h.waitAllowed(h.sb, allowed)
		}
		return code, resp
	}
	body := func(resp string) string { _, b, _ := strings.Cut(resp, "\r\n\r\n"); return b }

	if code, resp := get("/ok"); code != 200 {
		t.Fatalf("GET /ok: %s", resp)
	}
	first := up.last()
	// An answer without a body gives its connection back at once: the
	// next request goes on it.
	if code, resp := get("/no-content"); code != http.StatusNoContent || up.last() != first {
		t.Fatalf("GET /no-content: %q on %d (want the pooled %d)", resp, up.last(), first)
	}
	if code, resp := get("/ok"); code != 200 || up.last() != first {
		t.Fatalf("GET after a 204: %q on %d (want the pooled %d)", resp, up.last(), first)
	}
	if code, resp := get("/drop-next"); code != 200 || up.last() != first {
		t.Fatalf("GET /drop-next: %s, on %d (want the pooled %d)", resp, up.last(), first)
	}
	// The server closes the pooled connection as the request comes: sent
	// again on a new one.
	if code, resp := get("/ok"); code != 200 || body(resp) != "ok" || up.last() == first {
		t.Errorf("GET after the server dropped the pooled connection: %q on upstream connection %d", resp, up.last())
	}
	// An answer followed by bytes nobody asked for: the next request gets
	// its own answer, on another connection.
	if code, resp := get("/extra"); code != 200 || body(resp) != "ok" {
		t.Fatalf("GET /extra: %q", resp)
	}
	extra := up.last()
	if code, resp := get("/ok"); code != 200 || body(resp) != "ok" || up.last() == extra {
		t.Errorf("GET after an answer with bytes beyond it: %q on upstream connection %d (the one with the bytes: %d)", resp, up.last(), extra)
	}
	// Connection: close in the answer: the proxy closes the connection.
	if code, resp := get("/conn-close"); code != 200 || body(resp) != "ok" {
		t.Fatalf("GET /conn-close: %q", resp)
	}
	up.waitClosed(t, "after an answer with Connection: close", up.last())
	// Early hints pass before the answer.
	if code, resp := get("/hints"); code != 103 || !strings.Contains(resp, "HTTP/1.1 200 OK") || !strings.HasSuffix(resp, "\r\n\r\nok") {
		t.Errorf("GET /hints: %q", resp)
	}
	// An answer head over the limit: a 502 naming it, and the connection
	// ends.
	if code, resp := get("/big-head"); code != http.StatusBadGateway || !strings.Contains(resp, "answer head is over") {
		t.Errorf("GET /big-head: %d %.300q", code, resp)
	}
	up.waitClosed(t, "after an answer head over the limit", up.last())
	// A status under 100 (which made httputil's 1xx hook panic) and a 101
	// the request did not ask for (which would make the sandbox's
	// connection an unchecked tunnel): 502s, and their connections end.
	for _, path := range []string{"/099", "/101-bare", "/101-other"} {
		if code, resp := get(path); code != http.StatusBadGateway {
			t.Errorf("GET %s: %d %.300q", path, code, resp)
		} else if strings.HasPrefix(path, "/101") && !strings.Contains(resp, "did not ask for") {
			t.Errorf("GET %s: the 502 does not say the request did not ask for the switch: %.300q", path, resp)
		}
		up.waitClosed(t, "after GET "+path, up.last())
	}
	// An upgrade to another protocol than the one asked for: the same.
	allowed++
	if code, resp := h.sandboxSend(h.ln, h.sb, dst, "GET /101-other HTTP/1.1\r\nHost: pkg.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", allowed); code != http.StatusBadGateway {
		t.Errorf("GET /101-other asking for echo: %d %.300q", code, resp)
	}
	h.waitAllowed(h.sb, allowed)
	up.waitClosed(t, "after a 101 to another protocol", up.last())
	// One that is the protocol asked for only under a Unicode case fold,
	// which httputil refuses after the proxy's check without closing it.
	allowed++
	if code, resp := h.sandboxSend(h.ln, h.sb, dst, "GET /101-kelvin HTTP/1.1\r\nHost: pkg.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", allowed); code != http.StatusBadGateway || !strings.Contains(resp, "did not ask for") {
		t.Errorf("GET /101-kelvin asking for websocket: %d %.300q", code, resp)
	}
	h.waitAllowed(h.sb, allowed)
	up.waitClosed(t, "after a 101 to websoc\u212aet", up.last())
	// The same for a request on the connection's own upstream connection
	// (a POST is not pooled).
	allowed++
	if code, resp := h.sandboxSend(h.ln, h.sb, dst, "POST /101-other HTTP/1.1\r\nHost: pkg.test\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx", allowed); code != http.StatusBadGateway {
		t.Errorf("POST /101-other: %d %.300q", code, resp)
	}
	h.waitAllowed(h.sb, allowed)
	up.waitClosed(t, "after a 101 to a POST", up.last())
	// Two idle connections, both closed by their server as the next
	// request comes: it is sent again on a new one, not on the other.
	var pair sync.WaitGroup
	for range 2 {
		pair.Add(1)
		go func() {
			defer pair.Done()
			c, err := net.Dial("tcp", h.ln.Addr().String())
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			h.dsts.Store(c.LocalAddr().String(), dst)
			io.WriteString(c, "GET /pair HTTP/1.1\r\nHost: pkg.test\r\nConnection: close\r\n\r\n")
			io.ReadAll(c)
		}()
	}
	pair.Wait()
	allowed += 2
	h.waitAllowed(h.sb, allowed)
	up.dropOpen()
	if code, resp := get("/ok"); code != 200 || body(resp) != "ok" {
		t.Errorf("GET with two idle connections that their server closes: %q", resp)
	}
	// The sandbox hangs up in the middle of a body: the connection ends
	// (what is left of the body would be read as the next answer).
	c, err := net.Dial("tcp", h.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	h.dsts.Store(c.LocalAddr().String(), dst)
	io.WriteString(c, "GET /endless HTTP/1.1\r\nHost: pkg.test\r\n\r\n")
	if _, err := io.ReadFull(c, make([]byte, 128<<10)); err != nil {
		t.Fatalf("GET /endless: %v", err)
	}
	c.Close()
	allowed++
	h.waitAllowed(h.sb, allowed)
	endless := up.last()
	up.waitClosed(t, "after the sandbox hung up mid-body", endless)
	if code, resp := get("/ok"); code != 200 || body(resp) != "ok" {
		t.Errorf("GET after a body cut short: %q", resp)
	}
}

// TestHTTPPoolIdleConnectionsExpire: an idle upstream connection is closed
// after Config.UpstreamIdle.
func TestHTTPPoolIdleConnectionsExpire(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test"}}, func(c *Config) { c.UpstreamIdle = 50 * time.Millisecond })
	up := newScriptedUpstream(t)
	h.serveOn(80, up.ln.Addr().String())
	if code, resp := h.sandboxGet(h.ln, h.sb, netip.AddrPortFrom(h.fake("pkg.test"), 80), "pkg.test", "x", 1); code != 200 {
		t.Fatalf("GET: %s", resp)
	}
	up.waitClosed(t, "an idle connection after UpstreamIdle", up.last())
}

// TestHTTPPoolAnswersNeverCross: whatever an upstream sends beyond an
// answer's framing — a body to a HEAD, a 204 or a 304, bytes after a
// chunked body's trailers, a body until the close of an HTTP/1.0 answer —
// is never read as the next request's answer (the pool's round tripper
// alone; each case's bytes are all written before the second request, the
// late ones after the first answer was read: those the pool can only see on
// the idle connection's socket).
func TestHTTPPoolAnswersNeverCross(t *testing.T) {
	const evil = "HTTP/1.1 200 EVIL\r\nContent-Length: 4\r\n\r\nevil"
	const good = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ngood"
	for _, tc := range []struct {
		name, method, first string
		late                string // sent once the first answer was read
	}{
		{"a HEAD answered with a body later", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n", evil},
		{"bytes sent while the connection is idle", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nbody", evil},
		{"a HEAD answered with a body", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n" + evil, ""},
		{"a 204 with a body", "GET", "HTTP/1.1 204 No Content\r\n\r\n" + evil, ""},
		{"a 304 with a body", "GET", "HTTP/1.1 304 Not Modified\r\nContent-Length: 40\r\n\r\n" + evil, ""},
		{"bytes after a chunked body's trailers", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n4\r\nbody\r\n0\r\nX-T: v\r\n\r\n" + evil, ""},
		{"an HTTP/1.0 answer read until its close", "GET", "HTTP/1.0 200 OK\r\n\r\nbody", ""},
		{"an HTTP/1.0 keep-alive answer with bytes after it", "GET", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 4\r\n\r\nbody" + evil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			read, wrote := make(chan struct{}), make(chan struct{})
			go func() {
				for n := 1; ; n++ {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						br := bufio.NewReader(c)
						for {
							req, err := http.ReadRequest(br)
							if err != nil {
								return
							}
							if req.URL.Path != "/1" {
								io.WriteString(c, good)
								continue
							}
							io.WriteString(c, tc.first)
							if tc.late != "" {
								<-read
								io.WriteString(c, tc.late)
							}
							close(wrote)
							if strings.HasPrefix(tc.first, "HTTP/1.0 200 OK\r\n\r\n") {
								return // the answer's end is the close
							}
						}
					}()
				}
			}()
			u := &upstreamPool{idle: time.Hour, dial: func(ctx context.Context, t target) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", t.addrs[0].String())
			}}
			defer u.close()
			addr := netip.MustParseAddrPort(ln.Addr().String())
			get := func(method, path string) string {
				ctx := context.WithValue(context.Background(), targetKey{}, target{addrs: []netip.AddrPort{addr}})
				req, _ := http.NewRequestWithContext(ctx, method, "http://"+addr.String()+path, nil)
				resp, err := u.RoundTrip(req)
				if err != nil {
					return err.Error()
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					return err.Error()
				}
				return resp.Status + " " + string(b)
			}
			get(tc.method, "/1")
			close(read)
			<-wrote
			if got := get("GET", "/2"); got != "200 OK good" {
				t.Errorf("the next request read %q", got)
			}
		})
	}
}
