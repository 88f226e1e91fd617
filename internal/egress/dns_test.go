package egress

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func TestDNS(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test", "*.github.test", "db.internal", "10.0.0.0/8"}}, nil)

	r1 := h.query("pkg.test", dns.TypeA, false)
	r2 := h.query("PKG.test", dns.TypeA, false)
	if r1.Rcode != dns.RcodeSuccess || len(r1.Answer) != 1 || len(r2.Answer) != 1 {
		t.Fatalf("A pkg.test: %v / %v", r1, r2)
	}
	a1, a2 := r1.Answer[0].(*dns.A), r2.Answer[0].(*dns.A)
	ip, _ := netip.AddrFromSlice(a1.A)
	if !fakeRange.Contains(ip.Unmap()) || !a1.A.Equal(a2.A) || a1.Hdr.Ttl != 30 {
		t.Errorf("answers %v and %v: want the same fake address, TTL 30", a1, a2)
	}
	if other := h.fake("api.github.test"); other == ip.Unmap() {
		t.Error("two names share a fake address")
	}
	e := h.waitEvent("dns allowed", func(e Event) bool { return e.Kind == "dns" && e.Host == "pkg.test" })
	if e.Decision != "allowed" || e.Rule != "pkg.test" || e.Upstream != ip.Unmap().String() || e.Proto != "dns" {
		t.Errorf("event = %+v", e)
	}

	// PTR of a fake address names the host.
	arpa, _ := dns.ReverseAddr(ip.String())
	if r := h.query(arpa, dns.TypePTR, false); len(r.Answer) != 1 || r.Answer[0].(*dns.PTR).Ptr != "pkg.test." {
		t.Errorf("PTR %s = %v", arpa, r.Answer)
	}
	if r := h.query("1.1.1.1.in-addr.arpa", dns.TypePTR, false); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Errorf("PTR of another address = %v", r)
	}

	// Sandboxes are IPv4-only; other types of an allowed name are empty.
	for _, qt := range []uint16{dns.TypeAAAA, dns.TypeMX, dns.TypeHTTPS} {
		if r := h.query("pkg.test", qt, false); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
			t.Errorf("%s pkg.test = %s, %d answers", dns.TypeToString[qt], dns.RcodeToString[r.Rcode], len(r.Answer))
		}
	}

	// .internal is a name like any other: the policy decides.
	if a := h.fake("db.internal"); !fakeRange.Contains(a) {
		t.Errorf("db.internal = %s", a)
	}
	r := h.query("metadata.google.internal", dns.TypeA, true)
	if r.Rcode != dns.RcodeNameError {
		t.Errorf("metadata.google.internal rcode = %s", dns.RcodeToString[r.Rcode])
	}

	// Not allowed: NXDOMAIN, an extended error saying why, and an event.
	r = h.query("evil.test", dns.TypeA, true)
	if r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
		t.Fatalf("evil.test = %v", r)
	}
	var text string
	if opt := r.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if ede, ok := o.(*dns.EDNS0_EDE); ok {
				text = ede.ExtraText
			}
		}
	}
	if !strings.HasPrefix(text, "blocked by cella sandbox policy: evil.test is not allowed for this sandbox (allowed: pkg.test, *.github.test, db.internal, 10.0.0.0/8)") {
		t.Errorf("extended error = %q", text)
	}
	e = h.waitEvent("dns blocked", func(e Event) bool { return e.Kind == "dns" && e.Host == "evil.test" })
	if e.Decision != "blocked" || e.Rule != "no-match" || !strings.Contains(e.Reason, "evil.test is not allowed") {
		t.Errorf("event = %+v", e)
	}
	// The wildcard's apex.
	if r := h.query("github.test", dns.TypeA, false); r.Rcode != dns.RcodeNameError {
		t.Errorf("github.test rcode = %s", dns.RcodeToString[r.Rcode])
	}
}

func TestDNSIPOnlyPolicy(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"0.0.0.0/0"}}, nil)
	if r := h.query("pkg.test", dns.TypeA, false); r.Rcode != dns.RcodeNameError {
		t.Errorf("rcode = %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}
}

func TestDNSFakeAddressesArePerSandbox(t *testing.T) {
	var a, b fakeTable
	x, _ := a.assign("sb-1", "pkg.test")
	y, _ := b.assign("sb-1", "pkg.test")
	if x != y {
		t.Errorf("same sandbox and name got %s and %s", x, y)
	}
	if name, ok := b.lookup(x); !ok || name != "pkg.test" {
		t.Errorf("lookup = %q, %v", name, ok)
	}
	var c fakeTable
	if _, ok := c.lookup(x); ok {
		t.Error("another sandbox resolves this sandbox's fake address")
	}
	// Collisions probe onward instead of sharing.
	seen := map[netip.Addr]string{}
	for i := range 2000 {
		name := strings.Repeat("x", i%50) + ".test" + string(rune('a'+i%26))
		addr, err := c.assign("sb", name)
		if err != nil {
			t.Fatal(err)
		}
		if prev, ok := seen[addr]; ok && prev != name {
			t.Fatalf("%s given to %s and %s", addr, prev, name)
		}
		seen[addr] = name
	}
}

func TestDNSMalformedAndOddQueries(t *testing.T) {
	h := newHarness(t, Policy{AllowOut: []string{"pkg.test"}}, nil)
	conn, err := net.Dial("udp", h.pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A header claiming a question that is not there.
	if _, err := conn.Write([]byte{0xab, 0xcd, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0xff}); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	if err := m.Unpack(buf[:n]); err != nil || m.Id != 0xabcd || m.Rcode != dns.RcodeFormatError {
		t.Errorf("malformed query answered %v, %v", m, err)
	}

	q := new(dns.Msg)
	q.SetQuestion("pkg.test.", dns.TypeA)
	q.Question[0].Qclass = dns.ClassCHAOS
	r, err := dns.Exchange(q, h.pc.LocalAddr().String())
	if err != nil || r.Rcode != dns.RcodeNotImplemented {
		t.Errorf("CHAOS query = %v, %v", r, err)
	}
}
