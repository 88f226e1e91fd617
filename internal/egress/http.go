package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/cella-sandbox/cella/internal/upgrade"
)

// discardLog keeps net/http's per-connection complaints (a sandbox that
// hangs up mid-request) out of the daemon's log; events carry what
// matters.
var discardLog = log.New(io.Discard, "", 0)

// httpConn proxies the HTTP requests of one sandbox connection: HTTP/1.x,
// or HTTP/2 (h2 inside TLS, h2c with prior knowledge in the clear), each
// request checked and forwarded on its own.
type httpConn struct {
	p  *Proxy
	s  *session
	up *upstreamConns

	decideMu sync.Mutex // held by the request deciding the connection

	mu  sync.Mutex
	key string  // the host every request must name ("" for an address)
	tgt *target // set by the first allowed request, or by the TLS decision
	rp  *httputil.ReverseProxy
	own *httputil.ReverseProxy // in the clear, on the connection's own upstream connections
	h2c *httputil.ReverseProxy // in the clear, for h2c requests: h2c upstream
	trs []*http.Transport      // the connection's own (not the sandbox's pool)
	// closed: the connection's end closed trs' idle connections.
	closed bool
}

// serveHTTP runs net/http's server on the one connection so that framing,
// keep-alive, 100-continue, upgrades and HTTP/2 behave as the client
// expects. In the clear (fixed nil) the first request's Host decides and
// later ones must match; inside terminated TLS (fixed: the server name's
// decision) every request must be for the server name. up opens the
// upstream connections.
func (p *Proxy) serveHTTP(ctx context.Context, s *session, conn net.Conn, fixed *target, up *upstreamConns) {
	h := &httpConn{p: p, s: s, up: up}
	if fixed != nil {
		h.setTarget(*fixed, fixed.name)
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // h2c with prior knowledge
	protocols.SetHTTP2(up.tls)          // h2 chosen in the TLS handshake
	ln := newConnListener(conn)
	var handlers sync.WaitGroup
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			handlers.Add(1)
			defer handlers.Done()
			h.serve(w, r)
		}),
		Protocols:         &protocols,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          discardLog,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnState: func(_ net.Conn, st http.ConnState) {
			// Hijacked is an upgrade (WebSocket): its handler keeps
			// copying and is waited for below.
			if st == http.StateClosed || st == http.StateHijacked {
				_ = ln.Close()
			}
		},
	}
	_ = srv.Serve(ln)
	handlers.Wait()
	h.mu.Lock()
	// A handler that starts only now (an h2c stream the closing server
	// still ran) makes no transport that keeps idle connections.
	h.closed = true
	trs := h.trs
	h.mu.Unlock()
	for _, tr := range trs {
		tr.CloseIdleConnections()
	}
	up.close()
}

// upstreamConns opens the upstream connections of one sandbox connection:
// TCP to the target's addresses, or TLS to its name. The first TLS
// connection is the one made during the sandbox's handshake (whose ALPN
// answer the sandbox was given); it is handed out once.
type upstreamConns struct {
	p      *Proxy
	s      *session
	tls    bool
	protos []string // ALPN offered on later TLS connections

	mu    sync.Mutex
	t     target
	first net.Conn
}

func (u *upstreamConns) target(t target) {
	u.mu.Lock()
	u.t = t
	u.mu.Unlock()
}

func (u *upstreamConns) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	u.mu.Lock()
	c, t := u.first, u.t
	u.first = nil
	u.mu.Unlock()
	switch {
	case c != nil:
		return c, nil
	case u.tls:
		return u.p.dialTLS(ctx, u.s, t, u.protos)
	}
	return u.dialTo(ctx, t)
}

// dialTo opens a cleartext connection to t for this sandbox connection.
func (u *upstreamConns) dialTo(ctx context.Context, t target) (net.Conn, error) {
	c, err := u.p.dial(ctx, t.addrs)
	if err != nil {
		return nil, err
	}
	u.s.setUpstream(c.RemoteAddr().String())
	return c, nil
}

