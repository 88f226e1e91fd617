package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

var loopback = netip.MustParseAddr("127.0.0.1")

// testNames are the tests' mappings (--egress-resolve): everything maps
// to loopback except meta.test, which plays a name pointing at the
// metadata service and is never dialed.
var testNames = map[string][]netip.Addr{
	"pkg.test":   {loopback},
	"a.pkg.test": {loopback},
	"b.pkg.test": {loopback},
	"api.test":   {loopback},
	"other.test": {loopback},
	"meta.test":  {netip.MustParseAddr("169.254.1.1")},
	"mixed.test": {netip.MustParseAddr("169.254.1.1"), loopback},
}

// publicStandIn is where tests put raw upstream addresses the proxy may
// dial (it never dials loopback by address): the harness's dialer reaches
// the same port on loopback instead.
var publicStandIn = netip.MustParsePrefix("192.0.2.0/24")

// public is the stand-in of a loopback server's address.
func public(t *testing.T, loopbackAddr string) netip.AddrPort {
	t.Helper()
	ap := netip.MustParseAddrPort(loopbackAddr)
	return netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), ap.Port())
}

// dnsNames are what the tests' resolver (DNS) knows: dnsloop.test plays a
// public name that points at 127.0.0.1. Any other name does not resolve.
var dnsNames = map[string][]netip.Addr{
	"dnsloop.test": {loopback},
}

func testMappings() []Mapping {
	var ms []Mapping
	for name, addrs := range testNames {
		m := Mapping{Name: name}
		for _, a := range addrs {
			m.Addrs = append(m.Addrs, netip.AddrPortFrom(a, 0))
		}
		ms = append(ms, m)
	}
	return ms
}

// harness runs a proxy for one sandbox the way the daemon would: a TCP
// listener standing in for the slot's redirect target and a UDP socket for
// its DNS, both on loopback. The sandbox's original destinations are
// whatever each test says it dialed.
type harness struct {
	t   testing.TB
	p   *Proxy
	sb  *Sandbox
	ln  net.Listener
	pc  net.PacketConn
	cfg Config

	dsts sync.Map // client local address -> netip.AddrPort it "dialed"
	// everyDst, when set, is every connection's destination (a
	// benchmark's: no registration to wait for).
	everyDst atomic.Pointer[netip.AddrPort]
	// ports redirects upstream dials by port (uint16 -> loopback address),
	// so that a test server plays port 443 or 80.
	ports sync.Map

	// roots trust cella's CA (what a sandbox trusts); upCA plays the public
	// PKI of TLS upstreams, which the proxy trusts.
	roots   *x509.CertPool
	upCA    *CA
	upRoots *x509.CertPool

	mu     sync.Mutex
	events []Event

	serveDone, dnsDone chan struct{}
}

func newHarness(t testing.TB, pol Policy, tweak func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, serveDone: make(chan struct{}), dnsDone: make(chan struct{})}
	var ca *CA
	ca, h.roots = cellaCA(t)
	h.upCA, h.upRoots = upstreamCA(t)
	h.cfg = Config{
		CA:              ca,
		UpstreamRootCAs: h.upRoots,
		Mappings:        testMappings(),
		Resolver: func(ctx context.Context, host string) ([]netip.Addr, error) {
			addrs, ok := dnsNames[host]
			if !ok || len(addrs) == 0 {
				return nil, fmt.Errorf("lookup %s: no such host", host)
			}
			return addrs, nil
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ap, err := netip.ParseAddrPort(addr)
			if to, ok := h.ports.Load(ap.Port()); ok && err == nil {
				addr = to.(string)
				ap = netip.MustParseAddrPort(addr)
			}
			if err == nil && publicStandIn.Contains(ap.Addr()) {
				// A raw address the proxy may dial: the test's server on
				// loopback plays it.
				addr = netip.AddrPortFrom(loopback, ap.Port()).String()
				ap = netip.AddrPortFrom(loopback, ap.Port())
			}
			if err != nil || !ap.Addr().IsLoopback() {
				t.Errorf("the proxy dialed %s: tests must only reach loopback", addr)
				return nil, errors.New("test: non-loopback dial refused")
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		OperatorHint: "cella serve --egress-allow HOST",
		// Long enough that a client stalled by a loaded machine is not
		// mistaken for raw TCP; tests that need the peek to run out (a
		// silent client of a server that speaks first) set a short one.
		PeekTimeout: 2 * time.Second,
	}
	if tweak != nil {
		tweak(&h.cfg)
	}
	h.p = New(h.cfg)
	h.sb = &Sandbox{ID: "sb-test", Events: func(e Event) {
		h.mu.Lock()
		h.events = append(h.events, e)
		h.mu.Unlock()
	}}
	if err := h.sb.SetPolicy(&pol); err != nil {
		t.Fatal(err)
	}
	var err error
	if h.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if h.pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(h.serveDone)
		h.p.Serve(h.ln, h.sb, h.origDst)
	}()
	go func() {
		defer close(h.dnsDone)
		h.p.ServeDNS(h.pc, h.sb)
	}()
	t.Cleanup(h.close)
	return h
}

