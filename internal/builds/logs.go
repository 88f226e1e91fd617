package builds

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/store"
)

// Log bounds: a build's log is kept in SQLite and served page by page, so
// a RUN that prints without end must not fill the disk or the memory.
const (
	// DefaultMaxLogBytes is the most message bytes one build's log keeps;
	// past it lines are counted, not kept, and the log says so.
	DefaultMaxLogBytes int64 = 8 << 20
	// MaxLineBytes is the most of one message kept.
	MaxLineBytes = 16 << 10
	// reserveBytes is what lines of the whole build and errors may take
	// past the cap.
	reserveBytes = 64 << 10
	// flushEvery and flushLines bound what waits in memory for SQLite.
	flushEvery = 100 * time.Millisecond
	flushLines = 512
)

// logSink is the log of one running build: lines are numbered and queued
// as the engine sends them (never blocking it on SQLite), and written in
// batches by a flusher; a status request flushes first, so it sees every
// line sent before it.
type logSink struct {
	st      *store.Store
	buildID string
	max     int64
	log     *slog.Logger

	// flushMu serializes writes to SQLite, so lines land in order.
	flushMu sync.Mutex

	mu        sync.Mutex
	pending   []store.BuildLog
	next      int
	bytes     int64
	truncated bool
	dropped   int64
	kick      chan struct{}
	done      chan struct{}
	stopped   chan struct{}
}

func newLogSink(st *store.Store, buildID string, start int, max int64, log *slog.Logger) *logSink {
	l := &logSink{st: st, buildID: buildID, next: start, max: max, log: log,
		kick: make(chan struct{}, 1), done: make(chan struct{}), stopped: make(chan struct{})}
	go l.flusher()
	return l
}

func (l *logSink) flusher() {
	defer close(l.stopped)
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			l.flush()
			return
		case <-t.C:
		case <-l.kick:
		}
		l.flush()
	}
}

// add is the build.Builder's log callback. Past the cap, only the
// build's own lines (no step: "Build finished", "Build failed: ...") and
// errors are kept, within a small reserve, the count of the dropped ones
// before them.
func (l *logSink) add(e build.LogEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	msg := e.Message
	if len(msg) > MaxLineBytes {
		msg = msg[:MaxLineBytes] + fmt.Sprintf(" [cella: line cut at %d KiB]", MaxLineBytes>>10)
	}
	e.Message = msg
	if !l.truncated && l.bytes+int64(len(msg)) > l.max {
		l.truncated = true
		l.appendLocked(build.LogEntry{Level: build.LevelWarn, Step: e.Step,
			Message: fmt.Sprintf("[cella: the build log reached its limit of %d MiB; later lines are not kept, the build goes on]", l.max>>20)})
	}
	if !l.truncated {
		l.appendLocked(e)
		return
	}
	if e.Step != "" && e.Level != build.LevelError || l.bytes+int64(len(msg)) > l.max+reserveBytes {
		l.dropped++
		return
	}
	if l.dropped > 0 {
		l.appendLocked(build.LogEntry{Level: build.LevelWarn,
			Message: fmt.Sprintf("[cella: %d log lines past the %d MiB limit were not kept]", l.dropped, l.max>>20)})
		l.dropped = 0
	}
	l.appendLocked(e)
}

func (l *logSink) appendLocked(e build.LogEntry) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if e.Level == "" {
		e.Level = build.LevelInfo
	}
	l.pending = append(l.pending, store.BuildLog{Seq: l.next, Time: e.Time, Level: e.Level, Message: e.Message, Step: e.Step})
	l.next++
	l.bytes += int64(len(e.Message))
	if len(l.pending) >= flushLines {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// flush writes the queued lines.
func (l *logSink) flush() {
	l.flushMu.Lock()
	defer l.flushMu.Unlock()
	l.mu.Lock()
	batch := l.pending
	l.pending = nil
	l.mu.Unlock()
	if err := l.st.AppendBuildLogs(context.Background(), l.buildID, batch); err != nil {
		l.log.Error("store build log", "build", l.buildID, "lines", len(batch), "err", err)
	}
}

// close flushes what is left and stops the flusher.
func (l *logSink) close() {
	close(l.done)
	<-l.stopped
}
