// Package egress decides, for every connection and DNS query a sandbox
// makes, whether its network policy allows it, and then either proxies it
// upstream or refuses it with an explanation. With no policy at all a
// sandbox has no egress.
//
// The sandbox's network slot redirects every TCP connection to a listener
// served by Proxy.Serve and every DNS query to a socket served by
// Proxy.ServeDNS. The decision procedure:
//
// DNS. A query for a name the policy allows (AllowOut domain, wildcard or
// "*", and no DenyOut domain entry) gets a fake IPv4 address from
// 198.18.0.0/15, stable per (sandbox, name), which the proxy maps back to
// the name when the sandbox connects to it. AAAA answers are empty
// (sandboxes are IPv4-only); a name the policy does not allow gets
// NXDOMAIN, even when the policy allows raw IPs. The sandbox never learns a
// real address, so the name it asked for is the only thing it can connect
// to through that address.
//
// Connections. The proxy peeks at the first bytes: a TLS ClientHello gives
// the server name (SNI), an HTTP request line (any method, h2c's preface)
// its Host header. No timeout lets anything through unchecked: once a byte
// has come, what could still be a request line or a hello is waited for
// (and closed if it stalls); a sandbox that says nothing within
// Config.PeekTimeout (or on the well-known ports of server-speaks-first
// protocols, at once) is decided by its destination and dialed, and then
// whoever speaks first decides: the sandbox's bytes are handled as if they
// had come at once, and after a server that spoke first (no HTTP server) a
// request line or hello from the sandbox ends the connection. The name of
// a connection is that name, or, without one, the name the fake
// destination address was issued for.
//
//   - With a name: the policy must allow the name. When the destination is
//     a fake address issued for another name, the connection is refused
//     (the sandbox asked cella for one host and talks to another). When the
//     destination is a real address, it must be one the proxy itself
//     resolves for the name: a sandbox cannot pin an allowed name to an
//     address of its choosing. The proxy resolves the name, drops
//     hard-denied addresses and dials what is left on the original port.
//   - Without a name (raw TCP, HTTP without Host, TLS without SNI, to a real
//     address): the address must be allowed by an AllowOut IP or CIDR, not
//     by a DenyOut one, and not be hard-denied; the proxy dials it.
//
// Hard-denied addresses are never dialed whatever the policy says:
// 0.0.0.0/8, link-local (cloud metadata), multicast, reserved and
// broadcast, the fake range, Config.HardDeny (the daemon's sandbox range
// and host addresses) and Config.DenyUpstream (the daemon's own API), and
// loopback, except for the names a Mapping (--egress-resolve) maps there
// and on its port when it gives one: a name that DNS resolves to
// 127.0.0.1 is refused, and one mapping does not open loopback to others.
//
// Deny wins over allow, with one exception taken from E2B: a catch-all
// DenyOut entry ("0.0.0.0/0", "::/0", "*") only restates the default and
// yields to explicit AllowOut entries, so the E2B idiom
// denyOut: ["0.0.0.0/0"], allowOut: ["1.1.1.1"] lets 1.1.1.1 through.
//
// Allowed TLS to a name is terminated with a leaf certificate from the
// proxy's CA (terminate.go): each request inside must be for the server
// name (no domain fronting), header rules set their headers (secrets
// resolved per request and never shown), and requests go over the proxy's
// own verified TLS, whose ALPN choice the sandbox is given; what is not
// HTTP goes through re-encrypted. TLS without a name, decided by an
// allowed address, is spliced byte for byte. Plain HTTP is proxied request
// by request, so every request on a connection must name the host the
// connection was allowed for. A header rule applies to one scheme and port
// (https on 443 by default): a request to its host elsewhere is refused.
//
// Refusals: plain HTTP gets a 403 whose body starts with
// "blocked by cella sandbox policy: "; TLS and raw TCP are closed. Every
// decision is reported as an Event (see Event for when).
package egress
