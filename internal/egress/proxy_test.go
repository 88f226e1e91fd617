package egress

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"
)

// neverDialed stands for a public address: tests use it as an original
// destination only when the proxy must refuse before dialing.
var neverDialed = netip.MustParseAddrPort("203.0.113.7:80")

const blockedPrefix = "blocked by cella sandbox policy: "

func hello(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "hello from upstream, host=%s", r.Host)
}

func TestDenyByDefault(t *testing.T) {
	h := newHarness(t, Policy{}, nil)

	// Plain HTTP to a name that is not allowed: a 403 that explains.
	c := h.dial(neverDialed)
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	want := blockedPrefix + "evil.test is not allowed for this sandbox (allowed: nothing (no egress)); an operator can allow it with cella serve --egress-allow HOST"
	if resp.StatusCode != http.StatusForbidden || !strings.HasPrefix(string(body), want) {
		t.Errorf("got %d %q, want 403 %q", resp.StatusCode, body, want)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type = %q", ct)
	}
	e := h.waitEvent("blocked http", blockedFor("evil.test", "no-match"))
	if e.Proto != "http" || e.Kind != "connect" || e.Dst != neverDialed.String() || !strings.Contains(e.Reason, "not allowed") || e.SandboxID != "sb-test" {
		t.Errorf("event = %+v", e)
	}

	// TLS to a server name that is not allowed: closed.
	c = h.dial(netip.MustParseAddrPort("203.0.113.7:443"))
	err = tls.Client(c, &tls.Config{ServerName: "evil.test"}).Handshake()
	if err == nil {
		t.Error("TLS handshake to a blocked name succeeded")
	}
	e = h.waitEvent("blocked tls", func(e Event) bool { return blockedFor("evil.test", "no-match")(e) && e.Proto == "tls" })
	if e.Proto != "tls" || e.Reason == "" {
		t.Errorf("event = %+v", e)
	}

	// Raw TCP to an address that is not allowed: closed.
	c = h.dial(netip.MustParseAddrPort("203.0.113.7:22"))
	fmt.Fprint(c, "SSH-2.0-test\r\n")
	if got := readAll(t, c); got != "" {
		t.Errorf("raw TCP got %q", got)
	}
	e = h.waitEvent("blocked tcp", func(e Event) bool { return e.Decision == "blocked" && e.Proto == "tcp" })
	if e.Dst != "203.0.113.7:22" || !strings.Contains(e.Reason, "203.0.113.7 is not allowed") {
		t.Errorf("event = %+v", e)
	}

	// DNS: nothing resolves.
	if r := h.query("pkg.test", 1, false); r.Rcode != 3 {
		t.Errorf("DNS rcode = %d, want NXDOMAIN", r.Rcode)
	}
}

func TestRefusalListsAllowedEntries(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test", "*.github.test", "10.0.0.0/8"}}, nil)
	c := h.dial(neverDialed)
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	want := blockedPrefix + "evil.test is not allowed for this sandbox (allowed: pkg.test, *.github.test, 10.0.0.0/8); an operator can allow it with cella serve --egress-allow HOST"
	if !strings.HasPrefix(string(body), want) {
		t.Errorf("body = %q, want prefix %q", body, want)
	}
}

func TestAllowedHTTP(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(hello))
	defer up.Close()
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test"}}, nil)

	resp, err := h.client(nil).Get(fmt.Sprintf("http://pkg.test:%d/x", port(t, up.URL)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "hello from upstream, host=pkg.test:") {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	e := h.waitEvent("allowed http", allowedFor("pkg.test"))
	if e.Proto != "http" || e.Rule != "pkg.test" || e.Upstream != up.Listener.Addr().String() || e.BytesOut == 0 || e.BytesIn == 0 {
		t.Errorf("event = %+v", e)
	}
	if !fakeRange.Contains(netip.MustParseAddrPort(e.Dst).Addr()) {
		t.Errorf("Dst %s is not the fake address the sandbox dialed", e.Dst)
	}
}

func TestKeepAliveConnectionKeepsItsHost(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(hello))
	defer up.Close()
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test", "other.test"}}, nil)
	c := h.dial(netip.AddrPortFrom(h.fake("pkg.test"), port(t, up.URL)))
	br := bufio.NewReader(c)
	fmt.Fprint(c, "GET /1 HTTP/1.1\r\nHost: pkg.test\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("first request: %d", resp.StatusCode)
	}
	// Another allowed host on the same connection would skip the address
	// check: refused.
	fmt.Fprint(c, "GET /2 HTTP/1.1\r\nHost: other.test\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 403 || !strings.HasPrefix(string(body), blockedPrefix) {
		t.Errorf("second host: %d %q", resp.StatusCode, body)
	}
	h.waitEvent("host mismatch", blockedFor("other.test", "host-mismatch"))
}

