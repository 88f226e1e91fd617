package egress

import (
	"fmt"
	"net"
	"testing"
)

func TestLooksHTTP(t *testing.T) {
	for in, want := range map[string]verdict{
		"GET / HTTP/1.1": verdictYes,
		"GE":             verdictMore,
		"P":              verdictMore, // POST, PUT or PATCH
		"PUT ":           verdictYes,
		"GETX":           verdictNo,
		"SSH-2.0":        verdictNo,
		"PRI * HTTP/2.0": verdictNo,
	} {
		if got := looksHTTP([]byte(in)); got != want {
			t.Errorf("looksHTTP(%q) = %v, want %v", in, got, want)
		}
	}
}

// Bytes that start like TLS but are no ClientHello go through untouched,
// decided like raw TCP.
func TestNotQuiteTLSGoesThroughAsRaw(t *testing.T) {
	echo := echoServer(t, "")
	h := newHarness(t, Policy{AllowOut: []string{"192.0.2.1"}}, nil)
	c := h.dial(public(t, echo))
	payload := "\x16\x03\x01\x00\x05hello and more"
	fmt.Fprint(c, payload)
	c.(*net.TCPConn).CloseWrite()
	if got := readAll(t, c); got != "echo: "+payload {
		t.Errorf("got %q", got)
	}
	e := h.waitEvent("raw", func(e Event) bool { return e.Kind == "connect" && e.Decision == "allowed" })
	if e.Proto != "tcp" || e.BytesOut != int64(len(payload)) {
		t.Errorf("event = %+v", e)
	}
}
