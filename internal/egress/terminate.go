package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"
)

// terminate ends the sandbox's TLS for an allowed server name with a leaf
// of the proxy's CA and carries what is inside over the proxy's own
// verified TLS to the name, so that every HTTP request inside can be held
// to the server name: spliced, a request for another name would reach
// whatever else the server hosts (domain fronting), and a header rule
// needs the requests anyway.
//
// The upstream handshake comes first, offering the ALPN protocols the
// sandbox offered, and the sandbox's handshake then completes with the
// protocol the upstream chose: h2 stays h2 (gRPC), http/1.1 stays
// http/1.1, anything else stays what it was. After both handshakes:
//
//   - h2: served as HTTP/2 request by request.
//   - otherwise whoever speaks first decides. The sandbox: its first line
//     is read (see sniffLine), and HTTP is served request by request,
//     anything else is spliced in the clear between the two TLS sessions.
//     The upstream (a server-speaks-first protocol such as IMAPS): spliced.
//     No timeout decides anything: bytes sent slowly are still looked at.
func (p *Proxy) terminate(ctx context.Context, s *session, t target, client net.Conn) {
	if p.cfg.CA == nil {
		s.refuse(policyRefusal("no-ca", fmt.Sprintf(
			"cella holds the requests inside TLS to %s to its server name, which needs its interception CA, and this cella has none", t.name)), t)
		return
	}
	s.allow(t)
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	var up *tls.Conn
	var upErr error
	tc := tls.Server(client, &tls.Config{
		MinVersion:             tls.VersionTLS12,
		SessionTicketsDisabled: true,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			up, upErr = p.dialTLS(hctx, s, t, hello.SupportedProtos)
			if upErr != nil {
				return nil, upErr
			}
			leaf, err := p.cfg.CA.leafFor(t.name)
			if err != nil {
				upErr = err
				return nil, err
			}
			cfg := &tls.Config{MinVersion: tls.VersionTLS12, SessionTicketsDisabled: true, Certificates: []tls.Certificate{*leaf}}
			if proto := up.ConnectionState().NegotiatedProtocol; proto != "" {
				cfg.NextProtos = []string{proto}
			}
			return cfg, nil
		},
	})
	err := tc.HandshakeContext(hctx)
	cancel()
	if up != nil {
		defer up.Close()
	}
	switch {
	case upErr != nil:
		s.setReason(upErr.Error())
		return
	case err != nil:
		s.setReason(fmt.Sprintf("TLS interception of %s failed, the sandbox must trust cella's CA: %v", t.name, err))
		return
	}
	alpn := tc.ConnectionState().NegotiatedProtocol
	if alpn == "h2" {
		p.serveHTTP(ctx, s, tc, &t, &upstreamConns{p: p, s: s, tls: true, protos: []string{"h2"}, first: up})
		return
	}
	cp, upc := newPeekConn(tc, nil), newPeekConn(up, nil)
	select {
	case <-cp.ready:
		_ = tc.SetReadDeadline(time.Now().Add(handshakeTimeout))
		kind, err := sniffLine(cp.br)
		_ = tc.SetReadDeadline(time.Time{})
		switch {
		case err != nil:
			p.refuseStalled(s, err)
			return
		case kind == sniffHTTP:
			p.serveHTTP(ctx, s, cp, &t, &upstreamConns{p: p, s: s, tls: true, protos: []string{"http/1.1"}, first: upc})
			return
		}
	case <-upc.ready:
		// A server that speaks first is no HTTP server: what it says goes
		// through, and a request the sandbox sends it is refused.
		splice(cp, &gatedReader{c: cp, s: s}, upc)
		return
	case <-ctx.Done():
		return
	}
	splice(cp, cp, upc)
}

// peekConn waits, in the background, for the first bytes of a connection,
// so that whoever speaks first can be told; reads get what it buffered.
type peekConn struct {
	net.Conn
	br    *bufio.Reader
	ready chan struct{} // closed once the first bytes (or an error) came
}

// newPeekConn starts waiting on c, through br if it has one already.
func newPeekConn(c net.Conn, br *bufio.Reader) *peekConn {
	if br == nil {
		br = bufio.NewReaderSize(c, peekBufSize)
	}
	pc := &peekConn{Conn: c, br: br, ready: make(chan struct{})}
	go func() {
		defer close(pc.ready)
		_, _ = pc.br.Peek(1)
	}()
	return pc
}

func (c *peekConn) Read(b []byte) (int, error) {
	<-c.ready
	return c.br.Read(b)
}

func (c *peekConn) CloseWrite() error { return closeWrite(c.Conn) }

// gatedReader reads the sandbox's side of a connection whose server spoke
// first, but looks at the sandbox's first bytes before passing any on: an
// HTTP request line or a TLS hello there would be taken by whatever server
// is behind the address without cella checking it, so it ends the
// connection instead.
type gatedReader struct {
	c      *peekConn
	s      *session
	passed bool
}

var errUnchecked = errors.New("egress: a request cella cannot check")

func (g *gatedReader) Read(b []byte) (int, error) {
	if !g.passed {
		g.passed = true
		<-g.c.ready
		if kind, err := sniff(g.c.br); err == nil && kind != sniffRaw {
			g.s.refuse(policyRefusal("unchecked-request",
				"the server spoke first, so this is no HTTP or TLS connection, and then the sandbox sent what an HTTP or TLS server would take for a request: closed, since cella cannot check it"),
				target{name: g.s.fakeName})
			return 0, errUnchecked
		}
	}
	return g.c.Read(b)
}
