package gvisor

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/oci/ocitest"
	"github.com/cella-sandbox/cella/internal/runtime/runtimetest"
)

func runscPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CELLA_RUNSC"); p != "" {
		return p
	}
	p, err := filepath.Abs("../../../bin/runsc")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no runsc at %s (build it with CGO_ENABLED=0, see runtime-notes)", p)
	}
	return p
}

func newRuntime(t *testing.T) *Runtime {
	t.Helper()
	ocitest.NeedRoot(t)
	root, err := os.MkdirTemp("", "cella-runsc-root-")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := New(Config{RunscPath: runscPath(t), RootDir: root})
	if err != nil {
		t.Fatal(err)
	}
	ocitest.CleanupRuntime(t, rt, root) // runsc's null-netns mount goes with its last container
	return rt
}

// TestSuite: the runtime.Runtime conformance suite.
func TestSuite(t *testing.T) {
	runtimetest.Suite(t, func(t *testing.T) runtime.Runtime { return newRuntime(t) })
}

func TestProbeErrors(t *testing.T) {
	ocitest.NeedRoot(t)
	if _, err := New(Config{RunscPath: "/nonexistent/runsc", RootDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "runsc binary") {
		t.Fatalf("missing binary: %v", err)
	}
	// /bin/sh is dynamically linked, like a cgo-built runsc.
	if _, err := New(Config{RunscPath: "/bin/sh", RootDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Fatalf("dynamic binary: %v", err)
	}
	if _, err := New(Config{RunscPath: runscPath(t), RootDir: t.TempDir(), Platform: "nope"}); err == nil {
		t.Fatal("bad platform accepted")
	}
	if _, err := New(Config{RunscPath: runscPath(t), RootDir: "relative"}); err == nil {
		t.Fatal("relative root accepted")
	}
}

// TestStartLatency measures Start (CELLA_TEST_TIMING=N runs, e.g. 20).
func TestStartLatency(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CELLA_TEST_TIMING"))
	if n <= 0 {
		t.Skip("set CELLA_TEST_TIMING=20 to measure start latency")
	}
	rt := newRuntime(t)
	ocitest.Latency(t, rt, "gvlat", n)
}
