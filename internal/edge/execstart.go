package edge

import (
	"encoding/binary"
	"io"
	"net/http"
	"time"

	"github.com/cella-sandbox/cella/internal/agentapi"
)

// processStartPath is envd's process.Process/Start over Connect: a server
// stream whose first message is the process's start event.
const processStartPath = "/process.Process/Start"

// timeExecStart makes rp's answer to a process Start report, once, how long
// it took from the request reaching the edge to its first message (the
// start event, pid included) having passed through. An answer that is not
// a stream of messages, or whose first frame ends the stream (an error),
// reports nothing.
func (p *Proxy) timeExecStart(r *http.Request, t Target, sb Sandbox, start time.Time) func(*http.Response) error {
	if p.execStarted == nil || t.Port != agentapi.Port || r.Method != http.MethodPost || r.URL.Path != processStartPath {
		return nil
	}
	return func(resp *http.Response) error {
		if resp.StatusCode != http.StatusOK {
			return nil
		}
		resp.Body = &firstFrame{ReadCloser: resp.Body, done: func() { p.execStarted(sb, time.Since(start)) }}
		return nil
	}
}

// firstFrame watches a Connect stream for the end of its first envelope (5
// bytes of flags and length, then the message).
type firstFrame struct {
	io.ReadCloser
	head [5]byte
	seen int    // bytes of the stream read so far
	need int64  // bytes up to the end of the first frame, once its head is read
	done func() // nil once called or given up
}

// endStreamFlag marks Connect's end-of-stream frame.
const endStreamFlag = 0x02

func (f *firstFrame) Read(b []byte) (int, error) {
	n, err := f.ReadCloser.Read(b)
	if f.done != nil && n > 0 {
		f.observe(b[:n])
	}
	return n, err
}

func (f *firstFrame) observe(b []byte) {
	for len(b) > 0 && f.seen < len(f.head) {
		f.head[f.seen] = b[0]
		f.seen++
		b = b[1:]
		if f.seen == len(f.head) {
			if f.head[0]&endStreamFlag != 0 {
				f.done = nil // an error, not a start
				return
			}
			f.need = int64(len(f.head)) + int64(binary.BigEndian.Uint32(f.head[1:]))
		}
	}
	if f.seen < len(f.head) {
		return
	}
	f.seen += len(b)
	if int64(f.seen) >= f.need {
		done := f.done
		f.done = nil
		done()
	}
}
