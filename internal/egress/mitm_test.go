package egress

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const secretValue = "s3cr3t-value-42"

func testSecrets(name string) (string, error) {
	switch name {
	case "TOKEN":
		return secretValue, nil
	case "BROKEN":
		// A secret store whose error quotes another secret's value: the
		// proxy must still not show it.
		return "", fmt.Errorf("vault refused (while holding %s)", secretValue)
	}
	return "", fmt.Errorf("no secret named %s", name)
}

func headerRule(host string, headers map[string]string) map[string][]Rule {
	return map[string][]Rule{host: {{Transform: &Transform{Headers: headers}}}}
}

// recorder is an upstream that remembers the Authorization headers it saw.
type recorder struct {
	mu   sync.Mutex
	auth []string
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec.mu.Lock()
	rec.auth = append(rec.auth, r.Header.Get("Authorization"))
	rec.mu.Unlock()
	w.Header().Set("X-Upstream", "yes")
	fmt.Fprintf(w, "upstream saw host=%s", r.Host)
}

func (rec *recorder) seen() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]string(nil), rec.auth...)
}

func cellaCA(t testing.TB) (*CA, *x509.CertPool) {
	t.Helper()
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca.CertPEM()) {
		t.Fatal("CertPEM is not a PEM certificate")
	}
	return ca, pool
}

func assertNoSecret(t *testing.T, h *harness, more ...string) {
	t.Helper()
	for _, e := range h.snapshot() {
		if s := fmt.Sprintf("%+v", e); strings.Contains(s, secretValue) {
			t.Errorf("event shows the secret: %s", s)
		}
	}
	for _, s := range more {
		if strings.Contains(s, secretValue) {
			t.Errorf("%q shows the secret", s)
		}
	}
}

func TestHeaderInjectionOverHTTPS(t *testing.T) {
	upCA, upRoots := upstreamCA(t)
	rec := &recorder{}
	up := tlsUpstream(t, upCA, rec)
	ca, cellaRoots := cellaCA(t)
	pol := Policy{
		AllowOut: []string{"api.test", "other.test"},
		Rules:    headerRule("api.test", map[string]string{"Authorization": "Bearer ${secret:TOKEN}"}),
	}
	h := newHarness(t, pol, func(c *Config) {
		c.CA, c.UpstreamRootCAs, c.Secrets = ca, upRoots, testSecrets
	})
	h.serveOn(443, up.Listener.Addr().String()) // the rule's default port

	// Two requests on one kept-alive connection; the sandbox trusts only
	// cella's CA, and its own Authorization is replaced.
	raw := h.dial(netip.AddrPortFrom(h.fake("api.test"), 443))
	tc := tls.Client(raw, &tls.Config{ServerName: "api.test", RootCAs: cellaRoots})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake with the interceptor: %v", err)
	}
	if err := tc.ConnectionState().PeerCertificates[0].CheckSignatureFrom(ca.cert); err != nil {
		t.Errorf("leaf not signed by cella's CA: %v", err)
	}
	br := bufio.NewReader(tc)
	var bodies []string
	for i := range 2 {
		fmt.Fprintf(tc, "GET /%d HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer sandbox-own\r\n\r\n", i)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		bodies = append(bodies, string(b))
		if resp.StatusCode != 200 || resp.Header.Get("X-Upstream") != "yes" || string(b) != "upstream saw host=api.test" {
			t.Errorf("request %d: %d %q", i, resp.StatusCode, b)
		}
	}
	if got := rec.seen(); len(got) != 2 || got[0] != "Bearer "+secretValue || got[1] != "Bearer "+secretValue {
		t.Errorf("upstream saw Authorization %q", got)
	}

	// Another host on the intercepted connection is refused.
	fmt.Fprint(tc, "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 403 || !strings.HasPrefix(string(b), blockedPrefix) {
		t.Errorf("other host on intercepted connection: %d %q", resp.StatusCode, b)
	}
	tc.Close()

	e := h.waitEvent("intercepted", allowedFor("api.test"))
	if e.Proto != "tls" || e.Rule != "api.test" || e.Upstream != up.Listener.Addr().String() || e.BytesIn == 0 {
		t.Errorf("event = %+v", e)
	}
	assertNoSecret(t, h, bodies...)

	// A client that does not trust cella's CA fails, and the event says why.
	raw = h.dial(netip.AddrPortFrom(h.fake("api.test"), 443))
	if err := tls.Client(raw, &tls.Config{ServerName: "api.test", RootCAs: upRoots}).Handshake(); err == nil {
		t.Error("a client not trusting cella's CA completed the handshake")
	}
	raw.Close()
	h.waitEvent("untrusted CA", func(e Event) bool {
		return allowedFor("api.test")(e) && strings.Contains(e.Reason, "must trust cella's CA")
	})
}

