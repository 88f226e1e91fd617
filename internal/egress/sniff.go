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
	sniffHTTP                // an HTTP/1.x request line
	sniffGone                // the sandbox dropped the connection
)

// httpMethods start the request lines recognized as HTTP. PRI (HTTP/2
// prior knowledge) is not among them: it carries no Host to decide on
// before the binary framing, so it goes through as raw TCP.
var httpMethods = [][]byte{
	[]byte("GET "), []byte("HEAD "), []byte("POST "), []byte("PUT "), []byte("DELETE "),
	[]byte("OPTIONS "), []byte("PATCH "), []byte("TRACE "), []byte("CONNECT "),
}

// sniff classifies a connection by its first bytes without consuming them.
// The read deadline set by the caller bounds the wait: silence means the
// server speaks first.
func sniff(br *bufio.Reader) sniffed {
	n := max(br.Buffered(), 1)
	for {
		b, err := br.Peek(n)
		if len(b) == 0 {
			if isTimeout(err) || errors.Is(err, io.EOF) {
				return sniffRaw
			}
			return sniffGone
		}
		if b[0] == 0x16 {
			// A handshake record of any TLS version starts 0x16 0x03.
			if len(b) >= 2 {
				if b[1] == 0x03 {
					return sniffTLS
				}
				return sniffRaw
			}
		} else {
			switch looksHTTP(b) {
			case verdictYes:
				return sniffHTTP
			case verdictNo:
				return sniffRaw
			}
		}
		if err != nil {
			return sniffRaw
		}
		n = len(b) + 1
	}
}

type verdict int

const (
	verdictNo verdict = iota
	verdictYes
	verdictMore
)

func looksHTTP(b []byte) verdict {
	v := verdictNo
	for _, m := range httpMethods {
		if bytes.HasPrefix(b, m) {
			return verdictYes
		}
		if len(b) < len(m) && bytes.HasPrefix(m, b) {
			v = verdictMore
		}
	}
	return v
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
