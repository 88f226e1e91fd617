package egress

// Fuzz targets of what a sandbox or a request controls here: the policy
// JSON of a create request, the DNS packets a sandbox sends, and the first
// bytes of its connections. `go test` runs the seeds below and the corpora
// in testdata/fuzz; `go test -run=^$ -fuzz=FuzzNarrow -fuzztime=60s
// ./internal/egress/` explores further. Each checks properties, not only
// the absence of a panic.

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

var policySeeds = []string{
	``,
	`null`,
	`{}`,
	`{"allowOut":["pkg.test","*.github.test"],"denyOut":["0.0.0.0/0"],"allowPublicTraffic":false}`,
	`{"allowOut":["*"],"denyOut":["evil.test","10.9.0.0/16"]}`,
	`{"allowOut":["10.0.0.0/8","1.1.1.1","::ffff:10.0.0.0/104","2001:db8::/32"]}`,
	`{"allowOut":["Mixed.Case.Test.","*.deep.github.test"],"allowInternetAccess":true}`,
	`{"allowInternetAccess":true,"denyOut":["*"]}`,
	`{"rules":{"api.test":[{"transform":{"headers":{"Authorization":"Bearer ${secret:TOKEN}","X-Id":"${e2b.secrets.ID}"}}}]}}`,
	`{"rules":{"*.api.test":[{},{"transform":{}},{"transform":{"headers":{"x-a":"1","X-A":"2"}}}]}}`,
	`{"allowOut":["169.254.169.254"]}`,
	`{"allowOut":["fe80::1%eth0"]}`,
	`{"allowOut":["a.*.test","*.*.test","bücher.test",""]}`,
	`{"rules":{"api.test":[{"transform":{"headers":{"Content-Length":"1"}}}]}}`,
	`{"rules":{"10.0.0.1":[{}]}}`,
	`{"allowOut":[1]}`,
	`[1]`,
}

// FuzzParsePolicy: a policy ParsePolicy accepts validates, describes
// itself, and reads back from its own JSON as the same policy (what the
// store keeps and PUT .../network re-sends).
func FuzzParsePolicy(f *testing.F) {
	for _, s := range policySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePolicy(data)
		if err != nil {
			if p.AllowOut != nil || p.DenyOut != nil || p.Rules != nil {
				t.Fatalf("ParsePolicy failed (%v) but returned %+v", err, p)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("ParsePolicy accepted %q, which Validate refuses: %v", data, err)
		}
		if s := p.Summary(); !strings.HasPrefix(s, "allowed: ") || strings.Contains(s, "invalid") {
			t.Fatalf("Summary of a valid policy = %q", s)
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("marshal %+v: %v", p, err)
		}
		q, err := ParsePolicy(b)
		if err != nil {
			t.Fatalf("the JSON of a valid policy (%s) does not parse: %v", b, err)
		}
		if !reflect.DeepEqual(canonical(p), canonical(q)) {
			t.Fatalf("round trip changed the policy:\n%+v\n%+v", p, q)
		}
		if !reflect.DeepEqual(canonical(clonePolicy(p)), canonical(p)) {
			t.Fatalf("clonePolicy changed %+v", p)
		}
	})
}

