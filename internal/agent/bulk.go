package agent

import (
	"errors"
	"io"
	"net/http"
	"sync"
)

// bulkChunk is how many bytes a file transfer moves per system call on
// the sandbox's side. Under gVisor every read and write of the agent is a
// trip through the sentry, whose cost does not depend on the size: writing
// 256 MiB to the writable layer with dd took 788 ms in 32 KiB writes (io.Copy's
// size) and 181 ms in 1 MiB ones in the same sandbox. The file and the
// channel's stream both see chunks of this size (the stream then sends
// frames as large as its window allows).
const bulkChunk = 1 << 20

var bulkBuffers = sync.Pool{New: func() any { b := make([]byte, bulkChunk); return &b }}

// copyFilled copies src to dst in writes of bulkChunk bytes (the last one
// shorter), each filled by as many reads of src as it takes: meant for
// copies into a file, where nobody waits for a partial chunk. Only src's
// io.EOF ends the copy well; any other read error is returned as it is —
// io.ErrUnexpectedEOF included, which is how a body cut short says so (an
// HTTP body shorter than its Content-Length, a truncated gzip stream).
func copyFilled(dst io.Writer, src io.Reader) (int64, error) {
	bp := bulkBuffers.Get().(*[]byte)
	defer bulkBuffers.Put(bp)
	buf := *bp
	var written int64
	for {
		n, rerr := fill(src, buf)
		if n > 0 {
			w, werr := dst.Write(buf[:n])
			written += int64(w)
			if werr != nil {
				return written, werr
			}
			if w != n {
				return written, io.ErrShortWrite
			}
		}
		if errors.Is(rerr, io.EOF) {
			return written, nil
		}
		if rerr != nil {
			return written, rerr
		}
	}
}

// fill reads from r until buf is full or a read fails; it returns what it
// read and the error that stopped it (nil when buf is full).
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// bulkResponse gathers what a handler writes into writes of bulkChunk bytes
// to the response (http.ServeContent copies a file in 32 KiB pieces).
// Nothing is sent before the buffer fills or done is called, so it is only
// for bodies nobody reads piece by piece as they are made; done must be
// called once the handler has written everything.
type bulkResponse struct {
	http.ResponseWriter
	bp *[]byte // nil once done
	n  int     // bytes buffered in *bp
}

func newBulkResponse(w http.ResponseWriter) *bulkResponse {
	return &bulkResponse{ResponseWriter: w, bp: bulkBuffers.Get().(*[]byte)}
}

// Write buffers p; a full buffer is sent, and so is a write at least as
// large as the buffer that finds it empty (without a copy). It hides the
// ResponseWriter's ReadFrom, which would copy in its own 32 KiB pieces.
func (b *bulkResponse) Write(p []byte) (int, error) {
	if b.bp == nil {
		return b.ResponseWriter.Write(p)
	}
	buf := *b.bp
	written := 0
	for len(p) > 0 {
		if b.n == 0 && len(p) >= len(buf) {
			n, err := b.ResponseWriter.Write(p)
			return written + n, err
		}
		c := copy(buf[b.n:], p)
		b.n += c
		p = p[c:]
		written += c
		if b.n == len(buf) {
			if err := b.send(); err != nil {
				return written, err
			}
		}
	}
	return written, nil
}

func (b *bulkResponse) send() error {
	n := b.n
	b.n = 0
	_, err := b.ResponseWriter.Write((*b.bp)[:n])
	return err
}

// done sends what is buffered and gives the buffer back; later writes go
// straight through.
func (b *bulkResponse) done() error {
	if b.bp == nil {
		return nil
	}
	var err error
	if b.n > 0 {
		err = b.send()
	}
	bulkBuffers.Put(b.bp)
	b.bp = nil
	return err
}
