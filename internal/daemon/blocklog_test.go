package daemon

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/egress"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestBlockLogSumsUpFloods: a sandbox's refusals past the burst are not
// logged one by one but summed up when the window ends; another sandbox's
// are logged as usual.
func TestBlockLogSumsUpFloods(t *testing.T) {
	var out syncBuffer
	b := newBlockLog(slog.New(slog.NewTextHandler(&out, nil)))
	b.window = time.Hour // ended by flush, not by the clock
	for i := range 20000 {
		b.record(egress.Event{SandboxID: "flood", Kind: "dns", Proto: "dns", Host: fmt.Sprintf("n%d.evil.test", i), Decision: "blocked", Rule: "no-match"})
	}
	b.record(egress.Event{SandboxID: "calm", Kind: "connect", Proto: "http", Host: "x.test", Decision: "blocked", Rule: "no-match"})
	b.flush()
	b.flush() // once only
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var flood, calm, summary int
	for _, l := range lines {
		switch {
		case strings.Contains(l, "not_logged="):
			summary++
			if !strings.Contains(l, "id=flood") || !strings.Contains(l, fmt.Sprintf("not_logged=%d", 20000-blockLogBurst)) ||
				!strings.Contains(l, `by_rule="no-match=19990"`) || !strings.Contains(l, "last_host=n19999.evil.test") {
				t.Errorf("summary: %s", l)
			}
		case strings.Contains(l, "id=flood"):
			flood++
		case strings.Contains(l, "id=calm"):
			calm++
		}
	}
	if flood != blockLogBurst || calm != 1 || summary != 1 {
		t.Errorf("%d lines for the flood, %d for the other sandbox, %d summaries; want %d, 1, 1:\n%s", flood, calm, summary, blockLogBurst, out.String())
	}
	// The window ended: the next refusal is logged again.
	b.record(egress.Event{SandboxID: "flood", Host: "again.test", Decision: "blocked"})
	if !strings.Contains(out.String(), "host=again.test") {
		t.Error("a refusal after the window was not logged")
	}
	// A window also ends by itself, and its sandbox is forgotten.
	b.window = time.Millisecond
	b.record(egress.Event{SandboxID: "tick", Host: "tick.test", Decision: "blocked"})
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.mu.Lock()
		_, open := b.windows["tick"]
		b.mu.Unlock()
		if !open {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the window did not end by itself")
		}
		time.Sleep(time.Millisecond)
	}
}