func TestFirstRequestByAddressThenByName(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(hello))
	defer up.Close()
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test"}}, nil)
	dst := netip.AddrPortFrom(h.fake("pkg.test"), port(t, up.URL))
	c := h.dial(dst)
	br := bufio.NewReader(c)
	for _, host := range []string{dst.String(), "pkg.test"} {
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 {
			t.Errorf("Host %s: %d", host, resp.StatusCode)
		}
	}
}

// TestAllowedHTTPSIsTerminated: allowed TLS to a name is terminated with
// cella's CA (what the sandbox sees) and carried over the proxy's own
// verified TLS to the upstream.
func TestAllowedHTTPSIsTerminated(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"*.pkg.test"}}, nil)
	up := tlsUpstream(t, h.upCA, http.HandlerFunc(hello))
	p := port(t, up.URL)

	resp, err := h.client(h.roots).Get(fmt.Sprintf("https://a.pkg.test:%d/", p))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(string(body), "hello from upstream, host=a.pkg.test") {
		t.Fatalf("body = %q", body)
	}
	if resp.TLS.PeerCertificates[0].CheckSignatureFrom(h.cfg.CA.cert) != nil {
		t.Error("the sandbox did not see cella's certificate")
	}
	e := h.waitEvent("allowed tls", allowedFor("a.pkg.test"))
	if e.Proto != "tls" || e.Rule != "*.pkg.test" || e.BytesIn == 0 || e.BytesOut == 0 || e.Upstream != up.Listener.Addr().String() {
		t.Errorf("event = %+v", e)
	}

	// A sandbox that trusts only the upstream's CA, not cella's, fails.
	if _, err := h.client(h.upRoots).Get(fmt.Sprintf("https://a.pkg.test:%d/", p)); err == nil {
		t.Error("a client that does not trust cella's CA got through")
	}

	// The wildcard does not allow its apex, neither by DNS nor by SNI.
	if r := h.query("pkg.test", 1, false); r.Rcode != 3 {
		t.Errorf("DNS pkg.test rcode = %d, want NXDOMAIN", r.Rcode)
	}
	c := h.dial(netip.AddrPortFrom(loopback, p))
	if err := tls.Client(c, &tls.Config{ServerName: "pkg.test", RootCAs: h.roots}).Handshake(); err == nil {
		t.Error("TLS to the wildcard's apex succeeded")
	}
	h.waitEvent("apex blocked", blockedFor("pkg.test", "no-match"))
}

func TestAllowedNameForcedToOtherAddress(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test", "meta.test", "mixed.test"}}, nil)

	// The sandbox pins an allowed name to an address of its choosing.
	c := h.dial(neverDialed)
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: pkg.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 403 || !strings.HasPrefix(string(body), blockedPrefix) || !strings.Contains(string(body), "a sandbox cannot pin an allowed name to another address") {
		t.Errorf("got %d %q", resp.StatusCode, body)
	}
	h.waitEvent("pinned", blockedFor("pkg.test", "pinned-address"))

	// Same over TLS: closed.
	c = h.dial(netip.MustParseAddrPort("203.0.113.7:443"))
	if err := tls.Client(c, &tls.Config{ServerName: "pkg.test"}).Handshake(); err == nil {
		t.Error("pinned TLS succeeded")
	}

	// An allowed name that resolves to the metadata service.
	c = h.dial(netip.AddrPortFrom(h.fake("meta.test"), 80))
	fmt.Fprint(c, "GET /latest/meta-data/ HTTP/1.1\r\nHost: meta.test\r\n\r\n")
	resp, err = http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 403 || !strings.Contains(string(body), "meta.test resolves only to addresses cella never connects to (169.254.1.1 is in 169.254.0.0/16") {
		t.Errorf("got %d %q", resp.StatusCode, body)
	}
	h.waitEvent("hard deny", blockedFor("meta.test", "hard-deny"))

	// Pinned to the hard-denied one of its own addresses.
	c = h.dial(netip.MustParseAddrPort("169.254.1.1:80"))
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: mixed.test\r\n\r\n")
	resp, err = http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 403 || !strings.Contains(string(body), "never connects there") {
		t.Errorf("got %d %q", resp.StatusCode, body)
	}
}