// TestHeaderRuleBinding: a rule's headers go only where the rule is bound
// (https on 443 by default). A sandbox that asks for the same host in the
// clear, or on another port, is refused with the rule named, and the
// secret reaches no upstream; a rule bound to plain HTTP on a port of its
// own injects there and only there.
func TestHeaderRuleBinding(t *testing.T) {
	upCA, upRoots := upstreamCA(t)
	tlsRec, plainRec := &recorder{}, &recorder{}
	tlsUp := tlsUpstream(t, upCA, tlsRec)
	plainUp := httptest.NewServer(plainRec)
	defer plainUp.Close()
	ca, cellaRoots := cellaCA(t)
	h := newHarness(t, Policy{
		AllowOut: []string{"api.test", "pkg.test"},
		Rules: map[string][]Rule{
			"api.test": {{Transform: &Transform{Headers: map[string]string{"Authorization": "Bearer ${secret:TOKEN}"}}}},
			"pkg.test": {{Transform: &Transform{Headers: map[string]string{"Authorization": "Bearer ${secret:TOKEN}"}}, Scheme: "http", Port: 8080}},
		},
	}, func(c *Config) { c.CA, c.UpstreamRootCAs, c.Secrets = ca, upRoots, testSecrets })
	// Port 443 and 8443 reach the TLS upstream, 80 and 8080 the plain one:
	// only the port the sandbox asked for differs.
	h.serveOn(443, tlsUp.Listener.Addr().String())
	h.serveOn(8443, tlsUp.Listener.Addr().String())
	h.serveOn(80, plainUp.Listener.Addr().String())
	h.serveOn(8080, plainUp.Listener.Addr().String())
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := h.client(cellaRoots).Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	for _, url := range []string{"http://api.test/", "https://api.test:8443/", "http://api.test:443/", "https://pkg.test/", "http://pkg.test/"} {
		st, body := get(url)
		if st != 403 || !strings.Contains(body, "apply to") || !strings.Contains(body, "(rules key ") {
			t.Errorf("%s: %d %q", url, st, body)
		}
	}
	h.waitEvent("http to api.test", blockedFor("api.test", "rule-binding"))
	if got := append(tlsRec.seen(), plainRec.seen()...); len(got) != 0 {
		t.Fatalf("upstreams got requests outside the rules' bindings: %q", got)
	}
	if st, body := get("https://api.test/"); st != 200 || body != "upstream saw host=api.test" {
		t.Errorf("https://api.test/: %d %q", st, body)
	}
	if st, body := get("http://pkg.test:8080/"); st != 200 || body != "upstream saw host=pkg.test:8080" {
		t.Errorf("http://pkg.test:8080/: %d %q", st, body)
	}
	if got := tlsRec.seen(); len(got) != 1 || got[0] != "Bearer "+secretValue {
		t.Errorf("TLS upstream saw %q", got)
	}
	if got := plainRec.seen(); len(got) != 1 || got[0] != "Bearer "+secretValue {
		t.Errorf("plain upstream saw %q", got)
	}
	assertNoSecret(t, h)
}

