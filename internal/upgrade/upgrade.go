// Package upgrade holds the one rule both of cella's HTTP proxies (the
// edge into sandboxes, the egress proxy out of them) apply to a 101
// Switching Protocols: it is passed on only when the request asked for
// that protocol. Any other 101 would turn the connection into a tunnel no
// later request on it is checked on.
package upgrade

import (
	"fmt"
	"net/http"
	"strings"

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
// ReverseProxy's ModifyResponse: httputil answers such a 101 with a 502
// itself, but leaves the answer's body — the connection — open until a
// finalizer closes it, while an error from ModifyResponse closes it at once.
func Check(res *http.Response) error {
	if res.StatusCode != http.StatusSwitchingProtocols {
		return nil
	}
	asked, to := Of(res.Request.Header), Of(res.Header)
	if asked == "" || !strings.EqualFold(asked, to) {
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
