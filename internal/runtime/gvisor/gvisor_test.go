package gvisor

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cella-sandbox/cella/internal/cgroup"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/oci"
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

// TestRestoreRaisesCPULimitForItsDuration: a memory restore of a 1-CPU
// container runs under restoreCPUs (its bundle says so) and returns with
// the container's own limit in its cgroup (runtimetest checks that for
// every restore); when the limit cannot be put back the restore fails and
// leaves no container running above its limit.
func TestRestoreRaisesCPULimitForItsDuration(t *testing.T) {
	rt := newRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := ocitest.New(t, runtimetest.NewID("cpurestore"), false, "sleep 1000")
	id := f.Spec.ID
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), id) })
	if f.Spec.Limits.CPUs != 1 {
		t.Fatalf("fixture CPUs %g, want 1", f.Spec.Limits.CPUs)
	}
	checkpoint := func(name string) string {
		t.Helper()
		img := filepath.Join(f.Dir, name)
		if err := os.Mkdir(img, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := rt.Checkpoint(ctx, id, img); err != nil {
			t.Fatalf("Checkpoint: %v", err)
		}
		return img
	}
	if err := rt.Start(ctx, f.Spec); err != nil {
		t.Fatalf("Start: %v", err)
	}
	img := checkpoint("image")
	if err := rt.Restore(ctx, f.Spec, img); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(f.Spec.BundleDir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	raised, period := oci.CPUQuota(restoreCPUs)
	if c := spec.Linux.Resources.CPU; c == nil || c.Quota == nil || *c.Quota != raised || c.Period == nil || int64(*c.Period) != period {
		t.Errorf("the restore's bundle has CPU %+v; want quota %d every %d (%d CPUs)", c, raised, period, restoreCPUs)
	}
	own, _ := oci.CPUQuota(1)
	if q, _, err := cgroup.CPUQuota(id); err != nil || q != own {
		t.Errorf("after Restore the cgroup's quota is %d (%v); want its own %d", q, err, own)
	}

	// The limit cannot be put back: cella's cgroup writes go to an empty
	// tree (runsc's do not: it writes the real one).
	img = checkpoint("image2")
	realRoot := cgroup.Root
	restoreRoot := func() { cgroup.Root = realRoot }
	t.Cleanup(restoreRoot) // also if Restore panics; nothing here runs in parallel
	cgroup.Root = t.TempDir()
	err = rt.Restore(ctx, f.Spec, img)
	restoreRoot()
	if err == nil || !strings.Contains(err.Error(), "put back its CPU limit") {
		t.Fatalf("Restore whose CPU limit cannot be put back: %v; want an error saying so", err)
	}
	if ids, err := rt.List(ctx); err != nil || slices.Contains(ids, id) {
		t.Errorf("after the failed restore runsc still lists %s: %v (%v)", id, ids, err)
	}
	if err := rt.Destroy(ctx, id); err != nil { // cgroups the swapped root hid
		t.Fatal(err)
	}
	ocitest.AssertGone(t, rt, id, f.Spec.BundleDir)
}
