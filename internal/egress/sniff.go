package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

type sniffed int

const (
	sniffRaw  sniffed = iota // anything else, including silence
	sniffTLS                 // a TLS handshake record
	sniffHTTP                // something an HTTP/1.x server would take for a request line (h2c's preface included)
	sniffGone                // the sandbox dropped the connection
)

const (
	// peekBufSize holds a first line of maxRequestLine.
	peekBufSize = 32 << 10
	// maxRequestLine bounds what is read of a first line: a longer line
	// after a method is taken for HTTP, which cella's HTTP server refuses.
	maxRequestLine = 16 << 10
	// maxMethod bounds the token before the first space: no method is this
	// long, and a long run of token characters is some other protocol.
	maxMethod = 64
)

// sniff classifies a connection whose first byte has arrived, without
// consuming anything. It reads on until the bytes decide, without a
// timeout of its own (the caller's deadline bounds it): a request line
// sent slowly, a byte at a time, is still a request line, so that no HTTP
// request goes through unchecked for being slow. The error is the read's
// when the bytes so far could still start a request line.
func sniff(br *bufio.Reader) (sniffed, error) {
	b, err := br.Peek(1)
	if err != nil {
		return sniffGone, err
	}
	if b[0] == 0x16 {
		// A handshake record of any TLS version starts 0x16 0x03.
		if b, err = br.Peek(2); err != nil {
			if errors.Is(err, io.EOF) {
				return sniffRaw, nil // one byte and the end: nothing to decide on
			}
			return sniffRaw, err
		}
		if b[1] == 0x03 {
			return sniffTLS, nil
		}
		return sniffRaw, nil
	}
	return sniffLine(br)
}

// sniffLine decides whether the first line of br is an HTTP request line:
// a method token, a space, and "HTTP/" before the line ends. It is
// generous on purpose (any method; blank lines and spaces before it, which
// some servers skip; a tab for the space), since what it takes for HTTP
// goes through cella's HTTP server, which checks the Host of every request
// and refuses malformed ones, while what it does not is passed on as bytes
// that no HTTP server would take for a request.
func sniffLine(br *bufio.Reader) (sniffed, error) {
	n := 1
	for {
		b, err := br.Peek(n)
		switch lineVerdict(b) {
		case verdictYes:
			return sniffHTTP, nil
		case verdictNo:
			return sniffRaw, nil
		}
		if len(b) >= maxRequestLine {
			return sniffHTTP, nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				// No request can be finished after the end.
				return sniffRaw, nil
			}
			return sniffRaw, err
		}
		n = max(len(b)+1, br.Buffered())
	}
}

type verdict int

const (
	verdictNo verdict = iota
	verdictYes
	verdictMore
)

// lineVerdict says what the bytes so far make of a first line.
func lineVerdict(b []byte) verdict {
	i := 0
	for i < len(b) && (b[i] == '\r' || b[i] == '\n' || b[i] == ' ' || b[i] == '\t') {
		i++
	}
	start := i
	for i < len(b) && isTokenChar(b[i]) {
		if i-start >= maxMethod {
			return verdictNo
		}
		i++
	}
	switch {
	case i == len(b):
		return verdictMore
	case i == start || (b[i] != ' ' && b[i] != '\t'):
		return verdictNo
	}
	rest := b[i:]
	end := bytes.IndexByte(rest, '\n')
	if end >= 0 {
		rest = rest[:end]
	}
	for _, c := range rest {
		if (c < 0x20 && c != '\t' && c != '\r') || c == 0x7f {
			// No request line holds a control character (git's pkt-line
			// does: "0032git-upload-pack /x\x00host=...").
			return verdictNo
		}
	}
	if containsHTTPVersion(rest) {
		return verdictYes
	}
	if end >= 0 {
		return verdictNo
	}
	return verdictMore
}

// containsHTTPVersion looks for "HTTP/", in any case (lenient servers).
func containsHTTPVersion(b []byte) bool {
	const v = "HTTP/"
	for i := 0; i+len(v) <= len(b); i++ {
		j := 0
		for j < len(v) && (b[i+j] == v[j] || (v[j] >= 'A' && v[j] <= 'Z' && b[i+j] == v[j]+'a'-'A')) {
			j++
		}
		if j == len(v) {
			return true
		}
	}
	return false
}

// isTokenChar is RFC 9110's tchar.
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), c) >= 0
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

var errHelloRead = errors.New("client hello read")

// readClientHello reads a TLS ClientHello from r and returns its server
// name and every byte it read, to be replayed upstream. crypto/tls does
// the parsing (fragmented records, extensions) and stops at the hello.
func readClientHello(r io.Reader) (string, []byte, error) {
	var rec bytes.Buffer
	var name string
	got := false
	conn := &helloConn{r: io.TeeReader(r, &rec)}
	err := tls.Server(conn, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			name, got = h.ServerName, true
			return nil, errHelloRead
		},
	}).Handshake()
	if !got {
		return "", rec.Bytes(), fmt.Errorf("egress: no TLS ClientHello: %w", err)
	}
	return name, rec.Bytes(), nil
}

// helloConn feeds crypto/tls a read-only stream; what the server half
// would answer (an alert) is dropped, since the real upstream answers.
type helloConn struct {
	r io.Reader
}

func (c *helloConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c *helloConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *helloConn) Close() error                     { return nil }
func (c *helloConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *helloConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *helloConn) SetDeadline(time.Time) error      { return nil }
func (c *helloConn) SetReadDeadline(time.Time) error  { return nil }
func (c *helloConn) SetWriteDeadline(time.Time) error { return nil }
