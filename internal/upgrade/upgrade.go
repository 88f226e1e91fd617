// Package upgrade holds the one rule both of cella's HTTP proxies (the
// edge into sandboxes, the egress proxy out of them) apply to a 101
// Switching Protocols: it is passed on only when the request asked for
// that protocol. Any other 101 would turn the connection into a tunnel no
// later request on it is checked on.
package upgrade

import (
	"fmt"
	"net/http"

	"golang.org/x/net/http/httpguts"
)

// UnaskedError is a 101 the request did not ask for.
type UnaskedError struct {
	To    string // the protocol the answer switched to ("" when it named none)
	Asked string // the protocol the request asked for ("" when it asked for none)
}

func (e *UnaskedError) Error() string {
	return fmt.Sprintf("101 Switching Protocols to %q, which the request did not ask for (it asked for %q)", e.To, e.Asked)
}

// Check refuses res when it is a 101 whose protocol is not the one its
// request asked for (by Connection: Upgrade and Upgrade). Meant for a
// ReverseProxy's ModifyResponse, which runs before httputil switches
// protocols; its error closes the answer's body — the connection — at
// once. It refuses at least whatever httputil would refuse after it: a
// protocol that is not printable ASCII, or that differs from the one asked
// for under an ASCII case fold (strings.EqualFold would also take
// "websoc\u212aet", Kelvin's K, for "websocket") — httputil answers those
// with a 502 but leaves the connection to a finalizer. And a bare 101 to a
// request that asked for nothing, which httputil itself would turn into a
// tunnel ("" equals "").
func Check(res *http.Response) error {
	if res.StatusCode != http.StatusSwitchingProtocols {
		return nil
	}
	asked, to := Of(res.Request.Header), Of(res.Header)
	if asked == "" || !printableASCII(to) || !asciiEqualFold(asked, to) {
		return &UnaskedError{To: res.Header.Get("Upgrade"), Asked: asked}
	}
	return nil
}

// Of is the protocol h's Upgrade field names when its Connection field
// says Upgrade, else "".
func Of(h http.Header) string {
	if !httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade") {
		return ""
	}
	return h.Get("Upgrade")
}

// printableASCII is whether s is all printable ASCII, as httputil requires
// of a protocol it switches to.
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// asciiEqualFold is httputil's comparison of protocols: case folded in
// ASCII only.
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if lowerASCII(a[i]) != lowerASCII(b[i]) {
			return false
		}
	}
	return true
}

func lowerASCII(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}