func TestHostMismatchWithFakeAddress(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"*.pkg.test", "pkg.test"}}, nil)
	c := h.dial(netip.AddrPortFrom(h.fake("a.pkg.test"), 80))
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: pkg.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	want := blockedPrefix + "The Host header says pkg.test but the connection was opened to the address cella gave for a.pkg.test"
	if resp.StatusCode != 403 || !strings.HasPrefix(string(body), want) {
		t.Errorf("got %d %q, want %q", resp.StatusCode, body, want)
	}
	h.waitEvent("mismatch", blockedFor("pkg.test", "host-mismatch"))

	// An address cella never gave out.
	c = h.dial(netip.MustParseAddrPort("198.18.200.200:80"))
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: pkg.test\r\n\r\n")
	if got := readAll(t, c); got != "" {
		t.Errorf("unknown fake address got %q", got)
	}
	h.waitEvent("unknown fake", func(e Event) bool { return e.Rule == "unknown-fake-address" })
}

func TestRawTCP(t *testing.T) {
	echo := echoServer(t, "")
	// The banner case below waits out the peek of a client that sends
	// nothing: keep it short (well inside that case's 5 s read deadline).
	h := newHarness(t, Policy{AllowOut: []string{"192.0.2.1/32"}}, func(c *Config) { c.PeekTimeout = 300 * time.Millisecond })
	c := h.dial(public(t, echo))
	fmt.Fprint(c, "ping\n")
	// Half-close: the echo server answers after our EOF, then closes.
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, c); got != "echo: ping\n" {
		t.Errorf("got %q", got)
	}
	e := h.waitEvent("allowed tcp", func(e Event) bool { return e.Decision == "allowed" && e.Proto == "tcp" })
	if e.BytesOut != 5 || e.BytesIn != 11 || e.Rule != "192.0.2.1/32" || e.Upstream != echo || e.Host != "" {
		t.Errorf("event = %+v", e)
	}

	// A server that speaks first: the sandbox sends nothing.
	banner := echoServer(t, "SSH-2.0-upstream\r\n")
	c = h.dial(public(t, banner))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "SSH-2.0-upstream\r\n" {
		t.Errorf("banner = %q, %v", line, err)
	}

	// A name-only policy does not open raw addresses.
	if err := h.sb.SetPolicy(&Policy{AllowOut: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	c = h.dial(public(t, echo))
	fmt.Fprint(c, "ping\n")
	if got := readAll(t, c); got != "" {
		t.Errorf("raw TCP under a name-only policy got %q", got)
	}
}

func TestServerFirstPortIsNotPeeked(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:3306")
	if err != nil {
		t.Skipf("cannot play a MySQL server on 127.0.0.1:3306: %v", err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "mysql-greeting\n")
		io.Copy(io.Discard, c)
	}()
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test"}}, func(c *Config) { c.PeekTimeout = time.Minute })
	c := h.dial(netip.AddrPortFrom(h.fake("pkg.test"), 3306))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); line != "mysql-greeting\n" {
		t.Errorf("greeting = %q, %v (waited for the peek?)", line, err)
	}
}

