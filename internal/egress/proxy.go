package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// serverFirstPorts are the well-known ports of protocols whose server
// speaks first (FTP, telnet, SMTP, POP3, IMAP, submission, MySQL, VNC):
// peeking there would only delay every connection by the peek timeout.
// Skipping it is safe, since the raw decision (the fake address's name or
// an allowed address) applies either way.
var serverFirstPorts = map[uint16]bool{21: true, 23: true, 25: true, 110: true, 143: true, 587: true, 3306: true, 5900: true}

const (
	defaultPeekTimeout = 5 * time.Second
	resolveTimeout     = 10 * time.Second
	dialTimeout        = 10 * time.Second
	handshakeTimeout   = 15 * time.Second
	defaultHint        = "the sandbox's network.allowOut, within the operator's ceiling"
)

// Config is shared by all the sandboxes a Proxy serves.
type Config struct {
	// Mappings answer for their names before Resolver does
	// (--egress-resolve); they are the only way to an upstream on loopback.
	Mappings []Mapping
	// Resolver resolves allowed names no mapping answers to the addresses
	// the proxy dials; nil is net.DefaultResolver.
	Resolver func(ctx context.Context, host string) ([]netip.Addr, error)
	// Dial opens upstream connections; nil is a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// HardDeny are prefixes never dialed, on top of the built-in list: the
	// daemon's sandbox range and its own host addresses.
	HardDeny []netip.Prefix
	// UpstreamRootCAs verifies the TLS the proxy originates when it
	// intercepts; nil is the system pool.
	UpstreamRootCAs *x509.CertPool
	// CA signs the certificates shown to sandboxes for intercepted hosts;
	// without it a host with a header rule is refused.
	CA *CA
	// Secrets resolves ${secret:NAME} in header rule values.
	Secrets func(name string) (string, error)
	// OperatorHint ends refusals: how an operator allows more, e.g.
	// "cella serve --egress-allow HOST, or a key's ceiling".
	OperatorHint string
	// PeekTimeout is how long a connection may stay silent before it is
	// taken for a server-speaks-first protocol (raw TCP); 0 is 5s.
	PeekTimeout time.Duration
	// UpstreamIdle is how long a sandbox's idle cleartext upstream
	// connection is kept for its next request (http.go); 0 is 4 s.
	UpstreamIdle time.Duration
	// DenyUpstream reports upstreams never dialed whatever the policy, with
	// why: the daemon's own API, which a name mapped to loopback would
	// otherwise reach (and through it other sandboxes).
	DenyUpstream func(netip.AddrPort) (string, bool)
	// Limits bound the connections held open (limits.go).
	Limits Limits
}

// Event is one decision. A blocked connection, HTTP request or DNS query
// is reported when it is decided. An allowed connection is reported once,
// when it closes, with its byte counts; an HTTP connection that carried a
// blocked request reports both. Each DNS query for a name is reported.
type Event struct {
	Time      time.Time
	SandboxID string
	Kind      string // "connect" or "dns"
	Proto     string // "http", "tls", "tcp" or "dns"
	Dst       string // the original destination ip:port (dns: the socket queried)
	Host      string // the name the decision was about, if any
	Upstream  string // the address dialed (dns: the fake address answered)
	Decision  string // "allowed" or "blocked"
	// Rule is the policy entry that decided, or a reason code:
	// no-match, hard-deny, host-mismatch, pinned-address,
	// unknown-fake-address, missing-secret, no-ca, resolve-failed, ...
	Rule string
	// Reason explains a block, or why an allowed connection failed. It
	// never contains a secret's value.
	Reason string
	// BytesOut were sent by the sandbox, BytesIn received by it, counted
	// on the sandbox's side of the proxy (TLS records included).
	BytesOut, BytesIn int64
}

// Sandbox is one sandbox's egress state: its policy, its fake DNS
// addresses and its event sink.
type Sandbox struct {
	ID string
	// Events receives every decision; it is called from many goroutines at
	// once and should not block. Set it before serving.
	Events func(Event)

	policy atomic.Pointer[compiledPolicy]
	fakes  fakeTable
	conns  atomic.Int64 // connections open through the proxy

	plainMu sync.Mutex
	plain   [2]*upstreamPool // idle cleartext upstream connections, by address and by name (http.go)
}

