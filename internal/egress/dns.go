package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// fakeRange is where fake DNS answers come from: the benchmarking range,
// which no real service uses, so a connection to it can only be a name
// cella answered.
var fakeRange = netip.MustParsePrefix("198.18.0.0/15")

const (
	fakeTTL = 30
	// fakeSlots excludes the range's first and last addresses, which some
	// stacks treat as network and broadcast.
	fakeSlots = 1<<(32-15) - 2
	// maxFakes bounds one sandbox's table; names are never forgotten so
	// that an address stays the name's for the sandbox's life.
	maxFakes = 1 << 16
	// ednsSize is the DNS flag day's safe UDP payload size.
	ednsSize = 1232
)

// fakeTable maps one sandbox's names to fake addresses and back.
type fakeTable struct {
	mu     sync.Mutex
	byName map[string]netip.Addr
	byAddr map[netip.Addr]string
}

// assign returns name's fake address, the same each time. The first probe
// is a hash of (sandbox, name), so that a name usually keeps its address
// across daemon restarts too.
func (t *fakeTable) assign(sandboxID, name string) (netip.Addr, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a, ok := t.byName[name]; ok {
		return a, nil
	}
	if len(t.byName) >= maxFakes {
		return netip.Addr{}, fmt.Errorf("this sandbox has looked up %d names, the most cella tracks", maxFakes)
	}
	if t.byName == nil {
		t.byName = map[string]netip.Addr{}
		t.byAddr = map[netip.Addr]string{}
	}
	h := fnv.New64a()
	h.Write([]byte(sandboxID))
	h.Write([]byte{0})
	h.Write([]byte(name))
	off := h.Sum64() % fakeSlots
	base := binary.BigEndian.Uint32(fakeRange.Addr().AsSlice())
	for i := uint64(0); ; i++ {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], base+1+uint32((off+i)%fakeSlots))
		a := netip.AddrFrom4(b)
		if _, taken := t.byAddr[a]; !taken {
			t.byName[name], t.byAddr[a] = a, name
			return a, nil
		}
	}
}

func (t *fakeTable) lookup(a netip.Addr) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	name, ok := t.byAddr[a.Unmap()]
	return name, ok
}

// ServeDNS answers the sandbox's DNS queries on pc until pc is closed.
// Answers come from the policy alone, never from upstream DNS, so a
// sandbox cannot use DNS as a channel out.
func (p *Proxy) ServeDNS(pc net.PacketConn, sb *Sandbox) {
	if !p.track(pc) {
		_ = pc.Close()
		return
	}
	defer p.untrack(pc)
	local := ""
	if a := pc.LocalAddr(); a != nil {
		local = a.String()
	}
	buf := make([]byte, dns.MaxMsgSize)
	var backoff time.Duration
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if resp := p.answerDNS(sb, buf[:n], local); resp != nil {
			_, _ = pc.WriteTo(resp, from)
		}
	}
}