func TestRawTCPToFakeAddressUsesTheName(t *testing.T) {
	echo := echoServer(t, "")
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test"}}, nil)
	c := h.dial(netip.AddrPortFrom(h.fake("pkg.test"), netip.MustParseAddrPort(echo).Port()))
	fmt.Fprint(c, "ping\n")
	c.(*net.TCPConn).CloseWrite()
	if got := readAll(t, c); got != "echo: ping\n" {
		t.Errorf("got %q", got)
	}
	e := h.waitEvent("allowed tcp by name", allowedFor("pkg.test"))
	if e.Proto != "tcp" || e.Rule != "pkg.test" {
		t.Errorf("event = %+v", e)
	}
}

func TestSetPolicyAppliesToNextConnection(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(hello))
	defer up.Close()
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test"}}, nil)
	url := fmt.Sprintf("http://pkg.test:%d/", port(t, up.URL))
	dst := netip.AddrPortFrom(h.fake("pkg.test"), port(t, up.URL))

	get := func() int {
		c := h.dial(dst)
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: pkg.test\r\nConnection: close\r\n\r\n", url)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if got := get(); got != 200 {
		t.Fatalf("before: %d", got)
	}
	if err := h.sb.SetPolicy(&Policy{AllowOut: []string{"other.test"}}); err != nil {
		t.Fatal(err)
	}
	if got := get(); got != 403 {
		t.Errorf("after narrowing: %d, want 403", got)
	}
	if err := h.sb.SetPolicy(&Policy{AllowOut: []string{"pkg.test"}, DenyOut: []string{"nope nope"}}); err == nil {
		t.Error("SetPolicy accepted an invalid policy")
	}
	if got := h.sb.Policy().AllowOut; len(got) != 1 || got[0] != "other.test" {
		t.Errorf("an invalid SetPolicy replaced the policy: %v", got)
	}
	if err := h.sb.SetPolicy(&Policy{AllowOut: []string{"pkg.test"}}); err != nil {
		t.Fatal(err)
	}
	if got := get(); got != 200 {
		t.Errorf("after widening: %d", got)
	}
	if err := h.sb.SetPolicy(nil); err != nil {
		t.Fatal(err)
	}
	if got := get(); got != 403 {
		t.Errorf("after SetPolicy(nil): %d", got)
	}
}

func TestUpgradeIsCarried(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want upgrade", 400)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprint(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		line, _ := brw.ReadString('\n')
		fmt.Fprint(brw, "echo: "+line)
		brw.Flush()
	}))
	defer up.Close()
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test"}}, nil)
	c := h.dial(netip.AddrPortFrom(h.fake("pkg.test"), port(t, up.URL)))
	fmt.Fprint(c, "GET /ws HTTP/1.1\r\nHost: pkg.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	fmt.Fprint(c, "hi\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := br.ReadString('\n'); line != "echo: hi\n" {
		t.Errorf("after upgrade got %q, %v", line, err)
	}
}

// TestLoopbackOnlyThroughItsMapping: loopback is dialed only for a name an
// operator mapped there, and with a port in the mapping only on that port.
// A name that resolves to 127.0.0.1 through DNS, a mapped name on another
// mapping's port, and a raw loopback address are all refused.
func TestLoopbackOnlyThroughItsMapping(t *testing.T) {
	upA := httptest.NewServer(http.HandlerFunc(hello))
	defer upA.Close()
	upB := httptest.NewServer(http.HandlerFunc(hello))
	defer upB.Close()
	pa, pb := port(t, upA.URL), port(t, upB.URL)
	h := newHarness(t, Policy{AllowOut: []string{"*", "127.0.0.0/8"}}, func(c *Config) {
		c.Mappings = []Mapping{
			{Name: "a.test", Addrs: []netip.AddrPort{netip.AddrPortFrom(loopback, pa)}},
			{Name: "b.test", Addrs: []netip.AddrPort{netip.AddrPortFrom(loopback, pb)}},
		}
	})
	get := func(name string, p uint16) (int, string) {
		t.Helper()
		c := h.dial(netip.AddrPortFrom(h.fake(name), p))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", name)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s:%d: %v", name, p, err)
		}
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	// Each mapped name reaches its own port.
	if st, body := get("a.test", pa); st != 200 || !strings.HasPrefix(body, "hello from upstream") {
		t.Errorf("a.test on its port: %d %q", st, body)
	}
	if st, body := get("b.test", pb); st != 200 {
		t.Errorf("b.test on its port: %d %q", st, body)
	}
	// A mapped name on the other mapping's port.
	if st, body := get("a.test", pb); st != 403 || !strings.Contains(body, fmt.Sprintf("which a.test may reach only on port %d", pa)) {
		t.Errorf("a.test on b.test's port: %d %q", st, body)
	}
	h.waitEvent("a.test on the wrong port", blockedFor("a.test", "hard-deny"))
	// A name DNS resolves to 127.0.0.1, on either mapped port.
	for _, p := range []uint16{pa, pb} {
		st, body := get("dnsloop.test", p)
		if st != 403 || !strings.Contains(body, "loopback (the daemon's host itself), which cella dials only for names an operator maps there") {
			t.Errorf("dnsloop.test:%d: %d %q", p, st, body)
		}
	}
	h.waitEvent("dnsloop.test", blockedFor("dnsloop.test", "hard-deny"))
	// A raw loopback address, even one the policy names.
	c := h.dial(netip.AddrPortFrom(loopback, pa))
	fmt.Fprint(c, "x\n")
	if got := readAll(t, c); got != "" {
		t.Errorf("raw loopback got %q", got)
	}
	h.waitEvent("raw loopback", func(e Event) bool { return e.Rule == "hard-deny" && e.Proto == "tcp" })
}