// SetPolicy replaces the policy for the connections and queries that
// follow; those in flight keep the policy they started with. nil is no
// egress. An invalid policy is refused and the previous one stays.
func (s *Sandbox) SetPolicy(p *Policy) error {
	if p == nil {
		s.policy.Store(noEgress)
		return nil
	}
	c, err := compileStrict(clonePolicy(*p))
	if err != nil {
		return err
	}
	s.policy.Store(c)
	return nil
}

// Policy returns a copy of the policy in force.
func (s *Sandbox) Policy() Policy {
	return clonePolicy(s.current().src)
}

func (s *Sandbox) current() *compiledPolicy {
	if c := s.policy.Load(); c != nil {
		return c
	}
	return noEgress
}

func (s *Sandbox) emit(e Event) {
	if s.Events == nil {
		return
	}
	e.Time = time.Now()
	e.SandboxID = s.ID
	s.Events(e)
}

// clonePolicy detaches a policy from the caller's slices and maps.
func clonePolicy(p Policy) Policy {
	out := Policy{AllowOut: slices.Clone(p.AllowOut), DenyOut: slices.Clone(p.DenyOut), AllowInternet: p.AllowInternet}
	if p.Rules == nil {
		return out
	}
	out.Rules = make(map[string][]Rule, len(p.Rules))
	for k, rs := range p.Rules {
		cp := make([]Rule, len(rs))
		for i, r := range rs {
			cp[i].Scheme, cp[i].Port = r.Scheme, r.Port
			if r.Transform != nil {
				cp[i].Transform = &Transform{Headers: maps.Clone(r.Transform.Headers)}
			}
		}
		out.Rules[k] = cp
	}
	return out
}

// Proxy serves the sandbox-side listeners and DNS sockets of any number of
// sandboxes.
type Proxy struct {
	cfg   Config
	maps  mappings
	wg    sync.WaitGroup // Serve and ServeDNS calls in progress
	conns atomic.Int64   // connections open, all sandboxes

	mu      sync.Mutex
	closed  bool
	serving map[io.Closer]struct{}
}

// New returns a proxy with cfg's defaults filled in.
func New(cfg Config) *Proxy {
	if cfg.Resolver == nil {
		cfg.Resolver = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	if cfg.Dial == nil {
		d := &net.Dialer{}
		cfg.Dial = d.DialContext
	}
	if cfg.PeekTimeout <= 0 {
		cfg.PeekTimeout = defaultPeekTimeout
	}
	if cfg.UpstreamIdle <= 0 {
		cfg.UpstreamIdle = defaultUpstreamIdle
	}
	if cfg.OperatorHint == "" {
		cfg.OperatorHint = defaultHint
	}
	if cfg.Limits.PerSandboxHint == "" {
		cfg.Limits.PerSandboxHint = "a higher per-sandbox connection limit"
	}
	if cfg.Limits.TotalHint == "" {
		cfg.Limits.TotalHint = "an operator can raise the daemon's open-file limit"
	}
	hd := make([]netip.Prefix, 0, len(cfg.HardDeny))
	for _, p := range cfg.HardDeny {
		hd = append(hd, unmapPrefix(p))
	}
	cfg.HardDeny = hd
	return &Proxy{cfg: cfg, maps: newMappings(cfg.Mappings), serving: map[io.Closer]struct{}{}}
}

// track registers a listener or socket so that Close can end its loop; it
// is false once the proxy is closed.
func (p *Proxy) track(c io.Closer) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.serving[c] = struct{}{}
	p.wg.Add(1)
	return true
}

func (p *Proxy) untrack(c io.Closer) {
	p.mu.Lock()
	delete(p.serving, c)
	p.mu.Unlock()
	p.wg.Done()
}

// Close closes every listener and socket being served and waits until
// every Serve and ServeDNS call has returned. Serve calls made afterwards
// return at once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	var errs []error
	for c := range p.serving {
		if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
	return errors.Join(errs...)
}

// Serve handles the connections accepted on ln, the listener the sandbox's
// TCP is redirected to, each in its own goroutine. origDst returns where a
// connection was going (SO_ORIGINAL_DST). Serve returns once ln is closed
// and every connection it accepted has been closed and its goroutines
// have ended.
func (p *Proxy) Serve(ln net.Listener, sb *Sandbox, origDst func(net.Conn) (netip.AddrPort, error)) {
	if !p.track(ln) {
		_ = ln.Close()
		return
	}
	defer p.untrack(ln)
	ctx, cancel := context.WithCancel(context.Background())
	var conns sync.WaitGroup
	defer func() {
		cancel()
		conns.Wait()
		sb.closePlain()
	}()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors or similar: retry without spinning, as
			// net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if ref := p.admit(sb, c); ref != nil {
			p.refuseConn(c, sb, origDst, ref)
			continue
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			defer p.release(sb)
			p.handle(ctx, c, sb, origDst)
		}()
	}
}

