package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// connLog is a cleartext upstream that records which of its connections
// each request came on (by the client's address), and which closed.
type connLog struct {
	srv *httptest.Server

	mu     sync.Mutex
	reqs   []seenReq
	closed map[string]bool // conn -> closed
}

type seenReq struct{ who, conn, auth string }

func newConnLog(t *testing.T) *connLog {
	l := &connLog{closed: map[string]bool{}}
	l.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.reqs = append(l.reqs, seenReq{r.Header.Get("X-Who"), r.RemoteAddr, r.Header.Get("Authorization")})
		l.mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	}))
	l.srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateClosed || st == http.StateHijacked {
			l.mu.Lock()
			l.closed[c.RemoteAddr().String()] = true
			l.mu.Unlock()
		}
	}
	l.srv.Start()
	t.Cleanup(l.srv.Close)
	return l
}

// conns is the upstream connection of each request so far.
func (l *connLog) conns() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.reqs {
		out = append(out, r.conn)
	}
	return out
}

func (l *connLog) allClosed() (bool, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.reqs {
		if !l.closed[r.conn] {
			return false, r.conn + " is open"
		}
	}
	return true, ""
}

// sandboxGet sends one GET as who on a new connection of the sandbox
// served on ln to dst, and waits until the proxy reported the connection
// done (its n-th allowed one): by then the proxy is through with the
// upstream connection the request used, so whether the next request may
// take it does not hang on timing.
func (h *harness) sandboxGet(ln net.Listener, sb *Sandbox, dst netip.AddrPort, host, who string, n int) (int, string) {
	h.t.Helper()
	return h.sandboxSend(ln, sb, dst, fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\nX-Who: %s\r\nConnection: close\r\n\r\n", host, who), n)
}

// sandboxSend is sandboxGet for any request.
func (h *harness) sandboxSend(ln net.Listener, sb *Sandbox, dst netip.AddrPort, req string, n int) (int, string) {
	h.t.Helper()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		h.t.Fatal(err)
	}
	h.dsts.Store(c.LocalAddr().String(), dst)
	defer c.Close()
	_, _ = io.WriteString(c, req)
	// Bounded, so that a proxy that wrongly keeps the connection open (a
	// tunnel) fails the test instead of hanging it.
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	raw, _ := io.ReadAll(c)
	resp := string(raw)
	code := 0
	_, _ = fmt.Sscanf(resp, "HTTP/1.1 %d", &code)
	if code == http.StatusOK {
		h.waitAllowed(sb, n)
	}
	return code, resp
}

