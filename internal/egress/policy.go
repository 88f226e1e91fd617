package egress

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"net/textproto"
	"regexp"
	"slices"
	"sort"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/cella-sandbox/cella/internal/secrets"
)

// Policy is a sandbox's egress policy in E2B's shapes: the create request's
// network object (allowOut, denyOut) plus header rules.
//
// Entries are IP addresses, CIDRs, domains ("pkg.test"), wildcards
// ("*.github.com": the subdomains, not the apex) and "*" (any domain). A
// domain entry never allows a raw IP, nor an IP entry a name.
type Policy struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
	// Rules maps a host, wildcard or "*" to the rules applied to its
	// requests. A host with a header rule has its TLS intercepted.
	Rules map[string][]Rule `json:"rules,omitempty"`
	// AllowInternet is E2B's allow_internet_access. Narrow reads it: a
	// request with no AllowOut entries that asks for the internet gets the
	// ceiling's AllowOut. On its own it allows nothing, because cella's
	// default is no egress.
	AllowInternet bool `json:"allowInternetAccess,omitempty"`
}

// Rule is applied to the requests to the host it is keyed by, on one
// scheme and port.
type Rule struct {
	Transform *Transform `json:"transform,omitempty"`
	// Scheme and Port bind the rule (cella's fields; E2B's rules have
	// neither): its headers go only on requests over that scheme to that
	// port. The default is "https" on 443 (80 for "http"), so a secret
	// never travels in the clear, nor to another port of the host, unless
	// a rule says so. A request to a host with header rules on a scheme
	// and port none of them binds is refused, not sent without them.
	Scheme string `json:"scheme,omitempty"`
	Port   int    `json:"port,omitempty"`
}

// binding is where a rule applies: a scheme and a port.
type binding struct {
	scheme string
	port   uint16
}

func (b binding) String() string { return fmt.Sprintf("%s on port %d", b.scheme, b.port) }

// bindingOf is the rule's binding with the defaults filled in; a rule
// that does not validate has none.
func bindingOf(r Rule) (binding, error) {
	b := binding{scheme: strings.ToLower(strings.TrimSpace(r.Scheme))}
	switch b.scheme {
	case "":
		b.scheme = "https"
	case "https", "http":
	default:
		return binding{}, fmt.Errorf("scheme %q: want https or http", r.Scheme)
	}
	switch {
	case r.Port < 0 || r.Port > 65535:
		return binding{}, fmt.Errorf("port %d: want 1-65535", r.Port)
	case r.Port != 0:
		b.port = uint16(r.Port)
	case b.scheme == "https":
		b.port = 443
	default:
		b.port = 80
	}
	return b, nil
}

// Transform sets request headers. A value may contain ${secret:NAME},
// resolved through Config.Secrets for each request and never reported.
type Transform struct {
	Headers map[string]string `json:"headers,omitempty"`
}

// maxEntries bounds each list so that matching stays cheap per connection.
const maxEntries = 1024