func TestParseMapping(t *testing.T) {
	for in, want := range map[string]string{
		"pkg.test=127.0.0.1":                      "pkg.test=127.0.0.1",
		" PKG.test. = 127.0.0.1:8080 ":            "pkg.test=127.0.0.1:8080",
		"*.test=127.0.0.1:80,127.0.0.2,[::1]:443": "*.test=127.0.0.1:80,127.0.0.2,[::1]:443",
		"mirror.test=10.0.0.5,10.0.0.6":           "mirror.test=10.0.0.5,10.0.0.6",
	} {
		m, err := ParseMapping(in)
		if err != nil || m.String() != want {
			t.Errorf("ParseMapping(%q) = %v, %v; want %s", in, m, err, want)
		}
	}
	for in, want := range map[string]string{
		"pkg.test":              "want NAME=ADDRESS",
		"=127.0.0.1":            "want NAME=ADDRESS",
		"pkg.test=":             "want NAME=ADDRESS",
		"pkg.test=nope":         "is not an address",
		"pkg.test=10.0.0.5:80":  "a port only scopes a loopback address",
		"pkg.test=127.0.0.1:0":  "port 0",
		"bad name=127.0.0.1":    "name:",
		"pkg.test=fe80::1%eth0": "zone",
	} {
		if _, err := ParseMapping(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseMapping(%q) = %v, want an error with %q", in, err, want)
		}
	}
	if _, err := ParseMappings([]string{"a.test=127.0.0.1", "A.test=127.0.0.2"}); err == nil || !strings.Contains(err.Error(), "mapped twice") {
		t.Errorf("a name mapped twice: %v", err)
	}
	// What a comma-split flag list makes of two mappings with two
	// addresses each.
	ms, err := ParseMappings([]string{"a.test=127.0.0.1:80", "127.0.0.1:81", "b.test=10.0.0.1", "10.0.0.2"})
	if err != nil || len(ms) != 2 || ms[0].String() != "a.test=127.0.0.1:80,127.0.0.1:81" || ms[1].String() != "b.test=10.0.0.1,10.0.0.2" {
		t.Errorf("split lists: %v, %v", ms, err)
	}
	if _, err := ParseMappings([]string{"127.0.0.1"}); err == nil {
		t.Error("an address without a name was accepted")
	}
	// The most specific mapping answers.
	ml := newMappings([]Mapping{
		{Name: "*.test", Addrs: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}},
		{Name: "*.a.test", Addrs: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:2")}},
		{Name: "x.a.test", Addrs: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:3")}},
	})
	for name, want := range map[string]string{"x.a.test": "x.a.test", "y.a.test": "*.a.test", "b.test": "*.test", "a.test": "*.test", "test": ""} {
		got := ""
		if m := ml.lookup(name); m != nil {
			got = m.Name
		}
		if got != want {
			t.Errorf("lookup(%s) = %q, want %q", name, got, want)
		}
	}
}

func TestConfigHardDeny(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test"}}, func(c *Config) {
		c.HardDeny = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	})
	c := h.dial(netip.AddrPortFrom(h.fake("pkg.test"), 80))
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: pkg.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 403 || !strings.Contains(string(body), "127.0.0.0/8, which this cella never lets sandboxes reach") {
		t.Errorf("got %d %q", resp.StatusCode, body)
	}
}