// waitAllowed waits for sb's n-th allowed connection to be reported.
func (h *harness) waitAllowed(sb *Sandbox, n int) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := 0
		for _, e := range h.snapshot() {
			if e.SandboxID == sb.ID && e.Kind == "connect" && e.Decision == "allowed" {
				got++
			}
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: %d allowed connections reported, want %d", sb.ID, got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// secondSandbox serves another sandbox on the harness's proxy, with its
// own listener and policy, reporting to the same event log.
func (h *harness) secondSandbox(id string, pol Policy) (*Sandbox, net.Listener) {
	h.t.Helper()
	sb := &Sandbox{ID: id, Events: h.sb.Events}
	if err := sb.SetPolicy(&pol); err != nil {
		h.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.p.Serve(ln, sb, h.origDst)
	}()
	h.t.Cleanup(func() { ln.Close(); <-done })
	return sb, ln
}

// TestHTTPUpstreamPool: a sandbox's cleartext requests to the same place
// share idle upstream connections across its own connections — and
// nothing else does: never another sandbox's (whose requests carry its
// own secrets), never a request decided for an address with one decided
// for a name, another port, a request the transport could not send again
// (a body, or a method that is not idempotent), a name on an address the
// sandbox chose itself, or a request the policy no longer allows; a
// sandbox whose listener closes leaves no upstream connection open.
func TestHTTPUpstreamPool(t *testing.T) {
	secrets := func(name string) (string, error) { return "value-of-" + name, nil }
	one := &Transform{Headers: map[string]string{"Authorization": "Bearer ${secret:ONE}"}}
	rules := map[string][]Rule{"pkg.test": {{Transform: one, Scheme: "http", Port: 80}, {Transform: one, Scheme: "http", Port: 8080}}}
	// ("*" lets the sandbox look up a name that reads as an address.)
	// Idle connections are kept for an hour here: only the sandbox's end
	// may close them before the test ends.
	h := newHarness(t, Policy{AllowOut: []string{"*", "192.0.2.0/24"}, Rules: rules}, func(c *Config) {
		c.Secrets, c.UpstreamIdle = secrets, time.Hour
		// A name that reads as an address, mapped elsewhere.
		c.Mappings = append(c.Mappings, Mapping{Name: "192.0.2.7", Addrs: []netip.AddrPort{netip.AddrPortFrom(loopback, 0)}})
	})
	up := newConnLog(t)
	h.serveOn(80, up.srv.Listener.Addr().String())
	h.serveOn(8080, up.srv.Listener.Addr().String())
	byName := netip.AddrPortFrom(h.fake("pkg.test"), 80)

	// Each request of the first sandbox, with the Authorization its rules
	// give it: sent one after the other, each on a new connection, and
	// answered with the upstream connection it came on.
	var wantAuth []string
	allowed := 0
	send := func(what string, dst netip.AddrPort, req, auth string) string {
		t.Helper()
		allowed++
		if code, resp := h.sandboxSend(h.ln, h.sb, dst, req, allowed); code != http.StatusOK {
			t.Fatalf("%s: %s", what, resp)
		}
		wantAuth = append(wantAuth, auth)
		c := up.conns()
		return c[len(c)-1]
	}
	get := func(host string) string {
		return fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\nX-Who: one\r\nConnection: close\r\n\r\n", host)
	}
	const ruled = "Bearer value-of-ONE"

	// Three connections by name: one upstream connection.
	pooled := send("GET 1 by name", byName, get("pkg.test"), ruled)
	for i := 2; i <= 3; i++ {
		if c := send(fmt.Sprintf("GET %d by name", i), byName, get("pkg.test"), ruled); c != pooled {
			t.Errorf("GET %d of one sandbox by name came on upstream connection %s, the first on %s", i, c, pooled)
		}
	}
	// Another sandbox allowed the same name, with another secret: never a
	// connection of the first one's (asked while the first's is idle).
	rules2 := map[string][]Rule{"pkg.test": {{Transform: &Transform{Headers: map[string]string{"Authorization": "Bearer ${secret:TWO}"}}, Scheme: "http", Port: 80}}}
	sb2, ln2 := h.secondSandbox("sb-two", Policy{AllowOut: []string{"pkg.test"}, Rules: rules2})
	fake2, err := sb2.fakes.assign(sb2.ID, "pkg.test")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 2; i++ {
		req := "GET / HTTP/1.1\r\nHost: pkg.test\r\nX-Who: two\r\nConnection: close\r\n\r\n"
		if code, resp := h.sandboxSend(ln2, sb2, netip.AddrPortFrom(fake2, 80), req, i); code != http.StatusOK {
			t.Fatalf("the second sandbox's GET %d: %s", i, resp)
		}
	}
	// Requests a transport does not send again when a reused connection
	// fails under it get connections of their own.
	for _, req := range []string{
		"POST / HTTP/1.1\r\nHost: pkg.test\r\nX-Who: one\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody",
		"DELETE / HTTP/1.1\r\nHost: pkg.test\r\nX-Who: one\r\nConnection: close\r\n\r\n",
	} {
		method, _, _ := strings.Cut(req, " ")
		if c := send(method+" by name", byName, req, ruled); c == pooled {
			t.Errorf("a %s took a pooled connection", method)
		}
	}
	// Decided for an address (the same upstream port): another connection,
	// also after a name that reads as that address.
	literal := send("GET of the name 192.0.2.7", netip.AddrPortFrom(h.fake("192.0.2.7"), 80), get("192.0.2.7"), "")
	if c := send("GET by address", netip.MustParseAddrPort("192.0.2.7:80"), get("192.0.2.7"), ""); c == pooled || c == literal {
		t.Errorf("a request decided for an address took the connection of a name's (%s, %s): %s", pooled, literal, c)
	}
	// Another port of the name: another connection.
	if c := send("GET of port 8080", netip.AddrPortFrom(byName.Addr(), 8080), get("pkg.test:8080"), ruled); c == pooled {
		t.Errorf("a request to port 8080 took a connection to port 80: %s", c)
	}
	// The name on one of its addresses that the sandbox picked itself (not
	// through cella's DNS): its requests keep their connections to
	// themselves, neither taking the name's pooled one nor leaving one for
	// the next.
	pinned := netip.MustParseAddrPort("127.0.0.1:80")
	first := send("GET of pkg.test pinned to 127.0.0.1", pinned, get("pkg.test"), ruled)
	if c := send("a second GET of pkg.test pinned to 127.0.0.1", pinned, get("pkg.test"), ruled); c == first || first == pooled {
		t.Errorf("requests for a name pinned to an address shared upstream connections: pooled %s, then %s and %s", pooled, first, c)
	}

	up.mu.Lock()
	reqs := slices.Clone(up.reqs)
	up.mu.Unlock()
	var ones, twos []string
	for _, r := range reqs {
		if r.who == "two" {
			twos = append(twos, r.conn)
			if r.auth != "Bearer value-of-TWO" {
				t.Errorf("the second sandbox's request carried Authorization %q", r.auth)
			}
			continue
		}
		if i := len(ones); i < len(wantAuth) && r.auth != wantAuth[i] {
			t.Errorf("request %d of the first sandbox carried Authorization %q, want %q", i+1, r.auth, wantAuth[i])
		}
		ones = append(ones, r.conn)
	}
	if len(ones) != len(wantAuth) {
		t.Errorf("the upstream got %d requests of the first sandbox, want %d", len(ones), len(wantAuth))
	}
	for _, c := range twos {
		if slices.Contains(ones, c) {
			t.Errorf("the second sandbox's request came on an upstream connection of the first's: %v / %v", ones, twos)
		}
	}
	if len(twos) != 2 || twos[0] != twos[1] {
		t.Errorf("the second sandbox's two requests came on %v, want one connection of its own", twos)
	}

	// The policy narrowed: the next connection is refused though an idle
	// upstream connection to the name is at hand.
	if err := h.sb.SetPolicy(&Policy{}); err != nil {
		t.Fatal(err)
	}
	before := len(up.conns())
	if code, resp := h.sandboxGet(h.ln, h.sb, byName, "pkg.test", "one", 0); code == http.StatusOK {
		t.Errorf("a GET after the policy was emptied: %s", resp)
	}
	if n := len(up.conns()); n != before {
		t.Errorf("the refused request reached the upstream (%d requests, %d before)", n, before)
	}

	// The sandboxes' listeners close (their sandboxes went): every upstream
	// connection closes with them.
	h.ln.Close()
	ln2.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		ok, why := up.allClosed()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the sandboxes' listeners closed: %s", why)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHTTPPoolDialEndsWithItsConnection: a dial of the sandbox's pool that
// its sandbox connection gave up on is called off, not left running
// outside the connection limits until its own timeout.
func TestHTTPPoolDialEndsWithItsConnection(t *testing.T) {
	dialing, ended := make(chan struct{}, 1), make(chan error, 1)
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test"}}, func(c *Config) {
		dial := c.Dial
		c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if !strings.HasSuffix(addr, ":81") {
				return dial(ctx, network, addr)
			}
			dialing <- struct{}{}
			<-ctx.Done() // an upstream that drops connection attempts
			ended <- ctx.Err()
			return nil, ctx.Err()
		}
	})
	c, err := net.Dial("tcp", h.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	h.dsts.Store(c.LocalAddr().String(), netip.AddrPortFrom(h.fake("pkg.test"), 81))
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: pkg.test:81\r\n\r\n")
	<-dialing
	c.Close()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Errorf("the dial for a connection that closed ended with %v, want it called off (%v)", err, context.Canceled)
	}
}