// close closes the first connection if nothing took it.
func (u *upstreamConns) close() {
	u.mu.Lock()
	c := u.first
	u.first = nil
	u.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

func (h *httpConn) setTarget(t target, key string) {
	h.up.target(t)
	var rp *httputil.ReverseProxy
	var trs []*http.Transport
	switch {
	case h.up.tls:
		// TLS connections stay the sandbox connection's own: the first is
		// the one made during its handshake, whose ALPN the sandbox got.
		tr := h.connTransport()
		tr.DialTLSContext = h.up.dial
		tr.ForceAttemptHTTP2 = true
		trs = append(trs, tr)
		rp = h.proxy(t, "https", upHost(t, h.s.dst), tr, false)
	case h.s.fakeName != "":
		// A fake address stands for its name (and the name's addresses,
		// resolved by the proxy): the sandbox's connections to the name
		// and port share its pool.
		rp = h.proxy(t, "http", upHost(t, h.s.dst), h.p.plainPool(h.s.sb, true), true)
	case t.name == "":
		// Decided by the address alone (every request names an address or
		// nothing): connections to the address and port share its pool,
		// apart from names, so that a name that reads as an address (and
		// may be mapped elsewhere) never shares one with it.
		rp = h.proxy(t, "http", upHost(t, h.s.dst), h.p.plainPool(h.s.sb, false), true)
	default:
		// A name on an address the sandbox chose (not through cella's
		// DNS): the connection keeps its upstream connections to itself,
		// as a pool keyed by the name would send a request the sandbox
		// addressed to one of the name's addresses to another (whichever
		// the pooled connection was dialed to). rp stays nil: it is the
		// connection's own proxy, made below.
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if rp == nil {
		h.own = h.newOwnProxy(t, false)
		rp = h.own
	}
	h.key, h.tgt, h.rp, h.trs = key, &t, rp, append(h.trs, trs...)
}

// upHost is where t's requests go, "host:port": its name, or the
// address the sandbox connected to.
func upHost(t target, dst netip.AddrPort) string {
	host := t.name
	if host == "" {
		host = t.addrs[0].Addr().String()
	}
	return net.JoinHostPort(host, strconv.Itoa(int(dst.Port())))
}

// connTransport is a transport of this sandbox connection's own.
func (h *httpConn) connTransport() *http.Transport {
	return &http.Transport{
		Proxy:               nil,  // never the daemon's HTTP_PROXY
		DisableCompression:  true, // pass Accept-Encoding and bodies through as sent
		MaxIdleConnsPerHost: 2,
		// One sandbox connection opens about one upstream connection:
		// Limits count two descriptors per connection.
		MaxConnsPerHost:       2,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// flushInterval bounds how long a response with a known length waits in
// the server's buffer for more of itself. Streams (server-sent events, LLM
// token streams, gRPC, chunked bodies: no Content-Length) are flushed at
// every write whatever it says (httputil.ReverseProxy). A negative interval
// would flush every response's head on its own, from a goroutine started
// for it, before the body: two writes and a wake-up per small answer.
const flushInterval = 50 * time.Millisecond

// proxy forwards the connection's requests for t to upHost through tr
// (pooled: the sandbox's pool, whose dial reads t from the request).
func (h *httpConn) proxy(t target, scheme, upHost string, tr http.RoundTripper, pooled bool) *httputil.ReverseProxy {
	s := h.s
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = scheme
			pr.Out.URL.Host = upHost
			pr.Out.Host = pr.In.Host
			if pooled {
				ctx := context.WithValue(pr.Out.Context(), targetKey{}, t)
				pr.Out = pr.Out.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
					GotConn: func(info httptrace.GotConnInfo) { s.setUpstream(info.Conn.RemoteAddr().String()) },
				}))
			}
		},
		Transport:     tr,
		FlushInterval: flushInterval,
		BufferPool:    copyBuffers,
		ErrorLog:      discardLog,
		// A switch of protocols the request did not ask for: refused, and
		// its connection (the answer's body: for the sandbox's pool, the
		// pooled connection itself) closed at once. The only check: the
		// pool's round tripper hands any 101 on as an upgradedBody.
		ModifyResponse: upgrade.Check,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			msg := fmt.Sprintf("%s could not be reached: %v", displayHost(t), err)
			if unasked := (*upgrade.UnaskedError)(nil); errors.As(err, &unasked) {
				msg = fmt.Sprintf("%s answered with %v", displayHost(t), err)
			}
			s.setReason(msg)
			writeRefusal(w, s, &refusal{status: http.StatusBadGateway, msg: msg})
		},
	}
}

