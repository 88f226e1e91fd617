package audit

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// A writer that falls behind drops entries past the queue bound instead of
// blocking callers or growing memory, and records how many it dropped.
func TestQueueBoundRecordsDrops(t *testing.T) {
	l, err := New(filepath.Join(t.TempDir(), "audit"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.fileMu.Lock() // the writer is stuck on the disk
	for i := range maxPending + 25 {
		l.Append(Entry{SandboxID: "sb", Kind: KindDNS, Host: fmt.Sprint(i)})
	}
	l.fileMu.Unlock()
	got, err := l.Read("sb", Query{Limit: 2 * maxPending})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != maxPending+1 {
		t.Fatalf("%d entries, want %d kept and one note", len(got), maxPending)
	}
	note := got[len(got)-1]
	if note.Kind != KindLifecycle || !strings.Contains(note.Message, "dropped 25 entries") {
		t.Fatalf("note: %+v", note)
	}
}