// ParsePolicy reads an E2B network object (unknown fields such as
// allowPublicTraffic are ignored) and validates it. Empty input or null is
// the empty policy: no egress.
func ParsePolicy(data []byte) (Policy, error) {
	var p Policy
	if len(strings.TrimSpace(string(data))) == 0 {
		return p, nil
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return Policy{}, fmt.Errorf("egress: network policy is not a valid JSON object: %w", err)
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// Validate reports every bad entry and rule, each error naming it.
func (p Policy) Validate() error {
	_, err := compileStrict(p)
	return err
}

// AllowsHost says whether the policy allows connecting to name, and the
// entry that decided it: the matching AllowOut or DenyOut entry, or a
// reason code ("no-match", "invalid-name", "invalid-policy"). An IP literal
// is checked with AllowsAddr.
func (p Policy) AllowsHost(name string) (bool, string) {
	c, err := compileStrict(p)
	if err != nil {
		// A policy that does not validate allows nothing, since a bad deny
		// entry must not open anything.
		return false, "invalid-policy"
	}
	return c.allowsHost(name)
}

// AllowsAddr says whether the policy allows connecting to a raw address,
// and the entry that decided it, or a reason code ("no-match",
// "hard-deny:PREFIX", "invalid-policy"). Only the built-in hard-deny list
// applies here; the proxy adds Config.HardDeny and loopback.
func (p Policy) AllowsAddr(a netip.Addr) (bool, string) {
	c, err := compileStrict(p)
	if err != nil {
		return false, "invalid-policy"
	}
	return c.allowsAddr(a)
}

// Summary describes what the policy allows, for explanations:
// "allowed: pkg.test, *.github.com, 10.0.0.0/8" (with "; denied: ..." when
// DenyOut is set), or "allowed: nothing (no egress)".
func (p Policy) Summary() string {
	c, err := compileStrict(p)
	if err != nil {
		return "allowed: nothing (the policy is invalid: " + err.Error() + ")"
	}
	return c.summary
}

// OutsideCeilingError is Narrow's error for a request entry the operator's
// ceiling does not cover.
type OutsideCeilingError struct {
	Entry   string
	Ceiling []string
}

func (e *OutsideCeilingError) Error() string {
	if len(e.Ceiling) == 0 {
		return fmt.Sprintf("egress: allowOut entry %q is outside the operator's ceiling, which allows no egress", e.Entry)
	}
	return fmt.Sprintf("egress: allowOut entry %q is outside the operator's ceiling (allowed: %s)", e.Entry, strings.Join(e.Ceiling, ", "))
}

// Narrow returns the policy a request gets under the operator's ceiling: a
// request can only narrow it. Every AllowOut entry of the request must be
// covered by a ceiling entry (a domain by an equal domain, a wildcard above
// it or "*"; a CIDR by a ceiling CIDR containing it), else the error is an
// *OutsideCeilingError. The effective AllowOut is the request's entries, or
// the ceiling's when the request has none and sets AllowInternet; DenyOut
// is the union. Rules are the request's, with the ceiling's taking over a
// host both name: the operator's injections cannot be replaced. Request
// rules may name any secret Config.Secrets resolves, so that function must
// only resolve secrets the sandbox's owner may use.
func (p Policy) Narrow(ceiling Policy) (Policy, error) {
	req, err := compileStrict(p)
	if err != nil {
		return Policy{}, err
	}
	ceil, err := compileStrict(ceiling)
	if err != nil {
		return Policy{}, fmt.Errorf("egress: operator ceiling: %w", err)
	}
	for _, e := range req.allow {
		if !ceil.covers(e) {
			return Policy{}, &OutsideCeilingError{Entry: e.text, Ceiling: entryTexts(ceil.allow)}
		}
	}
	out := Policy{}
	switch {
	case len(req.allow) > 0:
		out.AllowOut = entryTexts(req.allow)
	case p.AllowInternet:
		out.AllowOut = entryTexts(ceil.allow)
	}
	out.DenyOut = union(entryTexts(ceil.deny), entryTexts(req.deny))
	if len(p.Rules)+len(ceiling.Rules) > 0 {
		out.Rules = make(map[string][]Rule, len(p.Rules)+len(ceiling.Rules))
		for _, rs := range req.rules {
			out.Rules[rs.key.text] = rs.rules
		}
		for _, rs := range ceil.rules {
			out.Rules[rs.key.text] = rs.rules
		}
	}
	return out, nil
}

func union(a, b []string) []string {
	seen := make(map[string]bool, len(a)+len(b))
	var out []string
	for _, s := range append(append([]string(nil), a...), b...) {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// entryKind is what an entry matches.
type entryKind int

const (
	kindAddr      entryKind = iota // an IP or CIDR
	kindDomain                     // one name
	kindWildcard                   // the strict subdomains of domain
	kindAnyDomain                  // "*"
)

type entry struct {
	text   string // normalized as written, for reports
	kind   entryKind
	prefix netip.Prefix // kindAddr
	domain string       // kindDomain: the name; kindWildcard: the parent
}

func parseEntry(s string) (entry, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return entry{}, errors.New("empty entry")
	}
	if t == "*" {
		return entry{text: t, kind: kindAnyDomain}, nil
	}
	if strings.Contains(t, "/") {
		pfx, err := netip.ParsePrefix(t)
		if err != nil {
			return entry{}, fmt.Errorf("not a valid CIDR: %w", err)
		}
		pfx = unmapPrefix(pfx)
		return entry{text: pfx.String(), kind: kindAddr, prefix: pfx}, nil
	}
	if a, err := netip.ParseAddr(t); err == nil {
		if a.Zone() != "" {
			return entry{}, errors.New("an IPv6 zone cannot be allowed or denied")
		}
		a = a.Unmap()
		return entry{text: a.String(), kind: kindAddr, prefix: netip.PrefixFrom(a, a.BitLen())}, nil
	}
	t = strings.TrimSuffix(t, ".")
	if rest, ok := strings.CutPrefix(t, "*."); ok {
		if err := checkDomain(rest); err != nil {
			return entry{}, err
		}
		return entry{text: t, kind: kindWildcard, domain: rest}, nil
	}
	if err := checkDomain(t); err != nil {
		return entry{}, err
	}
	return entry{text: t, kind: kindDomain, domain: t}, nil
}

// unmapPrefix returns p masked, an IPv4-mapped CIDR (::ffff:10.0.0.0/104)
// as the IPv4 CIDR it means (10.0.0.0/8).
func unmapPrefix(p netip.Prefix) netip.Prefix {
	bits := p.Bits()
	if p.Addr().Is4In6() {
		bits = max(bits-96, 0)
	}
	return netip.PrefixFrom(p.Addr().Unmap(), bits).Masked()
}

var labelRe = regexp.MustCompile(`^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$`)

// checkDomain accepts lower-case DNS names; internationalized names must
// be given in punycode so that what is matched is what goes on the wire.
func checkDomain(name string) error {
	if name == "" {
		return errors.New("empty domain name")
	}
	if len(name) > 253 {
		return errors.New("domain name longer than 253 characters")
	}
	if strings.Contains(name, "*") {
		return errors.New(`a wildcard is only allowed as a leading "*." or as "*" alone`)
	}
	for _, l := range strings.Split(name, ".") {
		if !labelRe.MatchString(l) {
			for _, r := range l {
				if r > 0x7f {
					return errors.New("not an IP, CIDR or domain name (give internationalized names in punycode, xn--...)")
				}
			}
			return errors.New("not an IP, CIDR or domain name")
		}
	}
	return nil
}

// normalizeName lower-cases a host name and drops the trailing dot of a
// fully qualified name, the form entries are matched against. It is
// idempotent: what dropping the dot would expose (another dot, spaces) is
// kept, and stays invalid, so a caller that normalized a Host header or SNI
// decides on the very name a policy check normalizing it again sees
// ("pkg.test.." was allowed as pkg.test, but dialed and matched against
// header rules as "pkg.test.").
func normalizeName(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	if t, ok := strings.CutSuffix(s, "."); ok && !strings.HasSuffix(t, ".") && t == strings.TrimSpace(t) {
		return t
	}
	return s
}

func (e entry) matchesName(name string) bool {
	switch e.kind {
	case kindAnyDomain:
		return true
	case kindDomain:
		return name == e.domain
	case kindWildcard:
		return strings.HasSuffix(name, "."+e.domain)
	}
	return false
}

// specificity orders matching entries so that reports name the closest one.
func (e entry) specificity() int {
	switch e.kind {
	case kindDomain:
		return 1000
	case kindWildcard:
		return len(e.domain)
	case kindAddr:
		return e.prefix.Bits()
	}
	return 0
}

// catchAll entries restate the default when denied (see the package doc).
func (e entry) catchAll() bool {
	return e.kind == kindAnyDomain || (e.kind == kindAddr && e.prefix.Bits() == 0)
}

func (e entry) isDomain() bool { return e.kind != kindAddr }

func entryTexts(es []entry) []string {
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.text)
	}
	return out
}

// hardDeny are the addresses no policy can open: connecting there reaches
// the host or its cloud rather than the internet.
var hardDeny = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "the unspecified range, which reaches the host itself"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local, where cloud metadata services live"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved, including broadcast"},
	{fakeRange, "cella's fake DNS addresses"},
	{netip.MustParsePrefix("::/128"), "the unspecified address"},
	{netip.MustParsePrefix("fe80::/10"), "IPv6 link-local"},
	{netip.MustParsePrefix("ff00::/8"), "IPv6 multicast"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "a cloud metadata service"},
}