// ownProxy is the proxy of the connection's cleartext requests that do not
// take pooled connections: a request a transport cannot send again on a
// fresh connection when the reused one turns out closed by its server (one
// with a body, or not idempotent) gets one of its own, as every request
// did before there was a pool.
func (h *httpConn) ownProxy() *httputil.ReverseProxy {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.own == nil {
		h.own = h.newOwnProxy(*h.tgt, false)
	}
	return h.own
}

// h2cProxy is the proxy of the connection's HTTP/2 requests in the clear,
// made at the first: a sandbox that speaks h2c gets h2c upstream (it may
// need HTTP/2 itself: gRPC without TLS), on connections of its own.
func (h *httpConn) h2cProxy() *httputil.ReverseProxy {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.h2c == nil {
		h.h2c = h.newOwnProxy(*h.tgt, true)
	}
	return h.h2c
}

// newOwnProxy makes a cleartext proxy for t whose upstream connections are
// this sandbox connection's own (h.mu held); h2c: it speaks HTTP/2 with
// prior knowledge upstream. A connection already closed (a handler that
// started after its end) gets a transport that keeps nothing idle.
func (h *httpConn) newOwnProxy(t target, h2c bool) *httputil.ReverseProxy {
	tr := h.connTransport()
	tr.DisableKeepAlives = h.closed
	if h2c {
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	up := h.up
	tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) { return up.dialTo(ctx, t) }
	h.trs = append(h.trs, tr)
	return h.proxy(t, "http", upHost(t, h.s.dst), tr, false)
}