// TestHTTPSWithoutRuleKeepsItsHeaders: TLS to a host without a rule is
// terminated too, and the sandbox's own headers go through untouched.
func TestHTTPSWithoutRuleKeepsItsHeaders(t *testing.T) {
	upCA, upRoots := upstreamCA(t)
	rec := &recorder{}
	up := tlsUpstream(t, upCA, rec)
	ca, cellaRoots := cellaCA(t)
	h := newHarness(t, Policy{
		AllowOut: []string{"api.test", "other.test"},
		Rules:    headerRule("api.test", map[string]string{"Authorization": "Bearer ${secret:TOKEN}"}),
	}, func(c *Config) { c.CA, c.UpstreamRootCAs, c.Secrets = ca, upRoots, testSecrets })
	req, _ := http.NewRequest("GET", fmt.Sprintf("https://other.test:%d/", port(t, up.URL)), nil)
	req.Header.Set("Authorization", "Bearer sandbox-own")
	resp, err := h.client(cellaRoots).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := rec.seen(); len(got) != 1 || got[0] != "Bearer sandbox-own" {
		t.Errorf("upstream saw %q", got)
	}
}

func TestHeaderInjectionWildcardRule(t *testing.T) {
	upCA, upRoots := upstreamCA(t)
	rec := &recorder{}
	up := tlsUpstream(t, upCA, rec)
	ca, cellaRoots := cellaCA(t)
	h := newHarness(t, Policy{
		AllowOut: []string{"*.pkg.test"},
		Rules:    headerRule("*.pkg.test", map[string]string{"Authorization": "Token ${secret:TOKEN}"}),
	}, func(c *Config) { c.CA, c.UpstreamRootCAs, c.Secrets = ca, upRoots, testSecrets })
	h.serveOn(443, up.Listener.Addr().String())
	resp, err := h.client(cellaRoots).Get("https://b.pkg.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := rec.seen(); len(got) != 1 || got[0] != "Token "+secretValue {
		t.Errorf("upstream saw %q", got)
	}
}