// builtinHardDeny returns the hard-deny prefix containing a, if any.
func builtinHardDeny(a netip.Addr) (netip.Prefix, string, bool) {
	a = a.Unmap()
	for _, h := range hardDeny {
		if h.prefix.Contains(a) {
			return h.prefix, h.why, true
		}
	}
	return netip.Prefix{}, "", false
}

// ruleSet is the rules for one key of Policy.Rules, with the headers they
// set worked out once per binding: a compiled policy never changes.
type ruleSet struct {
	key   entry
	rules []Rule // as given, for Narrow
	// headers are the headers set on each binding that has any.
	headers map[binding]headerSet
	bound   []binding // the keys of headers, sorted, for refusals
}

// headerSet is the headers one binding sets.
type headerSet struct {
	hdrs  map[string]string // canonical header name -> value template
	names []string          // the keys of hdrs, sorted
}

// compiledPolicy is a Policy parsed once, so that each connection and
// query only matches. Only a valid Policy is compiled.
type compiledPolicy struct {
	src         Policy
	allow, deny []entry
	rules       []ruleSet
	summary     string
}

var noEgress = func() *compiledPolicy {
	c, err := compileStrict(Policy{})
	if err != nil {
		panic(err)
	}
	return c
}()

func compileStrict(p Policy) (*compiledPolicy, error) {
	c := &compiledPolicy{src: p}
	var errs []error
	if len(p.AllowOut) > maxEntries || len(p.DenyOut) > maxEntries {
		errs = append(errs, fmt.Errorf("egress: allowOut and denyOut are limited to %d entries each", maxEntries))
	}
	for _, s := range p.AllowOut {
		e, err := parseEntry(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("egress: allowOut entry %q: %w", s, err))
			continue
		}
		if e.kind == kindAddr {
			if h, why, ok := builtinHardDeny(e.prefix.Addr()); ok && h.Bits() <= e.prefix.Bits() {
				errs = append(errs, fmt.Errorf("egress: allowOut entry %q: inside %s (%s), which cella never allows", s, h, why))
				continue
			}
		}
		c.allow = append(c.allow, e)
	}
	for _, s := range p.DenyOut {
		e, err := parseEntry(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("egress: denyOut entry %q: %w", s, err))
			continue
		}
		c.deny = append(c.deny, e)
	}
	keys := make([]string, 0, len(p.Rules))
	for k := range p.Rules {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		rs, err := compileRules(k, p.Rules[k])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c.rules = append(c.rules, rs)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	c.summary = summarize(c.allow, c.deny)
	return c, nil
}

