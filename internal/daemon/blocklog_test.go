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
	b.window = 50 * time.Millisecond
	for i := range 20000 {
		b.record(egress.Event{SandboxID: "flood", Kind: "dns", Proto: "dns", Host: fmt.Sprintf("n%d.evil.test", i), Decision: "blocked", Rule: "no-match"})
	}
	b.record(egress.Event{SandboxID: "calm", Kind: "connect", Proto: "http", Host: "x.test", Decision: "blocked", Rule: "no-match"})
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "not_logged=") {
		if time.Now().After(deadline) {
			t.Fatalf("no summary line:\n%s", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
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
	// The window closed: the next refusal is logged again.
	b.record(egress.Event{SandboxID: "flood", Host: "again.test", Decision: "blocked"})
	if !strings.Contains(out.String(), "host=again.test") {
		t.Error("a refusal after the window was not logged")
	}
}