func TestUpstreamFailureIsReported(t *testing.T) {
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := netip.MustParseAddrPort(l.Addr().String())
	l.Close()
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test", "nowhere.test"}}, nil)

	c := h.dial(netip.AddrPortFrom(h.fake("pkg.test"), closed.Port()))
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: pkg.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 502 || !strings.HasPrefix(string(body), "cella egress: pkg.test could not be reached") {
		t.Errorf("got %d %q", resp.StatusCode, body)
	}
	h.waitEvent("dial failure", func(e Event) bool {
		return e.Decision == "allowed" && e.Host == "pkg.test" && strings.Contains(e.Reason, "could not be reached")
	})

	c = h.dial(netip.AddrPortFrom(h.fake("nowhere.test"), 80))
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: nowhere.test\r\n\r\n")
	resp, err = http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 502 || !strings.Contains(string(body), "nowhere.test could not be resolved") {
		t.Errorf("got %d %q", resp.StatusCode, body)
	}
	h.waitEvent("resolve failure", func(e Event) bool {
		return e.Decision == "allowed" && e.Host == "nowhere.test" && e.Rule == "nowhere.test" && strings.Contains(e.Reason, "could not be resolved")
	})
}

func TestServeEndsEverythingWhenListenerCloses(t *testing.T) {
	echo := echoServer(t, "ready\n")
	up := httptest.NewServer(http.HandlerFunc(hello))
	defer up.Close()
	runtime.GC()
	before := runtime.NumGoroutine()

	h := newHarness(t, Policy{AllowOut: []string{"192.0.2.1", "pkg.test"}}, nil)
	// An open spliced connection, an open keep-alive HTTP connection and
	// one that never sends anything.
	raw := h.dial(public(t, echo))
	fmt.Fprint(raw, "x\n")
	_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := bufio.NewReader(raw).ReadString('\n'); line != "ready\n" {
		t.Fatalf("spliced connection not up: %q, %v", line, err)
	}
	httpc := h.dial(netip.AddrPortFrom(h.fake("pkg.test"), port(t, up.URL)))
	fmt.Fprint(httpc, "GET / HTTP/1.1\r\nHost: pkg.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(httpc), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	silent := h.dial(public(t, echo))
	_ = silent

	h.ln.Close()
	select {
	case <-h.serveDone:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its listener closed")
	}
	for _, c := range []net.Conn{raw, httpc} {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(c); err != nil && !isReset(err) {
			t.Errorf("sandbox connection not closed: %v", err)
		}
	}
	h.close()
	raw.Close()
	httpc.Close()
	silent.Close()

	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines left, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Closed connections were reported.
	h.waitEvent("raw closed", func(e Event) bool { return e.Decision == "allowed" && e.Proto == "tcp" && e.BytesOut == 2 })
}

func TestServeAfterCloseReturns(t *testing.T) {
	p := New(Config{})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		p.Serve(ln, &Sandbox{}, nil)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Serve on a closed proxy did not return")
	}
	if _, err := ln.Accept(); err == nil {
		t.Error("the listener was left open")
	}
}

// echoServer answers each connection with banner, then "echo: " and what
// it read until EOF, then closes.
func echoServer(t *testing.T, banner string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveConns(t, l, banner, func(c net.Conn) {
		b, _ := io.ReadAll(c)
		if len(b) > 0 {
			io.WriteString(c, "echo: "+string(b))
		}
	})
}

