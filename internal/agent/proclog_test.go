package agent

import (
	"strings"
	"testing"

	"github.com/cella-sandbox/cella/internal/envd/process"
)

func TestProcLogLinesAndBound(t *testing.T) {
	l := newProcLog(1, "x")
	l.write(outStdout, []byte("a\r\nb"))
	l.write(outStderr, []byte("err\n"))
	l.write(outStdout, []byte("c\npart"))
	lines, partial, end, _ := l.snapshot(0)
	var got []string
	for _, ln := range lines {
		got = append(got, ln.stream+":"+ln.text)
	}
	if strings.Join(got, "|") != "stdout:a|stderr:err|stdout:bc" || len(partial) != 1 || partial[0].text != "part" || end != nil {
		t.Fatalf("lines %q partial %+v", got, partial)
	}
	l.finish(&process.ProcessEvent_EndEvent{Status: "exit status 0"})
	lines, partial, end, _ = l.snapshot(0)
	if len(partial) != 0 || lines[len(lines)-1].text != "part" || end == nil {
		t.Fatalf("after finish: %+v %+v", lines, partial)
	}

	// The log keeps the last procLogMax bytes.
	b := newProcLog(2, "y")
	line := []byte(strings.Repeat("z", 99) + "\n")
	for range 3 * procLogMax / len(line) {
		b.write(outStdout, line)
	}
	if b.size > procLogMax || b.dropped < int64(procLogMax) {
		t.Fatalf("size %d dropped %d", b.size, b.dropped)
	}
	// A line that never ends is cut at procLogMaxLine.
	c := newProcLog(3, "z")
	c.write(outPty, []byte(strings.Repeat("p", procLogMaxLine+10)))
	lines, partial, _, _ = c.snapshot(0)
	if len(lines) != 1 || len(lines[0].text) != procLogMaxLine+10 || len(partial) != 0 {
		t.Fatalf("long line: %d lines, partial %d", len(lines), len(partial))
	}
}