func (h *harness) close() {
	_ = h.p.Close()
	for _, c := range []chan struct{}{h.serveDone, h.dnsDone} {
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			h.t.Error("Serve or ServeDNS did not return after Close")
		}
	}
}

// serveOn has the proxy's dials to port p reach the server at addr.
func (h *harness) serveOn(p uint16, addr string) { h.ports.Store(p, addr) }

// origDst plays SO_ORIGINAL_DST. The client registers its destination
// right after connecting, so the proxy may ask a moment before.
func (h *harness) origDst(c net.Conn) (netip.AddrPort, error) {
	if dst := h.everyDst.Load(); dst != nil {
		return *dst, nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if v, ok := h.dsts.Load(c.RemoteAddr().String()); ok {
			return v.(netip.AddrPort), nil
		}
		time.Sleep(time.Millisecond)
	}
	return netip.AddrPort{}, errors.New("test: no destination registered")
}

// dial opens a sandbox connection to dst.
func (h *harness) dial(dst netip.AddrPort) net.Conn {
	h.t.Helper()
	c, err := net.Dial("tcp", h.ln.Addr().String())
	if err != nil {
		h.t.Fatal(err)
	}
	h.dsts.Store(c.LocalAddr().String(), dst)
	h.t.Cleanup(func() { c.Close() })
	return c
}

// query sends one DNS query to ServeDNS.
func (h *harness) query(name string, qtype uint16, edns bool) *dns.Msg {
	h.t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	if edns {
		m.SetEdns0(1232, false)
	}
	c := &dns.Client{Net: "udp", Timeout: 5 * time.Second}
	r, _, err := c.Exchange(m, h.pc.LocalAddr().String())
	if err != nil {
		h.t.Fatalf("DNS %s %s: %v", dns.TypeToString[qtype], name, err)
	}
	return r
}

// fake resolves name through the sandbox's DNS, as a sandbox would.
func (h *harness) fake(name string) netip.Addr {
	h.t.Helper()
	r := h.query(name, dns.TypeA, false)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		h.t.Fatalf("A %s = %s with %d answers", name, dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	a, _ := netip.AddrFromSlice(r.Answer[0].(*dns.A).A)
	return a.Unmap()
}

// client is an HTTP client inside the sandbox: it looks names up through
// the sandbox's DNS and connects to what it got, through the proxy.
func (h *harness) client(roots *x509.CertPool) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			Proxy:             nil,
			DisableKeepAlives: true,
			TLSClientConfig:   &tls.Config{RootCAs: roots},
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				host, port, err := net.SplitHostPort(addr)
				if err != nil {
					return nil, err
				}
				p, _ := strconv.Atoi(port)
				ip, err := netip.ParseAddr(host)
				if err != nil {
					r := h.query(host, dns.TypeA, false)
					if r.Rcode != dns.RcodeSuccess {
						return nil, fmt.Errorf("lookup %s: %s", host, dns.RcodeToString[r.Rcode])
					}
					ip, _ = netip.AddrFromSlice(r.Answer[0].(*dns.A).A)
					ip = ip.Unmap()
				}
				return h.dial(netip.AddrPortFrom(ip, uint16(p))), nil
			},
		},
	}
}

func (h *harness) snapshot() []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Event(nil), h.events...)
}

// waitEvent waits for an event matching ok; allowed connections report
// when they close, a moment after the client sees the end.
func (h *harness) waitEvent(what string, ok func(Event) bool) Event {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, e := range h.snapshot() {
			if ok(e) {
				return e
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.t.Fatalf("no event %s; got %+v", what, h.snapshot())
	return Event{}
}

func blockedFor(host, rule string) func(Event) bool {
	return func(e Event) bool {
		return e.Kind == "connect" && e.Decision == "blocked" && e.Host == host && e.Rule == rule
	}
}

func allowedFor(host string) func(Event) bool {
	return func(e Event) bool { return e.Kind == "connect" && e.Decision == "allowed" && e.Host == host }
}

// readAll reads a refused connection to its end.
func readAll(t *testing.T, c net.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil && !isReset(err) {
		t.Fatalf("read: %v", err)
	}
	return string(b)
}

func isReset(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "connection reset") || errors.Is(err, net.ErrClosed))
}

func port(t *testing.T, u string) uint16 {
	t.Helper()
	i := strings.LastIndex(u, ":")
	p, err := strconv.Atoi(strings.TrimRight(u[i+1:], "/"))
	if err != nil {
		t.Fatalf("no port in %s", u)
	}
	return uint16(p)
}

// upstreamCA plays the public web PKI for the tests' TLS upstreams.
func upstreamCA(t testing.TB) (*CA, *x509.CertPool) {
	t.Helper()
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM())
	return ca, pool
}

// tlsUpstream is an HTTPS server on loopback presenting a certificate for
// whatever name the client asks for, signed by ca.
func tlsUpstream(t *testing.T, ca *CA, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		return ca.leafFor(hello.ServerName)
	}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}