func compileRules(key string, rules []Rule) (ruleSet, error) {
	e, err := parseEntry(key)
	if err != nil {
		return ruleSet{}, fmt.Errorf("egress: rules key %q: %w", key, err)
	}
	if !e.isDomain() {
		return ruleSet{}, fmt.Errorf("egress: rules key %q: rules apply to host names, not addresses", key)
	}
	var errs []error
	for i, r := range rules {
		if _, err := bindingOf(r); err != nil {
			errs = append(errs, fmt.Errorf("egress: rules[%q][%d] %w", key, i, err))
		}
		if r.Transform == nil {
			continue
		}
		for name, value := range r.Transform.Headers {
			if err := checkHeader(name, value); err != nil {
				errs = append(errs, fmt.Errorf("egress: rules[%q][%d] header %q: %w", key, i, name, err))
			}
		}
	}
	if len(errs) > 0 {
		return ruleSet{}, errors.Join(errs...)
	}
	rs := ruleSet{key: e, rules: rules, headers: map[binding]headerSet{}}
	byBinding := map[binding][]Rule{}
	for _, r := range rules {
		b, _ := bindingOf(r) // validated above
		byBinding[b] = append(byBinding[b], r)
	}
	for b, group := range byBinding {
		if hdrs := headerRules(group); len(hdrs) > 0 {
			rs.headers[b] = headerSet{hdrs: hdrs, names: slices.Sorted(maps.Keys(hdrs))}
			rs.bound = append(rs.bound, b)
		}
	}
	slices.SortFunc(rs.bound, func(a, b binding) int {
		if c := strings.Compare(a.scheme, b.scheme); c != 0 {
			return -c // https first
		}
		return int(a.port) - int(b.port)
	})
	return rs, nil
}