// session is one sandbox connection being decided and proxied.
type session struct {
	sb       *Sandbox
	pol      *compiledPolicy // the policy when the connection arrived
	client   *countingConn
	dst      netip.AddrPort
	fakeName string // the name dst was issued for, when it is a fake address

	mu       sync.Mutex
	proto    string
	allowed  *target // an allowed decision, reported at close
	upstream string
	reason   string
	secrets  map[string]string // values resolved on this connection, to redact
	redactor *strings.Replacer // of secrets, nil while there are none
}

// target is where an allowed connection goes.
type target struct {
	name  string // the allowed name, "" when the address decided
	rule  string
	addrs []netip.AddrPort // dialed in order until one answers
}

// refusal is a connection or request the proxy will not carry.
type refusal struct {
	blocked bool   // a policy decision, not an upstream failure
	status  int    // for plain HTTP
	code    string // Event.Rule
	msg     string // the explanation, without the "blocked by" prefix
}

// blockedByPolicy starts what a sandbox is shown for a policy decision: a
// plain HTTP answer's body and a DNS answer's extended error.
const blockedByPolicy = "blocked by cella sandbox policy: "

func policyRefusal(code, msg string) *refusal {
	return &refusal{blocked: true, status: http.StatusForbidden, code: code, msg: msg}
}

// body is what a plain HTTP client reads.
func (r *refusal) body() string {
	if r.blocked {
		return blockedByPolicy + r.msg + "\n"
	}
	return "cella egress: " + r.msg + "\n"
}

func (s *session) event(decision, host, rule, reason string) Event {
	s.mu.Lock()
	proto := s.proto
	s.mu.Unlock()
	dst := ""
	if s.dst.IsValid() {
		dst = s.dst.String()
	}
	return Event{
		Kind: "connect", Proto: proto, Dst: dst, Host: host,
		Decision: decision, Rule: rule, Reason: s.redact(reason),
	}
}

// refuse reports a refusal of t; the caller answers or closes the
// connection. An upstream failure is an allowed decision that failed, and
// is reported with the connection.
func (s *session) refuse(r *refusal, t target) {
	if !r.blocked {
		s.allow(t)
		s.setReason(r.msg)
		return
	}
	s.sb.emit(s.event("blocked", t.name, r.code, r.msg))
}

func (s *session) allow(t target) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.allowed == nil {
		s.allowed = &t
	}
}

func (s *session) setProto(proto string) {
	s.mu.Lock()
	s.proto = proto
	s.mu.Unlock()
}

func (s *session) setUpstream(addr string) {
	s.mu.Lock()
	if s.upstream == "" {
		s.upstream = addr
	}
	s.mu.Unlock()
}

func (s *session) setReason(reason string) {
	s.mu.Lock()
	if s.reason == "" {
		s.reason = reason
	}
	s.mu.Unlock()
}

// finish reports an allowed connection once it is over.
func (s *session) finish() {
	s.mu.Lock()
	t, up, reason := s.allowed, s.upstream, s.reason
	s.mu.Unlock()
	if t == nil {
		return
	}
	e := s.event("allowed", t.name, t.rule, reason)
	e.Upstream = up
	e.BytesOut, e.BytesIn = s.client.out.Load(), s.client.in.Load()
	s.sb.emit(e)
}

func (p *Proxy) handle(ctx context.Context, raw net.Conn, sb *Sandbox, origDst func(net.Conn) (netip.AddrPort, error)) {
	defer raw.Close()
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	defer stop()

	s := &session{sb: sb, pol: sb.current(), client: &countingConn{Conn: raw}, proto: "tcp"}
	defer s.finish()
	dst, err := origDst(raw)
	if err != nil {
		s.refuse(policyRefusal("no-original-destination", fmt.Sprintf("cella could not tell where this connection was going: %v", err)), target{})
		return
	}
	s.dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	if fakeRange.Contains(s.dst.Addr()) {
		name, ok := sb.fakes.lookup(s.dst.Addr())
		if !ok {
			s.refuse(policyRefusal("unknown-fake-address", fmt.Sprintf("%s is not an address cella's DNS gave this sandbox; look names up through the sandbox's resolver", s.dst.Addr())), target{})
			return
		}
		s.fakeName = name
	}

	br := bufio.NewReaderSize(s.client, peekBufSize)
	if serverFirstPorts[s.dst.Port()] {
		p.handleSilent(ctx, s, br)
		return
	}
	// Only silence is timed: a client that said nothing by then waits for
	// a server that speaks first. Once it has said something, what it says
	// decides, however slowly it comes (bounded by the handshake timeout,
	// after which it is closed, not waved through).
	_ = raw.SetReadDeadline(time.Now().Add(p.cfg.PeekTimeout))
	_, err = br.Peek(1)
	switch {
	case err == nil:
		p.dispatch(ctx, s, br, nil)
	case isTimeout(err):
		_ = raw.SetReadDeadline(time.Time{})
		p.handleSilent(ctx, s, br)
	case errors.Is(err, io.EOF):
		_ = raw.SetReadDeadline(time.Time{})
		p.handleTCP(ctx, s, br, nil)
	}
}