func (h *httpConn) serve(w http.ResponseWriter, r *http.Request) {
	s := h.s
	host := requestHost(r)
	switch {
	case r.Method == http.MethodConnect:
		h.refuse(w, host, policyRefusal("connect", "CONNECT is not supported: cella is not an explicit proxy, connect to the host directly"))
		return
	case httpguts.HeaderValuesContainsToken(r.Header["Upgrade"], "h2c"):
		// After the 101 the connection would carry HTTP/2 streams that
		// cella never sees, each naming a host of its own.
		h.refuse(w, host, policyRefusal("h2c-upgrade", "an upgrade to h2c is not supported: send HTTP/2 with prior knowledge, or HTTP/1.1"))
		return
	}
	t, key, rp := h.current()
	if t == nil {
		// The first request decides the connection: h2c's concurrent
		// streams wait for it.
		h.decideMu.Lock()
		if t, key, rp = h.current(); t == nil {
			nt, ref := h.p.decideName(r.Context(), s, host, "the Host header")
			if ref != nil {
				h.decideMu.Unlock()
				s.refuse(ref, nt)
				writeRefusal(w, s, ref)
				return
			}
			s.allow(nt)
			// A first request that names only an address, on a fake one,
			// was decided for the fake address's name: later requests may
			// say it.
			k := host
			if k == "" {
				k = nt.name
			}
			h.setTarget(nt, k)
			t, key, rp = h.current()
		}
		h.decideMu.Unlock()
	}
	switch {
	case h.up.tls:
		// Inside TLS every request is for the server name the connection
		// was allowed for, an address included: another name would be
		// answered by whatever else the server hosts (domain fronting).
		if name := normalizeName(stripPort(r.Host)); name != key {
			h.refuse(w, host, policyRefusal("host-mismatch", fmt.Sprintf(
				"this TLS connection was opened for %s (its server name); a request on it for %s would reach another site that shares the server (domain fronting): open a connection to %s itself",
				key, displayName(name), displayName(name))))
			return
		}
	case host != "" && host != key:
		// A connection was allowed for one host: another host on it
		// would skip the decision (and reach whoever shares the address).
		h.refuse(w, host, policyRefusal("host-mismatch", fmt.Sprintf(
			"this connection was opened for %s; a request for %s needs a connection of its own", displayHost(*t), host)))
		return
	}
	// Only r.Host goes upstream; a Host field beside HTTP/2's :authority
	// must not ride along.
	delete(r.Header, "Host")
	if t.name != "" {
		scheme := "http"
		if h.up.tls {
			scheme = "https"
		}
		port := s.dst.Port()
		switch in := s.pol.injectionFor(t.name, scheme, port); {
		case in.refused():
			bound := make([]string, len(in.bound))
			for i, b := range in.bound {
				bound[i] = b.String()
			}
			ref := policyRefusal("rule-binding", fmt.Sprintf(
				"the header rules for %s (rules key %q) apply to %s only, and this request is %s on port %d: cella sends it neither with the rules' headers nor without them (a rule's \"scheme\" and \"port\" say where it applies)",
				t.name, in.key, strings.Join(bound, ", "), scheme, port))
			s.refuse(ref, *t)
			writeRefusal(w, s, ref)
			return
		case len(in.names) > 0:
			if ref := h.p.inject(s, t.name, r.Header, in.names, in.hdrs); ref != nil {
				s.refuse(ref, *t)
				writeRefusal(w, s, ref)
				return
			}
		}
	}
	// The transport must own the request body until it is done with it:
	// otherwise net/http closes it when the answer's header goes out and a
	// fast upstream loses its connection mid-answer (see api/proxy.go).
	_ = http.NewResponseController(w).EnableFullDuplex()
	switch {
	case h.up.tls:
	case r.ProtoMajor == 2:
		rp = h.h2cProxy()
	case !replayable(r):
		rp = h.ownProxy()
	}
	rp.ServeHTTP(w, r)
}

// replayable says whether net/http's transport would send r again on a
// new connection when a reused one fails under it (Request.isReplayable,
// idempotency keys aside): only such requests take pooled connections.
func replayable(r *http.Request) bool {
	if r.Body != nil && r.Body != http.NoBody {
		return false
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// current is the connection's decision so far and its proxy.
func (h *httpConn) current() (*target, string, *httputil.ReverseProxy) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.tgt, h.key, h.rp
}

// refuse reports and answers a request refused before any target.
func (h *httpConn) refuse(w http.ResponseWriter, host string, ref *refusal) {
	h.s.refuse(ref, target{name: host})
	writeRefusal(w, h.s, ref)
}

// requestHost is the normalized name a request is for: "" when it names
// an address or nothing.
func requestHost(r *http.Request) string {
	return hostName(stripPort(r.Host))
}

func stripPort(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

func displayHost(t target) string {
	if t.name != "" {
		return t.name
	}
	if len(t.addrs) > 0 {
		return t.addrs[0].Addr().String()
	}
	return "this address"
}

func displayName(name string) string {
	if name == "" {
		return "no host at all"
	}
	return name
}

// writeRefusal answers a plain-text explanation and ends the connection,
// so that the client does not reuse it for a request that would meet the
// same fate.
func writeRefusal(w http.ResponseWriter, s *session, r *refusal) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Connection", "close")
	w.Header().Set("X-Cella-Egress", "blocked")
	if !r.blocked {
		w.Header().Set("X-Cella-Egress", "upstream-error")
	}
	w.WriteHeader(r.status)
	_, _ = io.WriteString(w, s.redact(r.body()))
}

// connListener hands net/http a single connection.
type connListener struct {
	conn net.Conn
	once sync.Once
	done chan struct{}

	mu     sync.Mutex
	served bool
}

func newConnListener(c net.Conn) *connListener {
	return &connListener{conn: c, done: make(chan struct{})}
}

func (l *connListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if !l.served {
		l.served = true
		l.mu.Unlock()
		return l.conn, nil
	}
	l.mu.Unlock()
	<-l.done
	return nil, net.ErrClosed
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.conn.LocalAddr() }

// dialTLS opens a verified TLS connection to t's name, offering protos in
// ALPN.
func (p *Proxy) dialTLS(ctx context.Context, s *session, t target, protos []string) (*tls.Conn, error) {
	c, err := p.dial(ctx, t.addrs)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(c, &tls.Config{
		ServerName: t.name, RootCAs: p.cfg.UpstreamRootCAs, MinVersion: tls.VersionTLS12,
		NextProtos: protos,
	})
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("TLS with %s at %s failed: %w", t.name, c.RemoteAddr(), err)
	}
	s.setUpstream(c.RemoteAddr().String())
	return tc, nil
}