// FuzzNarrow: what Narrow returns for two valid policies is valid, allows
// nothing the ceiling does not (by every probe the entries suggest), keeps
// the ceiling's denies and header rules, and allows nothing the request
// did not ask for when it listed entries; a refusal names a request entry
// that really is outside.
func FuzzNarrow(f *testing.F) {
	for i, s := range policySeeds {
		f.Add([]byte(s), []byte(policySeeds[(i+3)%len(policySeeds)]), "api.pkg.test")
	}
	f.Add([]byte(`{"allowOut":["*.a.test"]}`), []byte(`{"allowOut":["*.test"]}`), "x.a.test")
	f.Add([]byte(`{"allowOut":["a.test"]}`), []byte(`{"allowOut":["*.a.test"]}`), "a.test")
	f.Add([]byte(`{"allowOut":["10.1.0.0/16"]}`), []byte(`{"allowOut":["10.0.0.0/8"],"denyOut":["10.1.2.0/24"]}`), "10.1.2.3")
	f.Add([]byte(`{"allowOut":["::ffff:10.1.0.0/112"]}`), []byte(`{"allowOut":["10.1.0.0/16"]}`), "10.1.0.1")
	f.Add([]byte(`{"allowInternetAccess":true}`), []byte(`{"allowOut":["*","0.0.0.0/0"],"denyOut":["evil.test"]}`), "evil.test")
	f.Add([]byte(`{"rules":{"API.test":[{}]}}`), []byte(`{"allowOut":["*"],"rules":{"api.test":[{"transform":{"headers":{"X-Op":"1"}}}]}}`), "api.test")
	f.Fuzz(func(t *testing.T, reqJSON, ceilJSON []byte, probe string) {
		req, err1 := ParsePolicy(reqJSON)
		ceil, err2 := ParsePolicy(ceilJSON)
		if err1 != nil || err2 != nil {
			return
		}
		out, err := req.Narrow(ceil)
		if err != nil {
			var oc *OutsideCeilingError
			if !errors.As(err, &oc) {
				t.Fatalf("Narrow of two valid policies failed with %v", err)
			}
			if !slices.Contains(entryTextsOf(t, req.AllowOut), oc.Entry) {
				t.Fatalf("refusal names %q, which is not an allowOut entry of the request %+v", oc.Entry, req)
			}
			if _, err := (Policy{AllowOut: []string{oc.Entry}}).Narrow(ceil); err == nil {
				t.Fatalf("entry %q refused, but alone it narrows %+v", oc.Entry, ceil)
			}
			return
		}
		if err := out.Validate(); err != nil {
			t.Fatalf("Narrow returned an invalid policy %+v: %v", out, err)
		}
		for _, d := range entryTextsOf(t, ceil.DenyOut) {
			if !slices.Contains(out.DenyOut, d) {
				t.Fatalf("ceiling deny %q dropped: %+v", d, out)
			}
		}
		// Narrowing again under the same ceiling changes nothing.
		again, err := out.Narrow(ceil)
		if err != nil {
			t.Fatalf("the narrowed policy %+v is outside its own ceiling: %v", out, err)
		}
		if !slices.Equal(again.AllowOut, out.AllowOut) {
			t.Fatalf("narrowing twice: %v, then %v", out.AllowOut, again.AllowOut)
		}
		for _, h := range probes(req, ceil, out, probe) {
			if ok, rule := out.AllowsHost(h); ok {
				if cok, crule := ceil.AllowsHost(h); !cok {
					t.Fatalf("Narrow(%+v, ceiling %+v) = %+v allows %q (by %s), which the ceiling does not (%s)", req, ceil, out, h, rule, crule)
				}
				if len(req.AllowOut) > 0 {
					if rok, _ := req.AllowsHost(h); !rok {
						t.Fatalf("Narrow(%+v) = %+v allows %q, which the request did not ask for", req, out, h)
					}
				}
			}
		}
		// The operator's header rules cannot be replaced.
		for k, rs := range ceil.Rules {
			got, ok := out.Rules[normalizeName(k)]
			if !ok {
				t.Fatalf("ceiling rules for %q dropped: %+v", k, out.Rules)
			}
			if !reflect.DeepEqual(got, rs) && !sameKeyElsewhere(ceil.Rules, k, got) {
				t.Fatalf("ceiling rules for %q replaced: %+v, want %+v", k, got, rs)
			}
		}
	})
}

