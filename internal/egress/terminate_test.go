package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// hostRecorder is an upstream that records the host of every request.
type hostRecorder struct {
	mu    sync.Mutex
	hosts []string
	hdr   []http.Header
	proto []int
}

func (rec *hostRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec.mu.Lock()
	rec.hosts = append(rec.hosts, r.Host)
	rec.hdr = append(rec.hdr, r.Header.Clone())
	rec.proto = append(rec.proto, r.ProtoMajor)
	rec.mu.Unlock()
	fmt.Fprintf(w, "upstream saw host=%s proto=%d", r.Host, r.ProtoMajor)
}

func (rec *hostRecorder) seen() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]string(nil), rec.hosts...)
}

// h2Upstream is an HTTPS upstream that offers h2 and http/1.1.
func h2Upstream(t *testing.T, ca *CA, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		return ca.leafFor(hello.ServerName)
	}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// frontTLS opens TLS to api.test through the proxy, trusting cella's CA.
func frontTLS(t *testing.T, h *harness, p uint16, alpn ...string) *tls.Conn {
	t.Helper()
	tc := tls.Client(h.dial(netip.AddrPortFrom(h.fake("api.test"), p)), &tls.Config{ServerName: "api.test", RootCAs: h.roots, NextProtos: alpn})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	return tc
}

// TestDomainFrontingIsRefused: the server name says an allowed host and the
// requests inside name another. Every way of saying it is refused and the
// upstream (which would route by the inner host) sees none of them.
func TestDomainFrontingIsRefused(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"api.test"}}, func(c *Config) { c.PeekTimeout = 50 * time.Millisecond })
	rec := &hostRecorder{}
	up := h2Upstream(t, h.upCA, rec)
	p := port(t, up.URL)

	for name, req := range map[string]string{
		"Host":           "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"any method":     "FOO / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"absolute URI":   "GET https://evil.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n",
		"address Host":   "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
		"no Host":        "GET / HTTP/1.0\r\n\r\n",
		"blank line":     "\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"second request": "GET / HTTP/1.1\r\nHost: api.test\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
	} {
		tc := frontTLS(t, h, p)
		io.WriteString(tc, req)
		_ = tc.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(tc)
		tc.Close()
		if strings.Contains(string(b), "host=evil.test") || strings.Contains(string(b), "host=127.0.0.1") || !strings.Contains(string(b), " 40") {
			t.Errorf("%s: got %q", name, b)
		}
	}
	h.waitEvent("fronting", blockedFor("evil.test", "host-mismatch"))

	// Slowly, past the peek timeout: "G", a pause, the rest.
	tc := frontTLS(t, h, p)
	io.WriteString(tc, "G")
	time.Sleep(3 * h.cfg.PeekTimeout) // makes the attack stronger, decides nothing
	io.WriteString(tc, "ET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil || resp.StatusCode != 403 {
		t.Errorf("slow request line: %v %v", resp, err)
	}
	tc.Close()

	// HTTP/2: :authority another name.
	client := h.client(h.roots)
	client.Transport.(*http.Transport).ForceAttemptHTTP2 = true
	req, _ := http.NewRequest("GET", fmt.Sprintf("https://api.test:%d/", p), nil)
	req.Host = "evil.test"
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != 403 || !strings.Contains(string(b), "domain fronting") {
		t.Errorf("h2 with :authority evil.test: %s %d %q", resp.Proto, resp.StatusCode, b)
	}

	// HTTP/2: :authority the allowed name and a host field beside it.
	tc = frontTLS(t, h, p, "h2")
	if got := tc.ConnectionState().NegotiatedProtocol; got != "h2" {
		t.Fatalf("ALPN = %q, want h2", got)
	}
	status, body := rawH2Get(t, tc, "api.test", [][2]string{{"host", "evil.test"}})
	if status != "200" || !strings.Contains(body, "host=api.test proto=2") {
		t.Errorf("h2 with a host field: %s %q", status, body)
	}

	// The first request of "second request" and the h2 one with a host
	// field, nothing else.
	if got := rec.seen(); len(got) != 2 || got[0] != "api.test" || got[1] != "api.test" {
		t.Fatalf("the upstream saw hosts %q, want only the allowed one, twice", got)
	}
	rec.mu.Lock()
	for _, hdr := range rec.hdr {
		if _, ok := hdr["Host"]; ok {
			t.Errorf("a Host field reached the upstream: %v", hdr)
		}
	}
	rec.mu.Unlock()

	// The same requests for the allowed name go through, HTTP/1.1 and h2.
	resp, err = client.Get(fmt.Sprintf("https://api.test:%d/", p))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || string(b) != fmt.Sprintf("upstream saw host=api.test:%d proto=2", p) {
		t.Errorf("h2 to api.test: %s %q", resp.Proto, b)
	}
	tc = frontTLS(t, h, p, "http/1.1")
	io.WriteString(tc, "GET / HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n")
	b, _ = io.ReadAll(tc)
	if !strings.Contains(string(b), "upstream saw host=api.test proto=1") {
		t.Errorf("http/1.1 to api.test: %q", b)
	}
}

