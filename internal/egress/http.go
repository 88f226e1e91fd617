package egress

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
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
	h2c *httputil.ReverseProxy // in the clear, for h2c requests: h2c upstream
	trs []*http.Transport
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
	newTransport := func() *http.Transport {
		tr := &http.Transport{
			Proxy:               nil,  // never the daemon's HTTP_PROXY
			DisableCompression:  true, // pass Accept-Encoding and bodies through as sent
			MaxIdleConnsPerHost: 2,
			// One sandbox connection opens about one upstream connection:
			// Limits count two descriptors per connection.
			MaxConnsPerHost:       2,
			IdleConnTimeout:       90 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
		if h.up.tls {
			// The connections are TLS already: h2 when their ALPN says so.
			tr.DialTLSContext = h.up.dial
			tr.ForceAttemptHTTP2 = true
		} else {
			tr.DialContext = h.up.dial
		}
		return tr
	}
	tr := newTransport()
	trs := []*http.Transport{tr}
	upHost := t.name
	if upHost == "" {
		upHost = t.addrs[0].Addr().String()
	}
	upHost = net.JoinHostPort(upHost, strconv.Itoa(int(h.s.dst.Port())))
	scheme := "http"
	if h.up.tls {
		scheme = "https"
	}
	proxy := func(tr http.RoundTripper) *httputil.ReverseProxy {
		return &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.Out.URL.Scheme = scheme
				pr.Out.URL.Host = upHost
				pr.Out.Host = pr.In.Host
			},
			Transport:     tr,
			FlushInterval: -1, // stream (server-sent events, LLM token streams, gRPC)
			ErrorLog:      discardLog,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				msg := fmt.Sprintf("%s could not be reached: %v", displayHost(t), err)
				h.s.setReason(msg)
				writeRefusal(w, h.s, &refusal{status: http.StatusBadGateway, msg: msg})
			},
		}
	}
	rp := proxy(tr)
	var h2c *httputil.ReverseProxy
	if !h.up.tls {
		// A sandbox that speaks h2c gets h2c upstream: it may need
		// HTTP/2 itself (gRPC without TLS).
		t2 := newTransport()
		t2.Protocols = new(http.Protocols)
		t2.Protocols.SetUnencryptedHTTP2(true)
		trs = append(trs, t2)
		h2c = proxy(t2)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.key, h.tgt, h.rp, h.h2c, h.trs = key, &t, rp, h2c, trs
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
	t, key, rp := h.current(r)
	if t == nil {
		// The first request decides the connection: h2c's concurrent
		// streams wait for it.
		h.decideMu.Lock()
		if t, key, rp = h.current(r); t == nil {
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
			t, key, rp = h.current(r)
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
	rp.ServeHTTP(w, r)
}

// current is the connection's decision so far and the proxy for r.
func (h *httpConn) current(r *http.Request) (*target, string, *httputil.ReverseProxy) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.ProtoMajor == 2 && h.h2c != nil {
		return h.tgt, h.key, h.h2c
	}
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
