package agent

import (
	"bytes"
	"strings"
	"testing"
)

// TestCappedWriter: whole writes pass until the cap, then one notice and
// nothing more, and the output never exceeds the cap.
func TestCappedWriter(t *testing.T) {
	var out bytes.Buffer
	c := &cappedWriter{w: &out, left: 200}
	line := strings.Repeat("x", 39) + "\n"
	for range 100 {
		if n, err := c.Write([]byte(line)); n != len(line) || err != nil {
			t.Fatalf("write: %d %v", n, err)
		}
	}
	got := out.String()
	if len(got) > 200 || !strings.HasSuffix(got, capNotice) || strings.Count(got, capNotice) != 1 {
		t.Fatalf("capped output (%d bytes): %q", len(got), got)
	}
	if strings.Count(got, line) != (200-len(capNotice))/len(line) {
		t.Fatalf("whole lines kept: %q", got)
	}
}