// FuzzWithin: the part of a policy a ceiling allows (a fork or restore
// under a smaller key) is valid, allows exactly what both allow (by every
// probe the entries suggest), is within the ceiling as Narrow sees it, and
// is its own part: taking it again changes nothing.
func FuzzWithin(f *testing.F) {
	for i, s := range policySeeds {
		f.Add([]byte(s), []byte(policySeeds[(i+5)%len(policySeeds)]), "api.pkg.test")
	}
	f.Add([]byte(`{"allowOut":["*"]}`), []byte(`{"allowOut":["github.com","*.pkg.test"]}`), "x.pkg.test")
	f.Add([]byte(`{"allowOut":["*.a.test","b.test","10.0.0.0/8"]}`), []byte(`{"allowOut":["*.test","10.1.0.0/16"],"denyOut":["x.a.test"]}`), "y.a.test")
	f.Add([]byte(`{"allowOut":["10.1.2.3"],"denyOut":["*"]}`), []byte(`{"allowOut":["0.0.0.0/0"]}`), "10.1.2.3")
	f.Add([]byte(`{"allowOut":["a.test"],"rules":{"a.test":[{}]}}`), []byte(`{"allowOut":["*"],"rules":{"A.test":[{"transform":{"headers":{"X-Op":"1"}}}]}}`), "a.test")
	f.Fuzz(func(t *testing.T, polJSON, ceilJSON []byte, probe string) {
		p, err1 := ParsePolicy(polJSON)
		ceil, err2 := ParsePolicy(ceilJSON)
		if err1 != nil || err2 != nil {
			return
		}
		out, err := p.Within(ceil)
		if err != nil {
			t.Fatalf("Within of two valid policies failed: %v", err)
		}
		if err := out.Validate(); err != nil {
			t.Fatalf("Within returned an invalid policy %+v: %v", out, err)
		}
		if len(out.AllowOut) > 0 {
			if _, err := (Policy{AllowOut: out.AllowOut}).Narrow(ceil); err != nil {
				t.Fatalf("Within(%+v, %+v) = %+v is not within the ceiling: %v", p, ceil, out, err)
			}
		}
		for _, h := range probes(p, ceil, out, probe) {
			ok, _ := out.AllowsHost(h)
			pok, _ := p.AllowsHost(h)
			cok, _ := ceil.AllowsHost(h)
			if ok != (pok && cok) {
				t.Fatalf("Within(%+v, ceiling %+v) = %+v: %q allowed %v, by the policy %v, by the ceiling %v", p, ceil, out, h, ok, pok, cok)
			}
		}
		again, err := out.Within(ceil)
		if err != nil || !reflect.DeepEqual(canonical(again), canonical(out)) {
			t.Fatalf("Within twice: %+v, then %+v (%v)", out, again, err)
		}
		for k, rs := range ceil.Rules {
			if got, ok := out.Rules[k]; !ok || !reflect.DeepEqual(got, rs) {
				t.Fatalf("ceiling rules for %q replaced: %+v", k, out.Rules)
			}
		}
	})
}

// sameKeyElsewhere: two ceiling keys that differ only in case name one
// host; one of their rule lists wins.
func sameKeyElsewhere(rules map[string][]Rule, k string, got []Rule) bool {
	for k2, rs := range rules {
		if k2 != k && normalizeName(k2) == normalizeName(k) && reflect.DeepEqual(rs, got) {
			return true
		}
	}
	return false
}

// FuzzAllowsHost: a decision is case-insensitive, names the entry that
// made it, only allows valid names, and an IP literal is decided as the
// address it is.
func FuzzAllowsHost(f *testing.F) {
	for _, s := range policySeeds {
		for _, h := range []string{"pkg.test", "a.github.test", "10.1.2.3", "PKG.TEST.", "evil.test", "::ffff:10.0.0.1", "169.254.169.254", "a\x00.pkg.test", ""} {
			f.Add([]byte(s), h)
		}
	}
	f.Fuzz(func(t *testing.T, polJSON []byte, host string) {
		p, err := ParsePolicy(polJSON)
		if err != nil {
			return
		}
		if n := normalizeName(host); normalizeName(n) != n {
			t.Fatalf("normalizeName(%q) = %q, normalized again %q", host, n, normalizeName(n))
		}
		ok, rule := p.AllowsHost(host)
		if ok {
			if !slices.Contains(entryTextsOf(t, p.AllowOut), rule) {
				t.Fatalf("AllowsHost(%q) allowed by %q, not an allowOut entry of %+v", host, rule, p)
			}
			if _, err := netip.ParseAddr(host); err != nil && checkDomain(normalizeName(host)) != nil {
				t.Fatalf("AllowsHost allowed %q, which is neither an address nor a valid name", host)
			}
		} else if !slices.Contains(entryTextsOf(t, p.DenyOut), rule) && !slices.Contains([]string{"no-match", "invalid-name"}, rule) && !strings.HasPrefix(rule, "hard-deny:") {
			t.Fatalf("AllowsHost(%q) refused with %q, neither a denyOut entry nor a reason code", host, rule)
		}
		if uok, urule := p.AllowsHost(asciiUpper(host)); uok != ok || urule != rule {
			t.Fatalf("AllowsHost(%q) = %v %q but AllowsHost(%q) = %v %q", host, ok, rule, asciiUpper(host), uok, urule)
		}
		if a, err := netip.ParseAddr(host); err == nil {
			if aok, arule := p.AllowsAddr(a); aok != ok || arule != rule {
				t.Fatalf("AllowsHost(%q) = %v %q but AllowsAddr = %v %q", host, ok, rule, aok, arule)
			}
		}
	})
}

