package agent

import (
	"io"
	"sync"
)

// maxLogBytes caps what one agent writes to its log: the log is a file on
// the host (the container's stderr, runtime.Spec.LogPath), outside the
// sandbox's disk limit, and some of its lines follow what happens inside
// the sandbox. 8 MiB keeps every line of a sandbox's normal life.
const maxLogBytes = 8 << 20

// cappedWriter passes on writes until left bytes are used up, then drops
// the rest with one line that says so. A write is passed whole or not at
// all, so the log never ends in half a line.
type cappedWriter struct {
	mu   sync.Mutex
	w    io.Writer
	left int64
	done bool
}

const capNotice = "cella agent: log capped: further lines are dropped\n"

func (c *cappedWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return len(p), nil
	}
	if int64(len(p)) > c.left-int64(len(capNotice)) {
		c.done = true
		_, _ = io.WriteString(c.w, capNotice)
		return len(p), nil
	}
	c.left -= int64(len(p))
	return c.w.Write(p)
}