// serveConns serves each connection ln accepts until the test ends: the
// banner first, then serve; the connection is closed after.
func serveConns(t *testing.T, ln net.Listener, banner string, serve func(net.Conn)) string {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if banner != "" {
					io.WriteString(c, banner)
				}
				serve(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// TestFakeAddressOfAnIPv4LiteralName: "1.2.3.4" is a valid DNS name, so "*"
// lets the sandbox look it up and get a fake address; a connection there is
// still decided as the address 1.2.3.4 (a domain entry never allows a raw
// IP), not allowed by "*" and dialed.
func TestFakeAddressOfAnIPv4LiteralName(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"*"}}, nil)
	c := h.dial(netip.AddrPortFrom(h.fake("1.2.3.4"), 25)) // server-first: no peek
	if got := readAll(t, c); got != "" {
		t.Errorf("got %q", got)
	}
	h.waitEvent("blocked 1.2.3.4", blockedFor("1.2.3.4", "no-match"))
}

// TestConnectionLimits: past its limit a sandbox's connection is closed at
// once and reported with the limit and how to raise it; the other
// sandboxes' share is untouched, and a closed connection frees its place.
func TestConnectionLimits(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test"}}, func(c *Config) {
		c.PeekTimeout = time.Minute // the held connections stay silent
		c.Limits = Limits{PerSandbox: 3, PerSandboxHint: "cella serve --egress-max-conns N", Total: 5, TotalHint: "raise the daemon's open-file limit"}
	})
	fake := netip.AddrPortFrom(h.fake("pkg.test"), 9)
	waitConns := func(sb *Sandbox, n int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for sb.Conns() != n {
			if time.Now().After(deadline) {
				t.Fatalf("%s holds %d connections, want %d", sb.ID, sb.Conns(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	var held []net.Conn
	for range 3 {
		held = append(held, h.dial(fake))
	}
	waitConns(h.sb, 3)
	over := h.dial(fake)
	if got := readAll(t, over); got != "" {
		t.Errorf("a connection past the limit got %q", got)
	}
	e := h.waitEvent("limit", func(e Event) bool { return e.Rule == "connection-limit" })
	if e.Decision != "blocked" || e.Host != "pkg.test" || e.Dst != fake.String() ||
		!strings.Contains(e.Reason, "3 connections open through cella's egress proxy, its limit") || !strings.Contains(e.Reason, "cella serve --egress-max-conns N") {
		t.Errorf("event = %+v", e)
	}
	held[0].Close()
	waitConns(h.sb, 2)
	held[0] = h.dial(fake)
	waitConns(h.sb, 3)

	// A second sandbox on the same proxy has its own share, up to the
	// total.
	other := &Sandbox{ID: "sb-other", Events: h.sb.Events}
	if err := other.SetPolicy(&Policy{AllowOut: []string{"pkg.test"}}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go h.p.Serve(ln, other, h.origDst)
	dialOther := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		h.dsts.Store(c.LocalAddr().String(), netip.MustParseAddrPort("203.0.113.7:9"))
		t.Cleanup(func() { c.Close() })
		return c
	}
	dialOther()
	dialOther()
	waitConns(other, 2)
	if got := readAll(t, dialOther()); got != "" {
		t.Errorf("a connection past the total got %q", got)
	}
	e = h.waitEvent("total", func(e Event) bool { return e.Rule == "daemon-connection-limit" })
	if e.SandboxID != "sb-other" || !strings.Contains(e.Reason, "holds 5 connections for all sandboxes") {
		t.Errorf("event = %+v", e)
	}
	if n := h.p.Conns(); n != 5 {
		t.Errorf("the proxy holds %d connections, want 5", n)
	}
}

// TestDescriptorReserve: a connection whose descriptor number reaches
// MaxFD is refused, whoever used up the descriptors below it.
func TestDescriptorReserve(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test"}}, func(c *Config) {
		c.Limits = Limits{MaxFD: 3, TotalHint: "raise the daemon's open-file limit"}
	})
	c := h.dial(netip.AddrPortFrom(h.fake("pkg.test"), 9))
	if got := readAll(t, c); got != "" {
		t.Errorf("got %q", got)
	}
	e := h.waitEvent("reserve", func(e Event) bool { return e.Rule == "daemon-connection-limit" })
	if !strings.Contains(e.Reason, "running out of file descriptors") || !strings.Contains(e.Reason, "raise the daemon's open-file limit") {
		t.Errorf("event = %+v", e)
	}
}