// FuzzDNS feeds the fake-address DNS server raw packets, as a sandbox
// can send them: every answer is a well-formed reply to the query's ID,
// only names the policy allows get an address, that address is a fake one
// the sandbox's table maps back to the name (the same on a second query,
// and its PTR names it), and nothing else is answered.
func FuzzDNS(f *testing.F) {
	// The longest name, allowed by "*".
	long := strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61) + "."
	for _, q := range []struct {
		name  string
		qtype uint16
		edns  uint16 // the EDNS payload size; 0: no EDNS
	}{
		{"pkg.test.", dns.TypeA, 0}, {"PKG.test.", dns.TypeA, 4096}, {"a.github.test.", dns.TypeA, 0},
		{"evil.github.test.", dns.TypeA, 4096}, {"github.test.", dns.TypeA, 0}, {"pkg.test.", dns.TypeAAAA, 0},
		{"1.0.18.198.in-addr.arpa.", dns.TypePTR, 0}, {"pkg.test.", dns.TypeMX, 1232},
		{long, dns.TypeA, 0}, {long, dns.TypeA, 512}, {"x" + long[1:], dns.TypeA, 512}, {"x" + long[1:], dns.TypeA, 100},
		{"1.2.3.4.", dns.TypeA, 0}, {".", dns.TypeA, 0},
	} {
		m := new(dns.Msg)
		m.SetQuestion(q.name, q.qtype)
		if q.edns > 0 {
			m.SetEdns0(q.edns, false)
		}
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xab, 0xcd, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0xff})
	f.Add([]byte{0xab, 0xcd, 0x81, 0x80, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0x12})
	p := New(Config{})
	policies := []Policy{
		{AllowOut: []string{"pkg.test", "*.github.test", "10.0.0.0/8"}, DenyOut: []string{"evil.github.test"}},
		{AllowOut: []string{"*"}, DenyOut: []string{"evil.test"}},
		longPolicy(),
	}
	f.Fuzz(func(t *testing.T, pkt []byte) {
		for _, pol := range policies {
			sb := &Sandbox{ID: "sb-fuzz"}
			if err := sb.SetPolicy(&pol); err != nil {
				t.Fatal(err)
			}
			resp := p.answerDNS(sb, pkt, "10.200.0.1:53")
			req := new(dns.Msg)
			reqErr := req.Unpack(pkt)
			if resp == nil {
				if reqErr == nil && !req.Response {
					t.Fatalf("a well-formed query got no answer: %v", req)
				}
				if reqErr != nil && len(pkt) >= 12 {
					t.Fatalf("a malformed query with a header got no FORMERR")
				}
				continue
			}
			m := checkReply(t, pkt, resp)
			if reqErr != nil {
				if m.Rcode != dns.RcodeFormatError || len(m.Answer) > 0 {
					t.Fatalf("malformed query answered %v", m)
				}
				continue
			}
			// What the client said it can receive over UDP.
			limit := dns.MinMsgSize
			if opt := req.IsEdns0(); opt != nil {
				limit = max(limit, min(int(opt.UDPSize()), ednsSize))
			}
			if len(resp) > limit {
				t.Fatalf("an answer of %d bytes to a query that can receive %d (EDNS %v)", len(resp), limit, req.IsEdns0())
			}
			for _, rr := range m.Answer {
				checkFakeAnswer(t, p, sb, req, rr)
			}
		}
	})
}

