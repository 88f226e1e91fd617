package daemon

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/egress"
)

// The daemon logs a sandbox's first blockLogBurst refusals of every
// blockLogWindow one by one and sums up the rest in one line when the
// window ends: a sandbox that floods refusals (20,000 blocked lookups a
// second) must not flood the daemon's log. The audit log keeps them, within
// its own bounds.
const (
	blockLogBurst  = 10
	blockLogWindow = 10 * time.Second
)

// blockLog writes the daemon's "egress blocked" lines.
type blockLog struct {
	log    *slog.Logger
	burst  int
	window time.Duration

	mu      sync.Mutex
	windows map[string]*blockWindow // by sandbox
}

// blockWindow is one sandbox's refusals since its window opened.
type blockWindow struct {
	closed      bool
	logged      int
	held        int
	rules       map[string]int
	first, last egress.Event // of those held
}

func newBlockLog(log *slog.Logger) *blockLog {
	return &blockLog{log: log, burst: blockLogBurst, window: blockLogWindow, windows: map[string]*blockWindow{}}
}

func (b *blockLog) record(e egress.Event) {
	b.mu.Lock()
	w := b.windows[e.SandboxID]
	if w == nil {
		w = &blockWindow{rules: map[string]int{}}
		b.windows[e.SandboxID] = w
		time.AfterFunc(b.window, func() { b.close(e.SandboxID, w) })
	}
	if w.logged < b.burst {
		w.logged++
		b.mu.Unlock()
		b.log.Info("egress blocked", "id", e.SandboxID, "proto", e.Proto, "dst", e.Dst, "host", e.Host, "rule", e.Rule, "reason", e.Reason)
		return
	}
	if w.held == 0 {
		w.first = e
	}
	w.held++
	w.rules[e.Rule]++
	w.last = e
	b.mu.Unlock()
}

// flush ends every window now (the daemon stops): nothing held is lost.
func (b *blockLog) flush() {
	b.mu.Lock()
	ws := maps.Clone(b.windows)
	b.mu.Unlock()
	for id, w := range ws {
		b.close(id, w)
	}
}

// close ends a sandbox's window, summing up what it held.
func (b *blockLog) close(id string, w *blockWindow) {
	b.mu.Lock()
	if b.windows[id] == w {
		delete(b.windows, id)
	}
	done := w.closed
	w.closed = true
	b.mu.Unlock()
	if done || w.held == 0 {
		return
	}
	rules := slices.SortedFunc(maps.Keys(w.rules), func(a, c string) int { return w.rules[c] - w.rules[a] })
	var by []string
	for i, r := range rules {
		if i == 5 {
			by = append(by, fmt.Sprintf("%d more rules", len(rules)-i))
			break
		}
		by = append(by, fmt.Sprintf("%s=%d", r, w.rules[r]))
	}
	b.log.Warn("egress blocked: more refusals than the log shows one by one (the sandbox's audit log has them)",
		"id", id, "not_logged", w.held, "window", b.window, "logged", w.logged, "by_rule", strings.Join(by, ","),
		"first_host", w.first.Host, "first_dst", w.first.Dst, "last_host", w.last.Host, "last_dst", w.last.Dst)
}
