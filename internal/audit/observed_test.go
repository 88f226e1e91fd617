package audit_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/audit"
)

// TestObserved: every entry says who saw it, from its source alone: what
// the daemon saw itself is "daemon", what the agent inside reported is
// "sandbox", whatever a writer put in the field; lines written before the
// field existed read back marked the same way.
func TestObserved(t *testing.T) {
	l, dir := newLog(t, audit.Options{})
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	in := []audit.Entry{
		{Time: t0, SandboxID: "sb1", Kind: audit.KindLifecycle, Source: audit.SourceDaemon, Message: "created"},
		{Time: t0.Add(time.Second), SandboxID: "sb1", Kind: audit.KindConnect, Source: audit.SourceProxy, Host: "a.example", Decision: audit.DecisionBlocked},
		{Time: t0.Add(2 * time.Second), SandboxID: "sb1", Kind: audit.KindProcessStart, Source: audit.SourceAgent, PID: 7, Cmd: "id", Observed: audit.ObservedDaemon},
		{Time: t0.Add(3 * time.Second), SandboxID: "sb1", Kind: audit.KindSecurity, Source: audit.SourceDaemon, Message: "refused"},
	}
	want := []string{"daemon", "daemon", "sandbox", "daemon"}
	for _, e := range in {
		l.Append(e)
	}
	l.Flush()
	raw, err := os.ReadFile(filepath.Join(dir, "sb1.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	for i, line := range lines {
		if !strings.Contains(line, `"observed":"`+want[i]+`"`) {
			t.Errorf("line %d on disk: %s, want observed %q", i, line, want[i])
		}
	}
	// A line from before the field.
	old := `{"time":"2026-01-02T03:04:10Z","sandboxId":"sb1","kind":"file.write","source":"agent","path":"/x"}` + "\n"
	f, err := os.OpenFile(filepath.Join(dir, "sb1.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(old)
	f.Close()
	want = append(want, "sandbox")
	got, err := l.Read("sb1", audit.Query{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("read %d entries, want %d", len(got), len(want))
	}
	for i, e := range got {
		if e.Observed != want[i] || e.Fields()["observed"] != want[i] {
			t.Errorf("entry %d (%s from %s): observed %q / fields %q, want %q", i, e.Kind, e.Source, e.Observed, e.Fields()["observed"], want[i])
		}
	}
}