// rawH2Get sends one HTTP/2 GET with the given :authority and extra header
// fields, which net/http's client would not send, and returns the status
// and body.
func rawH2Get(t *testing.T, c net.Conn, authority string, extra [][2]string) (string, string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range append([][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", authority}, {":path", "/"}}, extra...) {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	var status string
	var body strings.Builder
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("h2 read: %v (status %q body %q)", err, status, body.String())
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 {
				status = f.PseudoValue("status")
				if f.StreamEnded() {
					return status, body.String()
				}
			}
		case *http2.DataFrame:
			if f.StreamID == 1 {
				body.Write(f.Data())
				if f.StreamEnded() {
					return status, body.String()
				}
			}
		case *http2.RSTStreamFrame:
			return "reset " + f.ErrCode.String(), body.String()
		case *http2.GoAwayFrame:
			if status != "" {
				return status, body.String()
			}
		}
	}
}

// tlsEcho is a TLS server for any name that speaks a line protocol: a
// banner first when asked, then "echo: " and each line it reads.
func tlsEcho(t *testing.T, ca *CA, banner string, alpn ...string) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		NextProtos: alpn,
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			return ca.leafFor(hello.ServerName)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return serveConns(t, ln, banner, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			io.WriteString(c, "echo: "+line)
		}
	})
}

// TestTLSCarriesOtherProtocols: inside terminated TLS, what is not HTTP goes
// through as it is, whichever side speaks first, and ALPN is what the
// upstream chose.
func TestTLSCarriesOtherProtocols(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"api.test"}}, nil)
	for _, tc := range []struct {
		name, banner string
		alpn         []string
	}{
		{name: "client first"},
		{name: "server first", banner: "* OK IMAP4rev1 ready\r\n"},
		{name: "own ALPN", alpn: []string{"x-cella-test"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := tlsEcho(t, h.upCA, tc.banner, tc.alpn...)
			c := frontTLS(t, h, netip.MustParseAddrPort(addr).Port(), append(tc.alpn, "h2")...)
			if got := c.ConnectionState().NegotiatedProtocol; len(tc.alpn) > 0 && got != tc.alpn[0] || len(tc.alpn) == 0 && got != "" {
				t.Errorf("ALPN = %q, want what the upstream chose (%q)", got, tc.alpn)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(c)
			if tc.banner != "" {
				if line, err := br.ReadString('\n'); line != tc.banner {
					t.Fatalf("banner = %q, %v", line, err)
				}
			}
			io.WriteString(c, "a1 NOOP\r\n")
			if line, err := br.ReadString('\n'); line != "echo: a1 NOOP\r\n" {
				t.Errorf("echo = %q, %v", line, err)
			}
			c.Close()
		})
	}
}