// The sandbox's pool of idle cleartext HTTP/1 connections. A sandbox's
// clients (pip, curl, an SDK) open a connection per request or per
// package as often as not; the upstream answers keep-alive, and dialing
// it again for each was half the proxy's own work per small GET
// (BenchmarkHTTPGet). So
// the connections to an upstream outlive the sandbox connection that made
// them, for the sandbox's next request to the same place: its own only
// (never another sandbox's: what they carry may include its secrets),
// keyed by where the request was decided to go (upHost), and
// each request is still decided on its own connection before it may take
// one. TLS connections are not pooled: each is made for its sandbox
// connection's handshake.
const (
	// plainIdle bounds a sandbox's idle upstream connections of each kind
	// (by name, by address), all upstreams together (Limits: each is one
	// descriptor of the daemon's, over the two of every connection in use).
	plainIdle = 2
	// defaultUpstreamIdle is how long an idle one is kept: below the
	// shortest keep-alive timeout of common servers (Node's 5 s), so that a
	// request rarely gets a connection its server is closing, which only
	// requests the transport may replay survive.
	defaultUpstreamIdle = 4 * time.Second
)

// targetKey carries a pooled request's decided target to the pool, whose
// new connections dial its addresses (in the request's goroutine, with its
// context: a dial is called off with the sandbox connection that asked).
type targetKey struct{}

// plainPool is sb's pool of connections decided by name (a fake
// address), or by address, made at its first cleartext request.
func (p *Proxy) plainPool(sb *Sandbox, byName bool) *upstreamPool {
	kind := 0
	if byName {
		kind = 1
	}
	sb.plainMu.Lock()
	defer sb.plainMu.Unlock()
	if sb.plain[kind] == nil {
		sb.plain[kind] = &upstreamPool{
			idle: p.cfg.UpstreamIdle,
			dial: func(ctx context.Context, t target) (net.Conn, error) { return p.dial(ctx, t.addrs) },
		}
	}
	return sb.plain[kind]
}

// closePlain closes sb's idle upstream connections (its listener closed).
func (sb *Sandbox) closePlain() {
	sb.plainMu.Lock()
	pools := sb.plain
	sb.plainMu.Unlock()
	for _, u := range pools {
		if u != nil {
			u.close()
		}
	}
}

// copyBuffers are the proxies' copy buffers (httputil's default is a new
// 32 KiB one per request).
var copyBuffers = &bufferPool{sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufferPool) Put(p []byte) { b.p.Put(&p) }