// longPolicy's refusals explain themselves at length: 20 long entries.
func longPolicy() Policy {
	var p Policy
	for i := range 20 {
		p.AllowOut = append(p.AllowOut, fmt.Sprintf("%c%s.test", 'a'+i, strings.Repeat("x", 60)))
	}
	return p
}

// checkReply unpacks resp and checks it is a reply to the query in pkt.
func checkReply(t *testing.T, pkt, resp []byte) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(resp); err != nil {
		t.Fatalf("the answer does not unpack: %v", err)
	}
	if !m.Response || m.Id != binary.BigEndian.Uint16(pkt) {
		t.Fatalf("answer %v is not a response to ID %#x", m, binary.BigEndian.Uint16(pkt))
	}
	if len(m.Answer) > 1 || len(m.Ns) > 0 {
		t.Fatalf("more than one answer: %v", m)
	}
	return m
}

// checkFakeAnswer: an A answer is a fake address of an allowed name, stable
// and reversible; a PTR answer names a fake address given before.
func checkFakeAnswer(t *testing.T, p *Proxy, sb *Sandbox, req *dns.Msg, rr dns.RR) {
	t.Helper()
	q := req.Question[0]
	name := normalizeName(q.Name)
	switch a := rr.(type) {
	case *dns.A:
		ip, ok := netip.AddrFromSlice(a.A)
		if !ok || !fakeRange.Contains(ip.Unmap()) {
			t.Fatalf("A %s answered %s, not a fake address", q.Name, a.A)
		}
		if ok, rule := sb.current().allowsName(name); !ok {
			t.Fatalf("A %q answered though the policy refuses it (%s)", name, rule)
		}
		if got, ok := sb.fakes.lookup(ip); !ok || got != name {
			t.Fatalf("fake address %s maps back to %q, %v; want %q", ip, got, ok, name)
		}
		m := new(dns.Msg)
		m.SetQuestion(q.Name, dns.TypeA)
		b, err := m.Pack()
		if err != nil {
			return // a name miekg/dns reads but does not write
		}
		if r := checkReply(t, b, p.answerDNS(sb, b, "")); len(r.Answer) != 1 || !r.Answer[0].(*dns.A).A.Equal(a.A) {
			t.Fatalf("second query for %q: %v, want %s", name, r.Answer, a.A)
		}
		arpa, _ := dns.ReverseAddr(ip.String())
		m.SetQuestion(arpa, dns.TypePTR)
		b, _ = m.Pack()
		if r := checkReply(t, b, p.answerDNS(sb, b, "")); len(r.Answer) != 1 || normalizeName(r.Answer[0].(*dns.PTR).Ptr) != name {
			t.Fatalf("PTR of %s: %v, want %q", ip, r.Answer, name)
		}
	case *dns.PTR:
		ip, ok := reverseAddr(q.Name)
		if !ok {
			t.Fatalf("PTR answer for %q, not an in-addr.arpa name", q.Name)
		}
		if got, ok := sb.fakes.lookup(ip); !ok || got != normalizeName(a.Ptr) {
			t.Fatalf("PTR %s answered %q; the table says %q, %v", q.Name, a.Ptr, got, ok)
		}
	default:
		t.Fatalf("answer of type %T: %v", rr, rr)
	}
}

