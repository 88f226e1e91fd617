package agent

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// trickle reads at most n bytes at a time, like a body arriving in frames.
type trickle struct {
	r io.Reader
	n int
}

func (t *trickle) Read(p []byte) (int, error) {
	if len(p) > t.n {
		p = p[:t.n]
	}
	return t.r.Read(p)
}

// writes records the size of every write.
type writes struct {
	bytes.Buffer
	sizes []int
}

func (w *writes) Write(p []byte) (int, error) {
	w.sizes = append(w.sizes, len(p))
	return w.Buffer.Write(p)
}

// TestCopyFilled: a source that trickles is written in whole chunks (the
// last one shorter), every byte in order; a read error ends the copy with
// that error, a write error with the write's.
func TestCopyFilled(t *testing.T) {
	data := make([]byte, 2*bulkChunk+12345)
	_, _ = rand.Read(data)
	var dst writes
	n, err := copyFilled(&dst, &trickle{r: bytes.NewReader(data), n: 7001})
	if err != nil || n != int64(len(data)) {
		t.Fatalf("copied %d, %v", n, err)
	}
	if !bytes.Equal(dst.Bytes(), data) {
		t.Fatal("the copy differs")
	}
	if want := []int{bulkChunk, bulkChunk, 12345}; len(dst.sizes) != 3 || dst.sizes[0] != want[0] || dst.sizes[1] != want[1] || dst.sizes[2] != want[2] {
		t.Fatalf("writes %v, want %v", dst.sizes, want)
	}

	// A body cut short ends its reads with io.ErrUnexpectedEOF (net/http's
	// body before its Content-Length, gzip): an error, not an end.
	n, err = copyFilled(io.Discard, io.MultiReader(bytes.NewReader(data[:1000]), &failing{io.ErrUnexpectedEOF}))
	if !errors.Is(err, io.ErrUnexpectedEOF) || n != 1000 {
		t.Fatalf("a body cut short: copied %d, %v", n, err)
	}
	cut := errors.New("client went away")
	n, err = copyFilled(io.Discard, io.MultiReader(bytes.NewReader(data[:1000]), &failing{cut}))
	if !errors.Is(err, cut) || n != 1000 {
		t.Fatalf("a failing source: copied %d, %v", n, err)
	}
	full := errors.New("no space left on device")
	if _, err := copyFilled(&failingWriter{full}, bytes.NewReader(data)); !errors.Is(err, full) {
		t.Fatalf("a failing destination: %v", err)
	}
	if n, err := copyFilled(&dst, bytes.NewReader(nil)); n != 0 || err != nil {
		t.Fatalf("an empty source: %d, %v", n, err)
	}
}

type failing struct{ err error }

func (f *failing) Read([]byte) (int, error) { return 0, f.err }

type failingWriter struct{ err error }

func (f *failingWriter) Write([]byte) (int, error) { return 0, f.err }

// countingRecorder is a ResponseWriter that counts the writes of the body.
type countingRecorder struct {
	*httptest.ResponseRecorder
	writes int
}

func (c *countingRecorder) Write(p []byte) (int, error) {
	c.writes++
	return c.ResponseRecorder.Write(p)
}

// TestBulkResponse: http.ServeContent through a bulkResponse sends a file
// in writes of bulkChunk (it copies in 32 KiB pieces) and keeps its range
// answers; what is buffered goes out at done, and writes after done pass
// straight through.
func TestBulkResponse(t *testing.T) {
	data := make([]byte, 3*bulkChunk/2)
	_, _ = rand.Read(data)
	serve := func(r *http.Request) *countingRecorder {
		rec := &countingRecorder{ResponseRecorder: httptest.NewRecorder()}
		bw := newBulkResponse(rec)
		http.ServeContent(bw, r, "f.bin", time.Unix(0, 0), bytes.NewReader(data))
		if err := bw.done(); err != nil {
			t.Fatal(err)
		}
		if err := bw.done(); err != nil { // idempotent
			t.Fatal(err)
		}
		return rec
	}
	rec := serve(httptest.NewRequest(http.MethodGet, "/files", nil))
	if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), data) {
		t.Fatalf("GET: %d, %d bytes", rec.Code, rec.Body.Len())
	}
	if rec.writes != 2 {
		t.Fatalf("%d writes of the body, want 2 (a full chunk and the rest)", rec.writes)
	}
	r := httptest.NewRequest(http.MethodGet, "/files", nil)
	r.Header.Set("Range", "bytes=100-199")
	rec = serve(r)
	if rec.Code != http.StatusPartialContent || !bytes.Equal(rec.Body.Bytes(), data[100:200]) {
		t.Fatalf("range: %d %q", rec.Code, rec.Body.Bytes())
	}

	rec = &countingRecorder{ResponseRecorder: httptest.NewRecorder()}
	bw := newBulkResponse(rec)
	_, _ = bw.Write([]byte("held"))
	if rec.writes != 0 {
		t.Fatal("a small write went out before done")
	}
	_ = bw.done()
	_, _ = bw.Write([]byte(" after"))
	if rec.Body.String() != "held after" || rec.writes != 2 {
		t.Fatalf("body %q after %d writes", rec.Body.String(), rec.writes)
	}
}

// TestUploadCutShort: an upload whose body ends early — a gzip stream cut
// in half, a body shorter than its Content-Length — is the client's error
// (400 naming it), never a file written as if it were whole.
func TestUploadCutShort(t *testing.T) {
	e := newTestEnv(t)
	data := make([]byte, 3*bulkChunk)
	_, _ = rand.Read(data)
	var zbuf bytes.Buffer
	zw := gzip.NewWriter(&zbuf)
	_, _ = zw.Write(data)
	_ = zw.Close()
	half := zbuf.Bytes()[:zbuf.Len()/2]

	target := filepath.Join(e.rootDir, "cut.bin")
	req, _ := http.NewRequest("POST", e.ts.URL+"/files?path="+url.QueryEscape(target), bytes.NewReader(half))
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Content-Encoding", "gzip")
	if resp, b := do(t, req); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "error reading the upload") {
		t.Fatalf("a gzip body cut in half: %d %s", resp.StatusCode, b)
	}

	// A body shorter than its Content-Length: the client hangs up early.
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /files?path=%s HTTP/1.1\r\nHost: agent\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", url.QueryEscape(target+"2"), len(data))
	_, _ = conn.Write(data[:len(data)/3])
	_ = conn.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "error reading the upload") {
		t.Fatalf("a body shorter than its Content-Length: %d %s", resp.StatusCode, b)
	}
}