// TestALPNFollowsTheUpstream: a sandbox offering h2 gets it only from an
// upstream that speaks it.
func TestALPNFollowsTheUpstream(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"api.test"}}, nil)
	rec := &hostRecorder{}
	// http/1.1 only: httptest's TLS server offers h2 only with EnableHTTP2
	// (setting its Config once it serves would race with it).
	h1 := tlsUpstream(t, h.upCA, rec)
	tc := frontTLS(t, h, port(t, h1.URL), "h2", "http/1.1")
	if got := tc.ConnectionState().NegotiatedProtocol; got != "http/1.1" && got != "" {
		t.Errorf("ALPN with an HTTP/1.1 upstream = %q", got)
	}
	tc.Close()
}

// TestGRPCStyleStreaming: HTTP/2 with trailers, as gRPC uses it, end to end.
func TestGRPCStyleStreaming(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"api.test"}}, nil)
	up := h2Upstream(t, h.upCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 || r.Header.Get("Te") != "trailers" {
			http.Error(w, fmt.Sprintf("want h2 with te: trailers, got %s %q", r.Proto, r.Header.Get("Te")), 400)
			return
		}
		w.Header().Set("Trailer", "Grpc-Status")
		w.Header().Set("Content-Type", "application/grpc")
		b, _ := io.ReadAll(r.Body)
		w.Write(append([]byte("echo:"), b...))
		w.Header().Set("Grpc-Status", "0")
	}))
	client := h.client(h.roots)
	client.Transport.(*http.Transport).ForceAttemptHTTP2 = true
	req, _ := http.NewRequest("POST", fmt.Sprintf("https://api.test:%d/pkg.Svc/Call", port(t, up.URL)), strings.NewReader("hi"))
	req.Header.Set("Te", "trailers")
	req.Header.Set("Content-Type", "application/grpc")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || string(b) != "echo:hi" || resp.Trailer.Get("Grpc-Status") != "0" {
		t.Errorf("got %s %d %q trailer %v", resp.Proto, resp.StatusCode, b, resp.Trailer)
	}
}

// TestUpstreamCertificateIsVerified: the proxy verifies the upstream, so a
// sandbox reaching an upstream with a certificate nobody trusts gets no
// connection, and the event says why.
func TestUpstreamCertificateIsVerified(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"api.test"}}, nil)
	rogue, _ := upstreamCA(t)
	up := tlsUpstream(t, rogue, http.HandlerFunc(hello))
	if _, err := h.client(h.roots).Get(fmt.Sprintf("https://api.test:%d/", port(t, up.URL))); err == nil {
		t.Error("a sandbox reached an upstream with an untrusted certificate")
	}
	h.waitEvent("bad upstream certificate", func(e Event) bool {
		return allowedFor("api.test")(e) && strings.Contains(e.Reason, "certificate")
	})
}