// FuzzSniff: classifying a connection's first bytes consumes none of them,
// says TLS only for a handshake record, and takes for HTTP everything Go's
// HTTP server reads as a request (what it does not take goes through as
// raw TCP, unchecked by Host); the Host of an HTTP request is an address,
// nothing, or a name that is valid or refused by any policy.
func FuzzSniff(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: pkg.test\r\n\r\n",
		"POST /x HTTP/1.1\r\nHost: 10.0.0.1:8080\r\nContent-Length: 2\r\n\r\nhi",
		"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: pkg.test.\r\n\r\n",
		"GET http://other.test/ HTTP/1.1\r\nHost: pkg.test\r\n\r\n",
		"CONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test:443\r\n\r\n",
		"\r\n\r\nGET / HTTP/1.0\r\n\r\n", "get / http/1.1\r\nHost: pkg.test\r\n\r\n", "FOO\t/ HTTP/1.1\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"SSH-2.0-OpenSSH_9.2\r\n", "0032git-upload-pack /x\x00host=pkg.test\x00",
		"\x16\x03\x01\x00\x05hello",
		"\x16\x02", "\x16", "P", "",
	} {
		f.Add([]byte(s))
	}
	f.Add(clientHello(f, "pkg.test"))
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(data), peekBufSize) // as the proxy reads
		kind, err := sniff(br)
		rest, _ := io.ReadAll(br)
		if !bytes.Equal(rest, data) {
			t.Fatalf("sniff consumed bytes: %q left of %q", rest, data)
		}
		if err != nil && kind != sniffGone {
			t.Fatalf("sniff of a reader that ends with EOF: %v", err)
		}
		switch kind {
		case sniffTLS:
			if len(data) < 2 || data[0] != 0x16 || data[1] != 0x03 {
				t.Fatalf("%q sniffed as TLS", data)
			}
		case sniffGone:
			if len(data) > 0 {
				t.Fatalf("%q sniffed as gone", data)
			}
		}
		req, rerr := http.ReadRequest(bufio.NewReader(bytes.NewReader(data)))
		if rerr != nil {
			return
		}
		if kind != sniffHTTP && kind != sniffTLS {
			t.Fatalf("%q is a request to Go's HTTP server (%s %s, Host %q), sniffed as raw TCP", data, req.Method, req.URL, req.Host)
		}
		if kind == sniffHTTP {
			checkServerName(t, "Host", req.Host, requestHost(req))
		}
	})
}

// FuzzClientHello: reading a ClientHello returns every byte it consumed
// (replayed upstream: nothing invented, nothing lost), and its server name
// is empty, an address, a valid name, or one no policy allows.
func FuzzClientHello(f *testing.F) {
	for _, name := range []string{"pkg.test", "", "a.github.test", "Mixed.Case.Test", strings.Repeat("x", 63) + ".test"} {
		f.Add(clientHello(f, name))
	}
	hello := clientHello(f, "pkg.test")
	f.Add(fragment(hello, 7))
	f.Add(append(slices.Clone(hello), "trailing application data"...))
	f.Add(hello[:len(hello)/2])
	f.Add([]byte("\x16\x03\x01\x00\x05hello and more"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		name, read, err := readClientHello(r)
		rest, _ := io.ReadAll(r)
		if !bytes.Equal(append(slices.Clone(read), rest...), data) {
			t.Fatalf("readClientHello returned %d bytes and left %d of %d: not the input", len(read), len(rest), len(data))
		}
		if err != nil {
			if name != "" {
				t.Fatalf("no ClientHello (%v), but a server name %q", err, name)
			}
			return
		}
		checkServerName(t, "SNI", name, hostName(name))
	})
}

// checkServerName: what a sandbox names in a Host header or a TLS server
// name (raw) becomes name for the policy: "" (an address, or nothing) or a
// valid DNS name; anything else must be refused even by "*".
func checkServerName(t *testing.T, what, raw, name string) {
	t.Helper()
	if name == "" || checkDomain(name) == nil {
		return
	}
	if ok, rule := anyDomain.allowsHost(name); ok {
		t.Fatalf("%s %q gives the name %q, which is not valid, and \"*\" allows it (%s)", what, raw, name, rule)
	}
}

var anyDomain = func() *compiledPolicy {
	c, err := compileStrict(Policy{AllowOut: []string{"*", "0.0.0.0/0"}})
	if err != nil {
		panic(err)
	}
	return c
}()

