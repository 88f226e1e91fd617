package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Mapping pins a name, or the subdomains of one ("*.suffix"), to addresses
// the proxy dials instead of resolving it: an operator's local mirror, or a
// test's upstream (cella serve --egress-resolve NAME=ADDR[:PORT],...).
//
// A mapping is the only way an upstream on loopback is ever dialed, and
// then only for the names it maps, and only on its port when it gives one:
// a name that resolves to 127.0.0.1 through DNS (localhost, or a public
// name pointing there) stays refused, whatever else is mapped.
type Mapping struct {
	// Name is a normalized domain, or "*.suffix" for its strict subdomains.
	Name string
	// Addrs are dialed in order; a zero port is any port.
	Addrs []netip.AddrPort
}

// ParseMapping reads NAME=ADDR[:PORT][,ADDR[:PORT]...] (an IPv6 address
// with a port is written [ADDR]:PORT). A port scopes a loopback address to
// that port; on any other address it would mean nothing, so it is refused.
func ParseMapping(s string) (Mapping, error) {
	name, list, ok := strings.Cut(s, "=")
	name = normalizeName(name)
	if !ok || name == "" || strings.TrimSpace(list) == "" {
		return Mapping{}, fmt.Errorf("%q: want NAME=ADDRESS[:PORT][,ADDRESS[:PORT]...]", s)
	}
	if err := checkDomain(strings.TrimPrefix(name, "*.")); err != nil {
		return Mapping{}, fmt.Errorf("%q: name: %w", s, err)
	}
	m := Mapping{Name: name}
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		ap, err := netip.ParseAddrPort(item)
		if err != nil {
			a, aerr := netip.ParseAddr(item)
			if aerr != nil {
				return Mapping{}, fmt.Errorf("%q: %q is not an address or address:port", s, item)
			}
			ap = netip.AddrPortFrom(a, 0)
		} else if ap.Port() == 0 {
			return Mapping{}, fmt.Errorf("%q: port 0 in %q", s, item)
		}
		a := ap.Addr().Unmap()
		if a.Zone() != "" {
			return Mapping{}, fmt.Errorf("%q: an IPv6 zone cannot be mapped", s)
		}
		if ap.Port() != 0 && !a.IsLoopback() {
			return Mapping{}, fmt.Errorf("%q: a port only scopes a loopback address (%s is not one); give the address alone", s, a)
		}
		m.Addrs = append(m.Addrs, netip.AddrPortFrom(a, ap.Port()))
	}
	return m, nil
}

// String is the mapping as ParseMapping reads it.
func (m Mapping) String() string {
	items := make([]string, len(m.Addrs))
	for i, ap := range m.Addrs {
		if ap.Port() == 0 {
			items[i] = ap.Addr().String()
		} else {
			items[i] = ap.String()
		}
	}
	return m.Name + "=" + strings.Join(items, ",")
}

func (m *Mapping) matches(name string) bool {
	if suffix, ok := strings.CutPrefix(m.Name, "*"); ok {
		return strings.HasSuffix(name, suffix)
	}
	return name == m.Name
}

// addrs are the distinct addresses the mapping resolves its names to.
func (m *Mapping) addrs() []netip.Addr {
	var out []netip.Addr
	for _, ap := range m.Addrs {
		if !slices.Contains(out, ap.Addr()) {
			out = append(out, ap.Addr())
		}
	}
	return out
}

// permits says whether the mapping lets its names reach ap: one of its
// addresses, on its port if it gives one.
func (m *Mapping) permits(ap netip.AddrPort) bool {
	for _, a := range m.Addrs {
		if a.Addr() == ap.Addr() && (a.Port() == 0 || a.Port() == ap.Port()) {
			return true
		}
	}
	return false
}

// ports describes where the mapping lets its names reach a, for refusals.
func (m *Mapping) ports(a netip.Addr) string {
	var ps []string
	for _, ap := range m.Addrs {
		if ap.Addr() == a && ap.Port() != 0 {
			ps = append(ps, fmt.Sprint(ap.Port()))
		}
	}
	return strings.Join(ps, ", ")
}

// ParseMappings reads --egress-resolve values, refusing a name mapped
// twice. A value without "=" continues the address list of the one before
// it: flag and environment lists are split at commas, which also separate
// a mapping's addresses.
func ParseMappings(entries []string) ([]Mapping, error) {
	var joined []string
	for _, e := range entries {
		if n := len(joined); n > 0 && !strings.Contains(e, "=") {
			joined[n-1] += "," + e
			continue
		}
		joined = append(joined, e)
	}
	var out []Mapping
	var errs []error
	seen := map[string]bool{}
	for _, e := range joined {
		m, err := ParseMapping(e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[m.Name] {
			errs = append(errs, fmt.Errorf("%q: %s is mapped twice (list its addresses in one mapping)", e, m.Name))
		}
		seen[m.Name] = true
		out = append(out, m)
	}
	return out, errors.Join(errs...)
}

// mappings are a Config's, looked up by name: an exact name first, then the
// longest wildcard suffix.
type mappings []Mapping

func newMappings(ms []Mapping) mappings {
	out := make(mappings, 0, len(ms))
	for _, m := range ms {
		m.Name = normalizeName(m.Name)
		m.Addrs = slices.Clone(m.Addrs)
		out = append(out, m)
	}
	// Exact names before wildcards, longer wildcards before shorter: the
	// first match is the most specific.
	slices.SortStableFunc(out, func(a, b Mapping) int {
		aw, bw := strings.HasPrefix(a.Name, "*."), strings.HasPrefix(b.Name, "*.")
		switch {
		case aw != bw && !aw:
			return -1
		case aw != bw:
			return 1
		}
		return len(b.Name) - len(a.Name)
	})
	return out
}

func (ms mappings) lookup(name string) *Mapping {
	for i := range ms {
		if ms[i].matches(name) {
			return &ms[i]
		}
	}
	return nil
}
