package egress

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// DefaultMaxConnsPerSandbox is Config.MaxConnsPerSandbox when it is 0.
const DefaultMaxConnsPerSandbox = 1024

// Limits bound what the proxy holds open, so that one sandbox cannot use
// up the daemon's file descriptors: every connection the proxy carries
// costs it two (the sandbox's end and the upstream's). A connection past a
// limit is closed as soon as it is accepted and reported as a block event
// that names the limit. Beside them each sandbox may keep up to
// 2 × plainIdle idle cleartext upstream connections for Config.UpstreamIdle
// (http.go); MaxFD keeps those out of the daemon's reserve too.
type Limits struct {
	// PerSandbox is how many connections one sandbox may have open through
	// the proxy at once (0: DefaultMaxConnsPerSandbox, < 0: no limit).
	PerSandbox int
	// PerSandboxHint says how an operator raises PerSandbox, e.g.
	// "cella serve --egress-max-conns N".
	PerSandboxHint string
	// Total is how many the proxy holds for all sandboxes together (0: no
	// limit): what the daemon's descriptors allow after its reserve.
	Total int
	// MaxFD, when set, refuses a connection whose descriptor number is
	// MaxFD or more: the kernel hands out the lowest free number, so such
	// a number means the daemon is into the descriptors it keeps for its
	// API, its database and its sandboxes, whoever used up the rest.
	MaxFD int
	// TotalHint says how an operator raises Total and MaxFD.
	TotalHint string
}

func (l Limits) perSandbox() int {
	if l.PerSandbox == 0 {
		return DefaultMaxConnsPerSandbox
	}
	return l.PerSandbox
}

// admit counts a new connection of sb, or refuses it when a limit is
// reached; a connection admitted is released with release.
func (p *Proxy) admit(sb *Sandbox, c net.Conn) *refusal {
	l := p.cfg.Limits
	if l.MaxFD > 0 {
		if fd := connFD(c); fd >= l.MaxFD {
			return policyRefusal("daemon-connection-limit", fmt.Sprintf(
				"the cella daemon is running out of file descriptors (this connection got number %d; %d and up are kept for its API and sandboxes), so its egress proxy takes no more connections for now; %s",
				fd, l.MaxFD, l.TotalHint))
		}
	}
	if limit := l.perSandbox(); limit > 0 {
		if n := sb.conns.Add(1); n > int64(limit) {
			sb.conns.Add(-1)
			return policyRefusal("connection-limit", fmt.Sprintf(
				"this sandbox already has %d connections open through cella's egress proxy, its limit: close some first, or an operator can raise it with %s",
				limit, l.PerSandboxHint))
		}
	} else {
		sb.conns.Add(1)
	}
	if l.Total > 0 {
		if n := p.conns.Add(1); n > int64(l.Total) {
			p.conns.Add(-1)
			sb.conns.Add(-1)
			return policyRefusal("daemon-connection-limit", fmt.Sprintf(
				"cella's egress proxy already holds %d connections for all sandboxes, what this daemon's file descriptors allow; %s",
				l.Total, l.TotalHint))
		}
	} else {
		p.conns.Add(1)
	}
	return nil
}

func (p *Proxy) release(sb *Sandbox) {
	sb.conns.Add(-1)
	p.conns.Add(-1)
}

// Conns is how many connections the proxy holds open for all sandboxes.
func (p *Proxy) Conns() int64 { return p.conns.Load() }

// Conns is how many connections the sandbox has open through the proxy.
func (s *Sandbox) Conns() int64 { return s.conns.Load() }

// refuseConn reports a connection refused at accept and closes it, before
// reading anything: the refusal must cost as little as it can.
func (p *Proxy) refuseConn(c net.Conn, sb *Sandbox, origDst func(net.Conn) (netip.AddrPort, error), r *refusal) {
	defer c.Close()
	e := Event{Kind: "connect", Proto: "tcp", Decision: "blocked", Rule: r.code, Reason: r.msg}
	if origDst != nil {
		if dst, err := origDst(c); err == nil {
			e.Dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()).String()
			if name, ok := sb.fakes.lookup(dst.Addr()); ok {
				e.Host = name
			}
		}
	}
	sb.emit(e)
}

// connFD is c's descriptor number, -1 when it has none.
func connFD(c net.Conn) int {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	_ = raw.Control(func(f uintptr) { fd = int(f) })
	return fd
}