// clientHello is the first flight of a crypto/tls client for serverName.
func clientHello(tb testing.TB, serverName string) []byte {
	tb.Helper()
	c := &recordConn{}
	_ = tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == ""}).Handshake()
	if c.buf.Len() == 0 {
		tb.Fatalf("no ClientHello written for %q", serverName)
	}
	return c.buf.Bytes()
}

// recordConn keeps what is written and fails reads, which ends a client
// handshake after its first flight.
type recordConn struct {
	helloConn
	buf bytes.Buffer
}

func (c *recordConn) Read([]byte) (int, error)    { return 0, io.EOF }
func (c *recordConn) Write(b []byte) (int, error) { return c.buf.Write(b) }

var _ net.Conn = (*recordConn)(nil)

// fragment splits a single TLS record into records of at most n bytes of
// payload, which servers must reassemble.
func fragment(rec []byte, n int) []byte {
	hdr, payload := rec[:5], rec[5:]
	var out []byte
	for len(payload) > 0 {
		k := min(n, len(payload))
		out = append(out, hdr[0], hdr[1], hdr[2], byte(k>>8), byte(k))
		out = append(out, payload[:k]...)
		payload = payload[k:]
	}
	return out
}

// canonical makes nil and empty lists and maps compare equal, as their
// JSON does (omitempty).
func canonical(p Policy) Policy {
	out := Policy{AllowOut: nonEmpty(p.AllowOut), DenyOut: nonEmpty(p.DenyOut), AllowInternet: p.AllowInternet}
	if len(p.Rules) == 0 {
		return out
	}
	out.Rules = map[string][]Rule{}
	for k, rs := range p.Rules {
		cp := []Rule{}
		for _, r := range rs {
			nr := Rule{}
			if r.Transform != nil {
				nr.Transform = &Transform{}
				if len(r.Transform.Headers) > 0 {
					nr.Transform.Headers = r.Transform.Headers
				}
			}
			cp = append(cp, nr)
		}
		out.Rules[k] = cp
	}
	return out
}

func nonEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// entryTextsOf is the normalized form of valid entries, as decisions and
// reports name them.
func entryTextsOf(t *testing.T, entries []string) []string {
	t.Helper()
	var out []string
	for _, s := range entries {
		e, err := parseEntry(s)
		if err != nil {
			t.Fatalf("entry %q of a valid policy does not parse: %v", s, err)
		}
		out = append(out, e.text)
	}
	return out
}

// probes are hosts on the edges of every entry of the policies: each
// domain and a name below it, a name below each wildcard and its apex, the
// first, last and next addresses of each CIDR, and the fuzzer's own probe
// beside and below each of them.
func probes(ps ...any) []string {
	var hosts, extra []string
	add := func(s string) { hosts = append(hosts, s) }
	for _, x := range ps {
		var entries []string
		switch v := x.(type) {
		case Policy:
			entries = append(append(entries, v.AllowOut...), v.DenyOut...)
			for k := range v.Rules {
				entries = append(entries, k)
			}
		case string:
			extra = append(extra, v)
			add(v)
			continue
		}
		for _, s := range entries {
			e, err := parseEntry(s)
			if err != nil {
				continue
			}
			switch e.kind {
			case kindAnyDomain:
				add("any.test")
			case kindDomain:
				add(e.domain)
				add("sub." + e.domain)
			case kindWildcard:
				add(e.domain)
				add("sub." + e.domain)
				add("a.b." + e.domain)
			case kindAddr:
				first := e.prefix.Masked().Addr()
				add(first.String())
				last := lastAddr(e.prefix)
				add(last.String())
				add(last.Next().String())
				add(first.Prev().String())
				if first.Is4() {
					add(netip.AddrFrom16(first.As16()).String()) // ::ffff:a.b.c.d
				}
			}
		}
	}
	for _, x := range extra {
		for _, h := range slices.Clone(hosts) {
			if _, err := netip.ParseAddr(h); err != nil {
				add(x + "." + h)
			}
		}
	}
	return hosts
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// asciiUpper upper-cases ASCII letters only: Unicode case mapping can turn
// an invalid name into a valid one ("ı" → "I").
func asciiUpper(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' {
			return r - 'a' + 'A'
		}
		return r
	}, s)
}