// framingHeaders describe the connection or the message framing; setting
// them from a rule would desynchronize the proxy and the upstream.
var framingHeaders = map[string]bool{
	"Host": true, "Connection": true, "Content-Length": true, "Transfer-Encoding": true,
	"Upgrade": true, "Te": true, "Trailer": true, "Keep-Alive": true, "Proxy-Connection": true,
}

// checkHeader accepts an RFC 9110 token as name, and a value without
// control characters, which would let it end the header and start another
// (CR, LF) or be cut short (NUL).
func checkHeader(name, value string) error {
	if !httpguts.ValidHeaderFieldName(name) {
		return errors.New("not a valid header name")
	}
	if framingHeaders[textproto.CanonicalMIMEHeaderKey(name)] {
		return errors.New("a rule cannot set a header that frames the connection")
	}
	if _, err := secrets.Replace(value, func(_, _ string) (string, error) { return "", nil }); err != nil {
		return fmt.Errorf("malformed ${e2b.secrets.NAME} reference: %w", err)
	}
	// Checked with the references in place: a secret's value is checked
	// when it is resolved.
	if !httpguts.ValidHeaderFieldValue(value) {
		return errors.New("the value contains characters not allowed in a header")
	}
	return nil
}

func summarize(allow, deny []entry) string {
	var b strings.Builder
	b.WriteString("allowed: ")
	if len(allow) == 0 {
		b.WriteString("nothing (no egress)")
	} else {
		b.WriteString(listShort(entryTexts(allow)))
	}
	if len(deny) > 0 {
		b.WriteString("; denied: ")
		b.WriteString(listShort(entryTexts(deny)))
	}
	return b.String()
}