// dispatch handles a connection whose first bytes have come, by what they
// are; pre is an upstream connection already made for its raw decision.
func (p *Proxy) dispatch(ctx context.Context, s *session, br *bufio.Reader, pre net.Conn) {
	_ = s.client.SetReadDeadline(time.Now().Add(handshakeTimeout))
	kind, err := sniff(br)
	if err != nil {
		p.refuseStalled(s, err)
		return
	}
	if kind != sniffRaw && pre != nil {
		_ = pre.Close()
		pre = nil
	}
	switch kind {
	case sniffTLS:
		name, hello, err := readClientHello(br)
		_ = s.client.SetReadDeadline(time.Time{})
		if err != nil {
			// Whatever a server might make of these bytes, they are no
			// TLS cella can read, so it cannot check what is inside.
			s.setProto("tls")
			s.refuse(policyRefusal("not-tls", fmt.Sprintf("the connection starts like TLS but sends no ClientHello cella can read (%v)", err)), target{name: s.fakeName})
			return
		}
		p.handleTLS(ctx, s, name, &replayConn{Conn: s.client, r: io.MultiReader(bytes.NewReader(hello), br)})
	case sniffHTTP:
		_ = s.client.SetReadDeadline(time.Time{})
		s.setProto("http")
		p.serveHTTP(ctx, s, &replayConn{Conn: s.client, r: br}, nil, &upstreamConns{p: p, s: s})
	default:
		_ = s.client.SetReadDeadline(time.Time{})
		p.handleTCP(ctx, s, br, pre)
	}
}

// refuseStalled refuses a connection whose first bytes could start an
// HTTP request or a TLS handshake and then stopped coming.
func (p *Proxy) refuseStalled(s *session, err error) {
	why := fmt.Sprintf("the connection sent the start of what could be an HTTP request or a TLS handshake and then nothing for %v (%v): closed, since cella cannot check it", handshakeTimeout, err)
	s.refuse(policyRefusal("incomplete-request", why), target{name: s.fakeName})
}

// handleTCP carries a connection the proxy does not look into, decided by
// its destination; pre is the upstream connection if one was made.
func (p *Proxy) handleTCP(ctx context.Context, s *session, clientR io.Reader, pre net.Conn) {
	t, ref := p.decide(ctx, s, "", "")
	if ref != nil {
		s.refuse(ref, t)
		return
	}
	s.allow(t)
	p.pipe(ctx, s, t, clientR, pre)
}

// handleSilent handles a connection whose sandbox has said nothing: it is
// decided by its destination and the upstream is dialed, and then whoever
// speaks first decides. The sandbox: its bytes are handled as if they had
// come at once (so an HTTP request or a TLS hello sent after a pause is
// checked like any other). The upstream (a server that speaks first):
// the bytes go through, but a request line or TLS hello from the sandbox
// after it is refused, since it would go unchecked.
func (p *Proxy) handleSilent(ctx context.Context, s *session, br *bufio.Reader) {
	t, ref := p.decide(ctx, s, "", "")
	if ref != nil {
		s.refuse(ref, t)
		return
	}
	up, err := p.dial(ctx, t.addrs)
	if err != nil {
		s.allow(t)
		s.setReason(err.Error())
		return
	}
	cp, upc := newPeekConn(s.client, br), newPeekConn(up, nil)
	select {
	case <-cp.ready:
		if _, err := br.Peek(1); err == nil {
			p.dispatch(ctx, s, br, upc)
			return
		}
	case <-upc.ready:
	case <-ctx.Done():
		_ = up.Close()
		return
	}
	s.allow(t)
	p.pipe(ctx, s, t, &gatedReader{c: cp, s: s}, upc)
}

