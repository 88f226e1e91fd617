package channel

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// serveAgent answers the daemon's streams on the agent side with h.
func serveAgent(t *testing.T, a *AgentSession, h http.Handler) {
	t.Helper()
	conns := make(chan net.Conn)
	ln := &chanListener{conns: conns, done: make(chan struct{})}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	go func() {
		for {
			c, _, err := a.Accept()
			if err != nil {
				return
			}
			select {
			case conns <- c:
			case <-ln.done:
				c.Close()
				return
			}
		}
	}()
	t.Cleanup(func() { srv.Close() })
}

type chanListener struct {
	conns chan net.Conn
	done  chan struct{}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	return nil
}

func (l *chanListener) Addr() net.Addr { return &net.UnixAddr{Name: "agent", Net: "unix"} }

// TestStreamBodies: a request body sent through the channel's transport
// (bulkStream's ReadFrom, a large buffer) arrives whole, and a body that is
// streamed arrives piece by piece as it is written, never held back to fill
// the buffer (a Connect stream's input, a chunked upload to a port).
func TestStreamBodies(t *testing.T) {
	k := &tokens{}
	k.put(tokA)
	ln, sock := listen(t, k, newRefusals())
	a := dial(t, sock, tokA, 1)
	conn, _ := accept(t, ln)

	firstPiece := make(chan []byte, 1)
	serveAgent(t, a, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/sum":
			h := sha256.New()
			n, err := io.Copy(h, r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			_, _ = w.Write(append(h.Sum(nil), byte(n>>24), byte(n>>16), byte(n>>8), byte(n)))
		case "/stream":
			b := make([]byte, 64)
			n, _ := r.Body.Read(b)
			firstPiece <- b[:n]
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	client := &http.Client{Transport: conn.Transport()}

	body := make([]byte, 3<<20+5)
	_, _ = rand.Read(body)
	resp, err := client.Post("http://sandbox:49983/sum", "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := sha256.Sum256(body)
	n := len(body)
	if !bytes.Equal(got, append(want[:], byte(n>>24), byte(n>>16), byte(n>>8), byte(n))) {
		t.Fatalf("the agent saw another body: %x", got)
	}

	// A body of a known length (the transport copies it through the
	// stream's ReadFrom) whose second half comes only after the first
	// arrived.
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, "http://sandbox:49983/stream", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = 10
	done := make(chan error, 1)
	go func() {
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	if _, err := pw.Write([]byte("first")); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-firstPiece:
		if string(p) != "first" {
			t.Fatalf("first piece %q", p)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a streamed body's first piece did not arrive while the body stayed open")
	}
	if _, err := pw.Write([]byte("-last")); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestSendBuffer: the daemon's end of a session the Listener takes may
// hold sendBuffer bytes in flight (SO_SNDBUFFORCE: as root), so that a
// large frame goes out at once; the agent's end keeps the default.
func TestSendBuffer(t *testing.T) {
	if unix.Geteuid() != 0 {
		t.Skip("SO_SNDBUFFORCE needs root")
	}
	before := widened(t)
	k := &tokens{}
	k.put(tokA)
	ln, sock := listen(t, k, newRefusals())
	dial(t, sock, tokA, 1)
	accept(t, ln)
	if got := widened(t) - before; got != 1 {
		t.Fatalf("%d more sockets with a send buffer of %d or more, want the daemon's end only", got, sendBuffer)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	widenSendBuffer(a) // not a socket: left alone
}

// widened counts this process's sockets whose send buffer is at least
// sendBuffer (Linux reports twice what was set).
func widened(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF); err == nil && v >= sendBuffer {
			n++
		}
	}
	return n
}
