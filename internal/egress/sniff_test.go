package egress

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"
)

func TestLineVerdict(t *testing.T) {
	for in, want := range map[string]verdict{
		"GET / HTTP/1.1":                       verdictYes,
		"GET / HTTP/1.1\r\n":                   verdictYes,
		"FOO /x HTTP/1.0\r\n":                  verdictYes, // any method: servers take any token
		"propfind / http/1.1\r\n":              verdictYes, // lenient servers ignore case
		"\r\n\r\nGET / HTTP/1.1\r\n":           verdictYes, // blank lines first, which servers skip
		"GET\t/ HTTP/1.1\r\n":                  verdictYes,
		"PRI * HTTP/2.0\r\n":                   verdictYes, // h2c's preface
		"G":                                    verdictMore,
		"GET / HTT":                            verdictMore,
		"\r\n":                                 verdictMore,
		"GET /":                                verdictMore,
		"GET /\r\n":                            verdictNo, // HTTP/0.9: no headers, no Host to route by
		"GETX":                                 verdictMore,
		"SSH-2.0-OpenSSH_9.2p1\r\n":            verdictNo,
		"SSH-2.0-OpenSSH_9.2p1 Debian\r\n":     verdictNo,
		"SET key value\r\n":                    verdictNo,
		"\x00\x00\x00\x08\x04\xd2\x16\x2f":     verdictNo,
		"OPTIONS rtsp://x/ RTSP/1.0\r\n":       verdictNo,
		"0032git-upload-pack /x\x00host=y\x00": verdictNo,
		"GET" + strings.Repeat("X", 70):        verdictNo, // no method is that long
		"\x10\x20\x00\x04MQTT\x04\x02\x00<":    verdictNo,
	} {
		if got := lineVerdict([]byte(in)); got != want {
			t.Errorf("lineVerdict(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestSniffReadsOnUntilItKnows: a request line that arrives in pieces is
// still HTTP (the caller's deadline, not sniff, bounds the wait).
func TestSniffReadsOnUntilItKnows(t *testing.T) {
	r, w := pipeReader()
	go func() {
		for _, part := range []string{"G", "ET", " /x", " HTT", "P/1.1\r\n"} {
			w <- part
		}
		close(w)
	}()
	if got, err := sniff(bufio.NewReader(r)); got != sniffHTTP || err != nil {
		t.Errorf("sniff of a request line in pieces = %v, %v", got, err)
	}
	if got, err := sniff(bufio.NewReader(strings.NewReader("GET /x"))); got != sniffRaw || err != nil {
		t.Errorf("sniff of a line cut by EOF = %v, %v", got, err)
	}
	if got, _ := sniff(bufio.NewReader(strings.NewReader("\x16\x03\x01"))); got != sniffTLS {
		t.Errorf("sniff of a TLS record = %v", got)
	}
	long := "GET /" + strings.Repeat("a", maxRequestLine)
	if got, _ := sniff(bufio.NewReaderSize(strings.NewReader(long), peekBufSize)); got != sniffHTTP {
		t.Errorf("sniff of an endless request line = %v", got)
	}
}

// pipeReader is a reader fed piece by piece.
func pipeReader() (*chanReader, chan<- string) {
	c := make(chan string)
	return &chanReader{c: c}, c
}

type chanReader struct {
	c    chan string
	rest string
}

func (r *chanReader) Read(b []byte) (int, error) {
	if r.rest == "" {
		s, ok := <-r.c
		if !ok {
			return 0, io.EOF
		}
		r.rest = s
	}
	n := copy(b, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}

// Bytes that start like TLS but are no ClientHello are refused: cella
// cannot check what is inside them.
func TestNotQuiteTLSIsRefused(t *testing.T) {
	echo := echoServer(t, "")
	h := newHarness(t, Policy{AllowOut: []string{"192.0.2.1", "pkg.test"}}, nil)
	for _, dst := range []netip.AddrPort{public(t, echo), netip.AddrPortFrom(h.fake("pkg.test"), public(t, echo).Port())} {
		c := h.dial(dst)
		fmt.Fprint(c, "\x16\x03\x01\x00\x05hello and more")
		if got := readAll(t, c); got != "" {
			t.Errorf("%s: got %q", dst, got)
		}
	}
	h.waitEvent("not TLS", func(e Event) bool { return e.Decision == "blocked" && e.Rule == "not-tls" && e.Host == "pkg.test" })
	h.waitEvent("not TLS by address", func(e Event) bool { return e.Decision == "blocked" && e.Rule == "not-tls" && e.Host == "" })
}