// handleTLS decides a TLS connection by its server name. One to a name is
// terminated (terminate.go); one without a name, decided by an allowed
// address, is spliced: there is no name to hold its requests to.
func (p *Proxy) handleTLS(ctx context.Context, s *session, serverName string, client net.Conn) {
	s.setProto("tls")
	t, ref := p.decide(ctx, s, serverName, "the TLS server name")
	if ref != nil {
		s.refuse(ref, t)
		return
	}
	if t.name != "" {
		p.terminate(ctx, s, t, client)
		return
	}
	s.allow(t)
	p.pipe(ctx, s, t, client, nil)
}

// pipe dials t, unless pre is a connection to it already, and copies both
// ways until both sides are done.
func (p *Proxy) pipe(ctx context.Context, s *session, t target, clientR io.Reader, pre net.Conn) {
	up := pre
	if up == nil {
		var err error
		if up, err = p.dial(ctx, t.addrs); err != nil {
			s.setReason(err.Error())
			return
		}
	}
	defer up.Close()
	stop := context.AfterFunc(ctx, func() { _ = up.Close() })
	defer stop()
	s.setUpstream(up.RemoteAddr().String())
	splice(s.client, clientR, up)
}

// splice copies both ways, passing on a half-close so that protocols that
// shut down their sending side first still get their answer; an error on
// either side ends both.
func splice(client net.Conn, clientR io.Reader, up net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	abort := func() {
		_ = client.Close()
		_ = up.Close()
	}
	go func() {
		defer wg.Done()
		if _, err := io.Copy(up, clientR); err != nil || closeWrite(up) != nil {
			abort()
		}
	}()
	go func() {
		defer wg.Done()
		if _, err := io.Copy(client, up); err != nil || closeWrite(client) != nil {
			abort()
		}
	}()
	wg.Wait()
}

func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// decide applies the policy to a connection to s.dst that names name
// (from via, e.g. "the TLS server name"; "" when it names nothing).
func (p *Proxy) decide(ctx context.Context, s *session, name, via string) (target, *refusal) {
	return p.decideName(ctx, s, hostName(name), via)
}

// hostName is the normalized name a Host header or server name gives: ""
// when it is an address, which names nothing (the destination decides).
func hostName(name string) string {
	name = normalizeName(name)
	if _, err := netip.ParseAddr(name); err == nil {
		return ""
	}
	return name
}

// decideName is decide for a name hostName returned.
func (p *Proxy) decideName(ctx context.Context, s *session, name, via string) (target, *refusal) {
	if s.fakeName != "" {
		switch {
		case name == "":
			name = s.fakeName
		case name != s.fakeName:
			return target{name: name}, policyRefusal("host-mismatch", fmt.Sprintf(
				"%s says %s but the connection was opened to the address cella gave for %s", capitalize(via), name, s.fakeName))
		}
	}
	if name == "" {
		return p.decideAddr(s)
	}
	// allowsHost, not allowsName: a fake address's name can be an IPv4
	// literal ("1.2.3.4" is a valid DNS name, and "*" lets it be looked
	// up), which only an address entry may allow.
	ok, rule := s.pol.allowsHost(name)
	if !ok {
		return target{name: name}, p.notAllowed(s.pol, name, rule)
	}
	rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	addrs, mapping, err := p.resolve(rctx, name)
	cancel()
	if err != nil {
		return target{name: name, rule: rule}, &refusal{status: http.StatusBadGateway, code: "resolve-failed", msg: fmt.Sprintf("%s could not be resolved: %v", name, err)}
	}
	if s.fakeName == "" {
		if !slices.Contains(addrs, s.dst.Addr()) {
			return target{name: name}, policyRefusal("pinned-address", fmt.Sprintf(
				"%s is allowed, but the connection was opened to %s, which is not an address of %s: a sandbox cannot pin an allowed name to another address (look the name up through the sandbox's resolver)",
				name, s.dst.Addr(), name))
		}
		if why, denied := p.deniedUpstream(s.dst, name, mapping); denied {
			return target{name: name}, policyRefusal("hard-deny", fmt.Sprintf("%s resolves to %s, which is %s: cella never connects there", name, s.dst.Addr(), why))
		}
		return target{name: name, rule: rule, addrs: []netip.AddrPort{s.dst}}, nil
	}
	var usable []netip.AddrPort
	denied := ""
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a, s.dst.Port())
		if why, bad := p.deniedUpstream(ap, name, mapping); bad {
			if denied == "" {
				denied = fmt.Sprintf("%s is %s", ap.Addr(), why)
			}
			continue
		}
		usable = append(usable, ap)
	}
	if len(usable) == 0 {
		return target{name: name}, policyRefusal("hard-deny", fmt.Sprintf("%s resolves only to addresses cella never connects to (%s)", name, denied))
	}
	return target{name: name, rule: rule, addrs: usable}, nil
}