// TestPlainHTTPSlowOrOddIsStillHTTP: in the clear too, a request line with
// an unusual method, or sent slowly, is checked like any other.
func TestPlainHTTPSlowOrOddIsStillHTTP(t *testing.T) {
	rec := &hostRecorder{}
	up := httptest.NewServer(rec)
	defer up.Close()
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test"}}, func(c *Config) { c.PeekTimeout = 50 * time.Millisecond })
	p := port(t, up.URL)
	for _, parts := range [][]string{
		{"FOO / HTTP/1.1\r\nHost: other.test\r\n\r\n"},
		{"G", "ET / HTTP/1.1\r\nHost: other.test\r\n\r\n"},
	} {
		c := h.dial(netip.AddrPortFrom(h.fake("pkg.test"), p))
		for i, part := range parts {
			if i > 0 {
				time.Sleep(3 * h.cfg.PeekTimeout) // makes the attack stronger, decides nothing
			}
			io.WriteString(c, part)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 403 {
			t.Errorf("%q: %v %v", parts, resp, err)
		}
	}
	h.waitEvent("odd method", blockedFor("other.test", "host-mismatch"))
	if got := rec.seen(); len(got) != 0 {
		t.Errorf("the upstream saw %q", got)
	}
	// h2c with prior knowledge is HTTP too, and goes upstream as h2c.
	c := h.dial(netip.AddrPortFrom(h.fake("pkg.test"), p))
	status, body := rawH2Get(t, c, "other.test", nil)
	if status != "403" {
		t.Errorf("h2c for another host: %s %q", status, body)
	}
	up2 := httptest.NewUnstartedServer(rec)
	up2.Config.Protocols = new(http.Protocols)
	up2.Config.Protocols.SetUnencryptedHTTP2(true)
	up2.Start()
	defer up2.Close()
	c = h.dial(netip.AddrPortFrom(h.fake("pkg.test"), port(t, up2.URL)))
	status, body = rawH2Get(t, c, "pkg.test", nil)
	if status != "200" || !strings.Contains(body, "proto=2") {
		t.Errorf("h2c to pkg.test: %s %q", status, body)
	}

}

// TestNothingUncheckedAfterSilence: a sandbox that says nothing past the
// peek timeout is decided by its destination, but what it sends first is
// still looked at: an HTTP request or a TLS hello after a pause is checked
// like any other, and one sent after the server spoke first (so no HTTP
// server) is refused.
func TestNothingUncheckedAfterSilence(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"api.test", "pkg.test"}}, func(c *Config) { c.PeekTimeout = 50 * time.Millisecond })
	rec := &hostRecorder{}
	plain := httptest.NewServer(rec)
	defer plain.Close()
	pause := func() { time.Sleep(3 * h.cfg.PeekTimeout) } // makes the attack stronger, decides nothing

	// Plain HTTP after a pause, for another host.
	c := h.dial(netip.AddrPortFrom(h.fake("pkg.test"), port(t, plain.URL)))
	pause()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 403 {
		t.Errorf("HTTP after a pause: %v %v", resp, err)
	}
	// TLS after a pause: terminated, its requests held to its name.
	up := h2Upstream(t, h.upCA, rec)
	raw := h.dial(netip.AddrPortFrom(h.fake("api.test"), port(t, up.URL)))
	pause()
	tc := tls.Client(raw, &tls.Config{ServerName: "api.test", RootCAs: h.roots})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("TLS after a pause: %v", err)
	}
	io.WriteString(tc, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(tc), nil); err != nil || resp.StatusCode != 403 {
		t.Errorf("fronting in TLS after a pause: %v %v", resp, err)
	}
	// A server that speaks first, then a request from the sandbox: in the
	// clear, and inside TLS.
	banner := echoServer(t, "220 ready\r\n")
	c = h.dial(netip.AddrPortFrom(h.fake("pkg.test"), netip.MustParseAddrPort(banner).Port()))
	br := bufio.NewReader(c)
	if line, err := br.ReadString('\n'); line != "220 ready\r\n" {
		t.Fatalf("banner: %q %v", line, err)
	}
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	if got := readAll(t, c); got != "" {
		t.Errorf("a request after the server spoke got %q", got)
	}
	tlsBanner := tlsEcho(t, h.upCA, "* OK ready\r\n")
	tc = frontTLS(t, h, netip.MustParseAddrPort(tlsBanner).Port())
	br = bufio.NewReader(tc)
	if line, err := br.ReadString('\n'); line != "* OK ready\r\n" {
		t.Fatalf("TLS banner: %q %v", line, err)
	}
	io.WriteString(tc, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	_ = tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, _ := io.ReadAll(br); len(b) != 0 {
		t.Errorf("a request inside TLS after the server spoke got %q", b)
	}
	h.waitEvent("unchecked", func(e Event) bool {
		return e.Rule == "unchecked-request" && e.Decision == "blocked" && e.Proto == "tls"
	})
	h.waitEvent("unchecked in the clear", func(e Event) bool { return e.Rule == "unchecked-request" && e.Proto == "tcp" })
	for _, host := range rec.seen() {
		if host != "api.test" {
			t.Errorf("an upstream saw a request for %q", host)
		}
	}
}
