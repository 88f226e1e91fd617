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
	"sync"
	"time"
)

// discardLog keeps net/http's per-connection complaints (a sandbox that
// hangs up mid-request) out of the daemon's log; events carry what
// matters.
var discardLog = log.New(io.Discard, "", 0)

// httpConn proxies the HTTP/1.x requests of one sandbox connection, in
// the clear or inside intercepted TLS.
type httpConn struct {
	p      *Proxy
	s      *session
	scheme string

	mu  sync.Mutex
	key string  // the host every request must name ("" for an address)
	tgt *target // set by the first allowed request, or by the TLS decision
	rp  *httputil.ReverseProxy
	tr  *http.Transport
}

// serveHTTP runs net/http's server on the one connection so that framing,
// keep-alive, 100-continue and upgrades behave as the client expects. With
// fixed (intercepted TLS) the host was decided by the server name;
// otherwise the first request's Host decides and later ones must match.
func (p *Proxy) serveHTTP(ctx context.Context, s *session, conn net.Conn, fixed *target, scheme string) {
	h := &httpConn{p: p, s: s, scheme: scheme}
	if fixed != nil {
		h.setTarget(*fixed, fixed.name)
	}
	ln := newConnListener(conn)
	var handlers sync.WaitGroup
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			handlers.Add(1)
			defer handlers.Done()
			h.serve(w, r)
		}),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          discardLog,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		// HTTP/1.1 only: h2 would need its own framing here, and ALPN
		// already offered only http/1.1 when intercepting.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
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
	tr := h.tr
	h.mu.Unlock()
	if tr != nil {
		tr.CloseIdleConnections()
	}
}

func (h *httpConn) setTarget(t target, key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.key, h.tgt = key, &t
	h.tr = &http.Transport{
		Proxy: nil, // never the daemon's HTTP_PROXY
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := h.p.dial(ctx, t.addrs)
			if err != nil {
				return nil, err
			}
			h.s.setUpstream(c.RemoteAddr().String())
			return c, nil
		},
		TLSClientConfig: &tls.Config{
			ServerName: t.name, RootCAs: h.p.cfg.UpstreamRootCAs, MinVersion: tls.VersionTLS12,
			NextProtos: []string{"http/1.1"}, // some servers refuse a handshake without ALPN
		},
		TLSHandshakeTimeout:   handshakeTimeout,
		DisableCompression:    true, // pass Accept-Encoding and bodies through as sent
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	upHost := t.name
	if upHost == "" {
		upHost = t.addrs[0].Addr().String()
	}
	upHost = net.JoinHostPort(upHost, strconv.Itoa(int(h.s.dst.Port())))
	h.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = h.scheme
			pr.Out.URL.Host = upHost
			pr.Out.Host = pr.In.Host
		},
		Transport:     h.tr,
		FlushInterval: -1, // stream (server-sent events, LLM token streams)
		ErrorLog:      discardLog,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			msg := fmt.Sprintf("%s could not be reached: %v", displayHost(t), err)
			h.s.setReason(msg)
			writeRefusal(w, h.s, &refusal{status: http.StatusBadGateway, msg: msg})
		},
	}
}

func (h *httpConn) serve(w http.ResponseWriter, r *http.Request) {
	s := h.s
	if r.Method == http.MethodConnect {
		ref := policyRefusal("connect", "CONNECT is not supported: cella is not an explicit proxy, connect to the host directly")
		s.refuse(ref, target{name: requestHost(r)})
		writeRefusal(w, s, ref)
		return
	}
	h.mu.Lock()
	t, key, rp := h.tgt, h.key, h.rp
	h.mu.Unlock()
	host := requestHost(r)
	switch {
	case t == nil:
		nt, ref := h.p.decideName(r.Context(), s, host, "the Host header")
		if ref != nil {
			s.refuse(ref, nt)
			writeRefusal(w, s, ref)
			return
		}
		s.allow(nt)
		// A first request that names only an address, on a fake one, was
		// decided for the fake address's name: later requests may say it.
		key := host
		if key == "" {
			key = nt.name
		}
		h.setTarget(nt, key)
		t = &nt
		h.mu.Lock()
		rp = h.rp
		h.mu.Unlock()
	case host != "" && host != key:
		// A connection was allowed for one host: another host on it
		// would skip the decision (and reach whoever shares the address).
		ref := policyRefusal("host-mismatch", fmt.Sprintf(
			"this connection was opened for %s; a request for %s needs a connection of its own", displayHost(*t), host))
		s.refuse(ref, target{name: host})
		writeRefusal(w, s, ref)
		return
	}
	if t.name != "" {
		if names, hdrs := s.pol.headersFor(t.name); len(names) > 0 {
			if ref := h.p.inject(s, t.name, r.Header, names, hdrs); ref != nil {
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