// listShort keeps explanations readable for long policies.
func listShort(s []string) string {
	const show = 20
	if len(s) <= show {
		return strings.Join(s, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(s[:show], ", "), len(s)-show)
}

func (c *compiledPolicy) allowsHost(name string) (bool, string) {
	// Normalized first, as the proxy does: "1.2.3.4." is the address, not
	// a name that "*" would allow.
	if a, err := netip.ParseAddr(normalizeName(name)); err == nil {
		return c.allowsAddr(a)
	}
	return c.allowsName(name)
}

// allowsName is allowsHost for a name that is never an address (DNS).
func (c *compiledPolicy) allowsName(name string) (bool, string) {
	name = normalizeName(name)
	if checkDomain(name) != nil {
		return false, "invalid-name"
	}
	return c.match(func(e entry) bool { return e.isDomain() && e.matchesName(name) })
}

func (c *compiledPolicy) allowsAddr(a netip.Addr) (bool, string) {
	a = a.Unmap()
	if h, _, ok := builtinHardDeny(a); ok {
		return false, "hard-deny:" + h.String()
	}
	return c.match(func(e entry) bool { return e.kind == kindAddr && e.prefix.Contains(a) })
}

// match applies deny-wins-over-allow, where a catch-all deny yields to an
// explicit allow.
func (c *compiledPolicy) match(m func(entry) bool) (bool, string) {
	catchAll := ""
	for _, e := range c.deny {
		if !m(e) {
			continue
		}
		if !e.catchAll() {
			return false, e.text
		}
		catchAll = e.text
	}
	best := -1
	for i, e := range c.allow {
		if m(e) && (best < 0 || e.specificity() > c.allow[best].specificity()) {
			best = i
		}
	}
	if best >= 0 {
		return true, c.allow[best].text
	}
	if catchAll != "" {
		return false, catchAll
	}
	return false, "no-match"
}

// covers says whether a ceiling entry allows everything e allows.
func (c *compiledPolicy) covers(e entry) bool {
	for _, ce := range c.allow {
		switch {
		case e.kind == kindAddr && ce.kind == kindAddr:
			if ce.prefix.Bits() <= e.prefix.Bits() && ce.prefix.Contains(e.prefix.Addr()) {
				return true
			}
		case e.kind == kindAddr || ce.kind == kindAddr:
		case ce.kind == kindAnyDomain:
			return true
		case e.kind == kindAnyDomain:
		case e.kind == kindDomain && ce.matchesName(e.domain):
			return true
		case e.kind == kindWildcard && ce.kind == kindWildcard &&
			(e.domain == ce.domain || strings.HasSuffix(e.domain, "."+ce.domain)):
			return true
		}
	}
	return false
}

// injection is what the header rules do to one request.
type injection struct {
	key   string // the rules key that matched the host, "" for none
	names []string
	hdrs  map[string]string
	// bound lists where the key's header rules apply when none applies to
	// this request's scheme and port: the request is refused.
	bound []binding
}

// refused says whether the host has header rules, none for this request.
func (in injection) refused() bool { return len(in.names) == 0 && len(in.bound) > 0 }

// injectionFor returns the headers set on a request to host over scheme
// to port, by the rules of the most specific key matching host (the exact
// name, else the longest wildcard, else "*"): their canonical names,
// sorted, and the value template of each, shared by every caller and not
// to be modified. When that key has header rules but none bound to this
// scheme and port, it lists where they are bound instead.
func (c *compiledPolicy) injectionFor(host, scheme string, port uint16) injection {
	best := -1
	for i, rs := range c.rules {
		if rs.key.matchesName(host) && (best < 0 || rs.key.specificity() > c.rules[best].key.specificity()) {
			best = i
		}
	}
	if best < 0 {
		return injection{}
	}
	rs := &c.rules[best]
	if hs, ok := rs.headers[binding{scheme: scheme, port: port}]; ok {
		return injection{key: rs.key.text, names: hs.names, hdrs: hs.hdrs}
	}
	return injection{key: rs.key.text, bound: rs.bound}
}

// headerRules flattens rules into the headers they set, by canonical name,
// later rules overriding earlier ones. Within one Transform, names that
// differ only in case are applied in byte order of the names as written, so
// the last in that order wins whatever the map's iteration order: "x-api-key"
// over "X-Api-Key" over "X-API-KEY" (lower case sorts after upper case).
func headerRules(rules []Rule) map[string]string {
	var h map[string]string
	for _, r := range rules {
		if r.Transform == nil {
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(r.Transform.Headers)) {
			if h == nil {
				h = map[string]string{}
			}
			h[textproto.CanonicalMIMEHeaderKey(k)] = r.Transform.Headers[k]
		}
	}
	return h
}
