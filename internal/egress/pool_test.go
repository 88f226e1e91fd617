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
// for a name, never a request the policy no longer allows; a sandbox
// whose listener closes leaves no upstream connection open.
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
	byName := netip.AddrPortFrom(h.fake("pkg.test"), 80)

	// The same sandbox, three connections by name: one upstream connection.
	for i := 1; i <= 3; i++ {
		if code, resp := h.sandboxGet(h.ln, h.sb, byName, "pkg.test", "one", i); code != http.StatusOK {
			t.Fatalf("GET %d by name: %s", i, resp)
		}
	}
	if c := up.conns(); len(c) != 3 || c[1] != c[0] || c[2] != c[0] {
		t.Errorf("three requests of one sandbox came on upstream connections %v, want one", c)
	}
	pooled := up.conns()[0]
	// A request with a body, which a transport does not send again when a
	// reused connection fails under it, gets a connection of its own.
	post := "POST / HTTP/1.1\r\nHost: pkg.test\r\nX-Who: one\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody"
	if code, resp := h.sandboxSend(h.ln, h.sb, byName, post, 4); code != http.StatusOK {
		t.Fatalf("POST by name: %s", resp)
	}
	if c := up.conns(); c[3] == pooled {
		t.Errorf("a POST took a pooled connection: %v", c)
	}

	// Decided for an address (the same upstream port): another connection,
	// also after a name that reads as that address.
	literal := netip.AddrPortFrom(h.fake("192.0.2.7"), 80)
	if code, resp := h.sandboxGet(h.ln, h.sb, literal, "192.0.2.7", "one", 5); code != http.StatusOK {
		t.Fatalf("GET of the name 192.0.2.7: %s", resp)
	}
	if code, resp := h.sandboxGet(h.ln, h.sb, netip.MustParseAddrPort("192.0.2.7:80"), "192.0.2.7", "one", 6); code != http.StatusOK {
		t.Fatalf("GET by address: %s", resp)
	}
	if c := up.conns(); c[5] == pooled || c[5] == c[4] {
		t.Errorf("a request decided for an address took the connection of a name's: %v", c)
	}

	// Another port of the name: another connection.
	h.serveOn(8080, up.srv.Listener.Addr().String())
	if code, resp := h.sandboxGet(h.ln, h.sb, netip.AddrPortFrom(byName.Addr(), 8080), "pkg.test:8080", "one", 7); code != http.StatusOK {
		t.Fatalf("GET of port 8080: %s", resp)
	}
	if c := up.conns(); c[6] == pooled {
		t.Errorf("a request to port 8080 took a connection to port 80: %v", c)
	}
	// Names on an address the sandbox picked itself (not through cella's
	// DNS): each connection keeps its upstream connections to itself.
	pinned := netip.MustParseAddrPort("127.0.0.1:80")
	if code, resp := h.sandboxGet(h.ln, h.sb, pinned, "pkg.test", "one", 8); code != http.StatusOK {
		t.Fatalf("GET of pkg.test pinned to 127.0.0.1: %s", resp)
	}
	if code, resp := h.sandboxGet(h.ln, h.sb, pinned, "api.test", "one", 9); code != http.StatusOK {
		t.Fatalf("GET of api.test pinned to 127.0.0.1: %s", resp)
	}
	if c := up.conns(); c[8] == c[7] || c[8] == pooled {
		t.Errorf("requests for two names pinned to one address came on one upstream connection: %v", c)
	}

	// Another sandbox allowed the same name, with another secret: never a
	// connection of the first one's.
	rules2 := map[string][]Rule{"pkg.test": {{Transform: &Transform{Headers: map[string]string{"Authorization": "Bearer ${secret:TWO}"}}, Scheme: "http", Port: 80}}}
	sb2, ln2 := h.secondSandbox("sb-two", Policy{AllowOut: []string{"pkg.test"}, Rules: rules2})
	fake2, err := sb2.fakes.assign(sb2.ID, "pkg.test")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 2; i++ {
		if code, resp := h.sandboxGet(ln2, sb2, netip.AddrPortFrom(fake2, 80), "pkg.test", "two", i); code != http.StatusOK {
			t.Fatalf("the second sandbox's GET %d: %s", i, resp)
		}
	}
	up.mu.Lock()
	reqs := slices.Clone(up.reqs)
	up.mu.Unlock()
	var ones, twos []string
	for i, r := range reqs {
		want := "Bearer value-of-ONE"
		switch {
		case r.who == "two":
			want = "Bearer value-of-TWO"
			twos = append(twos, r.conn)
		case i == 4 || i == 5 || i == 8:
			want = "" // not pkg.test: no rule
			ones = append(ones, r.conn)
		default:
			ones = append(ones, r.conn)
		}
		if r.auth != want {
			t.Errorf("request %d (%s's) carried Authorization %q, want %q", i, r.who, r.auth, want)
		}
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
