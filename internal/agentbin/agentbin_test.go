package agentbin

import (
	"bytes"
	"debug/buildinfo"
	"errors"
	"strings"
	"testing"
)

// TestAgentIdles: the embedded agent is built not to re-read its CPU limit
// every second (Go's default since 1.25), which under gVisor was most of
// what an idle sandbox cost its host (a sched_getaffinity and a pread of
// cpu.max, and the wake-ups around them, through the sentry each second).
func TestAgentIdles(t *testing.T) {
	b, err := Binary()
	if errors.Is(err, ErrMissing) {
		t.Skip("built without the agent (make build embeds it)")
	}
	if err != nil {
		t.Fatal(err)
	}
	bi, err := buildinfo.Read(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range bi.Settings {
		if s.Key == "DefaultGODEBUG" && strings.Contains(","+s.Value+",", ",updatemaxprocs=0,") {
			return
		}
	}
	t.Fatalf("the agent's DefaultGODEBUG lacks updatemaxprocs=0: %v", bi.Settings)
}
