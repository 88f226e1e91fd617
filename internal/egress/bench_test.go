package egress

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
)

// BenchmarkHTTPGet is one small GET per new connection from a sandbox to
// an allowed name's fake address, as `cella bench egress`'s client sends
// it: the proxy's own cost per connection (decision, upstream dial,
// forwarding), without a sandbox's network in the way.
func BenchmarkHTTPGet(b *testing.B) {
	h := newHarness(b, Policy{AllowOut: []string{"pkg.test"}}, nil)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) }))
	b.Cleanup(up.Close)
	h.serveOn(80, up.Listener.Addr().String())
	dst := netip.AddrPortFrom(h.fake("pkg.test"), 80)
	h.everyDst.Store(&dst)
	req := []byte("GET / HTTP/1.1\r\nHost: pkg.test\r\nAccept-Encoding: identity\r\n\r\n")
	for b.Loop() {
		c, err := net.Dial("tcp", h.ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			b.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
			b.Fatalf("GET through the proxy: %s %q %v", resp.Status, body, err)
		}
		_ = c.Close()
	}
}
