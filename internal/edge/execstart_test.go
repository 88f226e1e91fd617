package edge

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
)

func frame(flags byte, msg string) []byte {
	b := make([]byte, 5, 5+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// oneByte reads one byte at a time: a frame split anywhere.
type oneByte struct{ r io.Reader }

func (o oneByte) Read(b []byte) (int, error) { return o.r.Read(b[:1]) }
func (o oneByte) Close() error               { return nil }

// TestFirstFrame: the start is reported once, when the first message has
// passed whole however the stream is cut, and never for a stream whose
// first frame ends it (an error).
func TestFirstFrame(t *testing.T) {
	start, data := frame(0, `{"event":{"start":{"pid":7}}}`), frame(0, `{"event":{"data":{}}}`)
	for name, tc := range map[string]struct {
		stream []byte
		want   int
		at     int // bytes read when reported
	}{
		"start then data": {append(append([]byte{}, start...), data...), 1, len(start)},
		"error first":     {frame(endStreamFlag, `{"error":{"code":"not_found"}}`), 0, 0},
		"cut short":       {start[:len(start)-1], 0, 0},
	} {
		calls, read, at := 0, 0, 0
		f := &firstFrame{ReadCloser: oneByte{bytes.NewReader(tc.stream)}}
		f.done = func() { calls++; at = read + 1 } // during the read of its last byte
		buf := make([]byte, 64)
		for {
			n, err := f.Read(buf)
			read += n
			if err != nil {
				break
			}
		}
		if calls != tc.want || (tc.want == 1 && at != tc.at) {
			t.Errorf("%s: reported %d times after %d bytes; want %d after %d", name, calls, at, tc.want, tc.at)
		}
	}
}