// answerDNS returns the packed answer to one query, or nil to drop it.
func (p *Proxy) answerDNS(sb *Sandbox, pkt []byte, local string) []byte {
	req := new(dns.Msg)
	if err := req.Unpack(pkt); err != nil {
		if len(pkt) < 12 {
			return nil
		}
		// Answer what has a header, so the client does not wait out its
		// timeout.
		m := new(dns.Msg)
		m.Id = binary.BigEndian.Uint16(pkt)
		m.Response = true
		m.Rcode = dns.RcodeFormatError
		return pack(m, dns.MinMsgSize)
	}
	if req.Response {
		return nil
	}
	m := new(dns.Msg)
	m.SetReply(req)
	m.RecursionAvailable = true
	// The answer must fit what the client can receive over UDP: 512 bytes,
	// or what its EDNS record says, up to ours.
	size := dns.MinMsgSize
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(ednsSize, false)
		size = max(size, min(int(opt.UDPSize()), ednsSize))
	}
	if req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		m.Rcode = dns.RcodeNotImplemented
		return pack(m, size)
	}
	q := req.Question[0]
	if q.Qclass != dns.ClassINET {
		m.Rcode = dns.RcodeNotImplemented
		return pack(m, size)
	}
	if q.Qtype == dns.TypePTR {
		p.answerPTR(sb, m, q)
		return pack(m, size)
	}

	name := normalizeName(q.Name)
	pol := sb.current()
	ev := Event{Kind: "dns", Proto: "dns", Dst: local, Host: name}
	ok, rule := pol.allowsName(name)
	if !ok {
		ref := p.notAllowed(pol, name, rule)
		m.Rcode = dns.RcodeNameError
		ede(m, dns.ExtendedErrorCodeBlocked, blockedByPolicy+ref.msg, size)
		ev.Decision, ev.Rule, ev.Reason = "blocked", ref.code, ref.msg
		sb.emit(ev)
		return pack(m, size)
	}
	ev.Decision, ev.Rule = "allowed", rule
	// AAAA and the other types of an allowed name are answered empty:
	// sandboxes are IPv4-only and every connection goes through the proxy.
	if q.Qtype == dns.TypeA {
		a, err := sb.fakes.assign(sb.ID, name)
		if err != nil {
			m.Rcode = dns.RcodeServerFailure
			ev.Reason = err.Error()
			sb.emit(ev)
			return pack(m, size)
		}
		m.Answer = append(m.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: fakeTTL},
			A:   a.AsSlice(),
		})
		ev.Upstream = a.String()
	}
	sb.emit(ev)
	return pack(m, size)
}

// answerPTR names the fake addresses this sandbox was given, so tools that
// print reverse names show the host; other reverse queries are empty.
// PTR decides nothing about egress, so it is not reported.
func (p *Proxy) answerPTR(sb *Sandbox, m *dns.Msg, q dns.Question) {
	a, ok := reverseAddr(q.Name)
	if !ok {
		return
	}
	name, ok := sb.fakes.lookup(a)
	if !ok {
		return
	}
	m.Answer = append(m.Answer, &dns.PTR{
		Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypePTR, Class: dns.ClassINET, Ttl: fakeTTL},
		Ptr: dns.Fqdn(name),
	})
}

// reverseAddr parses an in-addr.arpa name.
func reverseAddr(qname string) (netip.Addr, bool) {
	rest, ok := strings.CutSuffix(normalizeName(qname), ".in-addr.arpa")
	if !ok {
		return netip.Addr{}, false
	}
	labels := strings.Split(rest, ".")
	if len(labels) != 4 {
		return netip.Addr{}, false
	}
	for i, j := 0, len(labels)-1; i < j; i, j = i+1, j-1 {
		labels[i], labels[j] = labels[j], labels[i]
	}
	a, err := netip.ParseAddr(strings.Join(labels, "."))
	return a, err == nil && a.Is4()
}

// ede attaches an extended DNS error (RFC 8914), which dig and some
// resolvers show: the only place a DNS answer can explain itself.
// The text (a policy summary can run to kilobytes) is cut to what fits in
// size bytes with the rest of m: Truncate never shortens the OPT record.
func ede(m *dns.Msg, code uint16, text string, size int) {
	opt := m.IsEdns0()
	if opt == nil {
		return
	}
	const optionHeader = 4 + 2 // option code and length, info code
	room := max(size-m.Len()-optionHeader, 0)
	if len(text) > room {
		text = strings.ToValidUTF8(text[:max(room-len("…"), 0)], "") + "…"
		if len(text) > room {
			text = ""
		}
	}
	opt.Option = append(opt.Option, &dns.EDNS0_EDE{InfoCode: code, ExtraText: text})
}

// pack packs m into at most size bytes: compressed when it must be, with
// records dropped and TC set when even that does not fit.
func pack(m *dns.Msg, size int) []byte {
	m.Truncate(size)
	b, err := m.Pack()
	if err != nil {
		return nil
	}
	return b
}