func TestHeaderInjectionOverPlainHTTP(t *testing.T) {
	rec := &recorder{}
	up := httptest.NewServer(rec)
	defer up.Close()
	h := newHarness(t, Policy{
		AllowOut: []string{"pkg.test"},
		Rules: map[string][]Rule{"pkg.test": {{
			Transform: &Transform{Headers: map[string]string{"Authorization": "Bearer ${secret:TOKEN}"}},
			Scheme:    "http", Port: int(port(t, up.URL)),
		}}},
	}, func(c *Config) { c.Secrets = testSecrets })
	resp, err := h.client(nil).Get(fmt.Sprintf("http://pkg.test:%d/", port(t, up.URL)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if got := rec.seen(); len(got) != 1 || got[0] != "Bearer "+secretValue {
		t.Errorf("upstream saw %q", got)
	}
	h.waitEvent("allowed", allowedFor("pkg.test"))
	assertNoSecret(t, h, string(b))
}

func TestMissingSecret(t *testing.T) {
	upCA, upRoots := upstreamCA(t)
	rec := &recorder{}
	up := tlsUpstream(t, upCA, rec)
	ca, cellaRoots := cellaCA(t)
	h := newHarness(t, Policy{
		AllowOut: []string{"api.test", "pkg.test"},
		Rules: map[string][]Rule{
			"api.test": {{Transform: &Transform{Headers: map[string]string{"Authorization": "Bearer ${secret:TOKEN}", "X-Other": "${secret:BROKEN}"}}}},
			"pkg.test": {{Transform: &Transform{Headers: map[string]string{"Authorization": "Bearer ${secret:NOPE}"}}}},
		},
	}, func(c *Config) { c.CA, c.UpstreamRootCAs, c.Secrets = ca, upRoots, testSecrets })
	h.serveOn(443, up.Listener.Addr().String())

	resp, err := h.client(cellaRoots).Get("https://pkg.test/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := blockedPrefix + "the header rule for pkg.test sets Authorization, but secret NOPE is not available: no secret named NOPE"
	if resp.StatusCode != 502 || !strings.HasPrefix(string(b), want) {
		t.Errorf("got %d %q, want 502 %q", resp.StatusCode, b, want)
	}
	h.waitEvent("missing secret", blockedFor("pkg.test", "missing-secret"))

	// The store's error quotes TOKEN's value, resolved just before on the
	// same request: it is shown as [secret:TOKEN].
	resp, err = h.client(cellaRoots).Get("https://api.test/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 502 || !strings.Contains(string(b), "[secret:TOKEN]") {
		t.Errorf("got %d %q", resp.StatusCode, b)
	}
	e := h.waitEvent("broken secret", blockedFor("api.test", "missing-secret"))
	if !strings.Contains(e.Reason, "vault refused (while holding [secret:TOKEN])") {
		t.Errorf("reason = %q", e.Reason)
	}
	if len(rec.seen()) != 0 {
		t.Error("a request without its secret reached the upstream")
	}
	assertNoSecret(t, h, string(b))
}

// TestTLSWithoutCAIsRefused: without its CA the proxy cannot look inside
// TLS, so it carries none to a name.
func TestTLSWithoutCAIsRefused(t *testing.T) {
	h := newHarness(t, Policy{
		AllowOut: []string{"api.test", "other.test"},
		Rules:    headerRule("api.test", map[string]string{"Authorization": "Bearer ${secret:TOKEN}"}),
	}, func(c *Config) { c.CA, c.Secrets = nil, testSecrets })
	for _, name := range []string{"api.test", "other.test"} {
		c := h.dial(netip.AddrPortFrom(h.fake(name), 443))
		if err := tls.Client(c, &tls.Config{ServerName: name}).Handshake(); err == nil {
			t.Errorf("%s: handshake succeeded without a CA", name)
		}
		h.waitEvent("no CA", blockedFor(name, "no-ca"))
	}
}

func TestLoadOrCreateCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "ca-key.pem"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("ca-key.pem: %v, mode %v", err, st.Mode())
	}
	again, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if string(again.CertPEM()) != string(ca.CertPEM()) {
		t.Error("a second load made a new CA")
	}
	if !ca.cert.IsCA || ca.cert.NotAfter.Before(time.Now().Add(365*24*time.Hour)) {
		t.Errorf("CA certificate: IsCA %v, NotAfter %v", ca.cert.IsCA, ca.cert.NotAfter)
	}

	leaf, err := again.leafFor("api.test")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM())
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.test", Roots: pool}); err != nil {
		t.Errorf("leaf does not verify: %v", err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "other.test", Roots: pool}); err == nil {
		t.Error("leaf verifies for another name")
	}
	if d := time.Until(leaf.Leaf.NotAfter); d > 25*time.Hour {
		t.Errorf("leaf valid for %v", d)
	}
	if again2, _ := again.leafFor("api.test"); again2 != leaf {
		t.Error("leaf not cached")
	}

	if err := os.WriteFile(filepath.Join(dir, "ca-key.pem"), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateCA(dir); err == nil || !strings.Contains(err.Error(), "ca-key.pem") {
		t.Errorf("corrupt key: %v", err)
	}
	// A key that is not the certificate's.
	other := t.TempDir()
	if _, err := LoadOrCreateCA(other); err != nil {
		t.Fatal(err)
	}
	key, _ := os.ReadFile(filepath.Join(other, "ca-key.pem"))
	os.WriteFile(filepath.Join(dir, "ca-key.pem"), key, 0o600)
	if _, err := LoadOrCreateCA(dir); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("mismatched key: %v", err)
	}
}

// TestRedactOverlappingSecrets: a secret value that contains another is
// redacted whole, whatever order the values were resolved in, and the same
// every time.
func TestRedactOverlappingSecrets(t *testing.T) {
	const in = "got abcdXYZ, then abcd, then abcdXY"
	const want = "got [secret:B], then [secret:A], then [secret:A]XY"
	for i := range 50 {
		s := &session{}
		if i%2 == 0 {
			s.remember("A", "abcd")
			s.remember("B", "abcdXYZ")
		} else {
			s.remember("B", "abcdXYZ")
			s.remember("A", "abcd")
		}
		s.remember("A", "abcd") // again, as on a kept-alive connection
		if got := s.redact(in); got != want {
			t.Fatalf("round %d: redact = %q, want %q", i, got, want)
		}
	}
	if got := (&session{}).redact(in); got != in {
		t.Errorf("no secrets: redact = %q", got)
	}
	// A secret whose value changes is redacted by its new value.
	s := &session{}
	s.remember("A", "abcd")
	s.remember("A", "wxyz")
	if got := s.redact("abcd wxyz"); got != "abcd [secret:A]" {
		t.Errorf("after a new value: redact = %q", got)
	}
}