func (p *Proxy) decideAddr(s *session) (target, *refusal) {
	a := s.dst.Addr()
	if why, denied := p.deniedUpstream(s.dst, "", nil); denied {
		return target{}, policyRefusal("hard-deny", fmt.Sprintf("%s is %s: cella never connects there", a, why))
	}
	ok, rule := s.pol.allowsAddr(a)
	if !ok {
		return target{}, p.notAllowed(s.pol, a.String(), rule)
	}
	return target{rule: rule, addrs: []netip.AddrPort{s.dst}}, nil
}

// notAllowed is the refusal of host (a name or an address) by pol, which
// rule decided.
func (p *Proxy) notAllowed(pol *compiledPolicy, host, rule string) *refusal {
	return policyRefusal(rule, fmt.Sprintf("%s is not allowed for this sandbox (%s); an operator can allow it with %s", host, pol.summary, p.cfg.OperatorHint))
}

// deniedUpstream describes why ap is never dialed for name, if it is not;
// m is the mapping name was resolved by (nil: DNS, or no name). Loopback
// is dialed only where m permits it.
func (p *Proxy) deniedUpstream(ap netip.AddrPort, name string, m *Mapping) (string, bool) {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	a := ap.Addr()
	if h, why, ok := builtinHardDeny(a); ok {
		return fmt.Sprintf("in %s (%s)", h, why), true
	}
	for _, h := range p.cfg.HardDeny {
		if h.Contains(a) {
			return fmt.Sprintf("in %s, which this cella never lets sandboxes reach", h), true
		}
	}
	if p.cfg.DenyUpstream != nil {
		if why, bad := p.cfg.DenyUpstream(ap); bad {
			return why, true
		}
	}
	if a.IsLoopback() && (m == nil || !m.permits(ap)) {
		return loopbackRefusal(a, name, m), true
	}
	return "", false
}

// loopbackRefusal says why a loopback address is not dialed for name.
func loopbackRefusal(a netip.Addr, name string, m *Mapping) string {
	const why = "loopback (the daemon's host itself)"
	switch {
	case m != nil && m.ports(a) != "":
		return fmt.Sprintf("%s, which %s may reach only on port %s (cella serve --egress-resolve %s)", why, name, m.ports(a), m)
	case name != "":
		return fmt.Sprintf("%s, which cella dials only for names an operator maps there (cella serve --egress-resolve %s=%s[:PORT])", why, name, a)
	}
	return why
}

// resolve returns name's addresses, IPv4 first since sandboxes and many
// hosts have no IPv6 route, and the mapping that gave them (nil: the
// resolver did).
func (p *Proxy) resolve(ctx context.Context, name string) ([]netip.Addr, *Mapping, error) {
	if m := p.maps.lookup(name); m != nil {
		return m.addrs(), m, nil
	}
	addrs, err := p.cfg.Resolver(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, a.Unmap())
	}
	if len(out) == 0 {
		return nil, nil, errors.New("no addresses")
	}
	slices.SortStableFunc(out, func(a, b netip.Addr) int {
		switch {
		case a.Is4() == b.Is4():
			return 0
		case a.Is4():
			return -1
		}
		return 1
	})
	return out, nil, nil
}

func (p *Proxy) dial(ctx context.Context, addrs []netip.AddrPort) (net.Conn, error) {
	var errs []error
	for _, a := range addrs {
		dctx, cancel := context.WithTimeout(ctx, dialTimeout)
		c, err := p.cfg.Dial(dctx, "tcp", a.String())
		cancel()
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("upstream unreachable: %w", errors.Join(errs...))
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// countingConn counts the bytes crossing the sandbox's side of the proxy.
type countingConn struct {
	net.Conn
	out atomic.Int64 // read from the sandbox
	in  atomic.Int64 // written to the sandbox
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.out.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.in.Add(int64(n))
	return n, err
}

func (c *countingConn) CloseWrite() error { return closeWrite(c.Conn) }

// replayConn reads what was already peeked before reading the connection.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func (c *replayConn) CloseWrite() error { return closeWrite(c.Conn) }
