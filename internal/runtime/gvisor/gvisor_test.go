package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/cgroup"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/oci/ocitest"
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
	t.Cleanup(func() {
		ids, _ := rt.List(context.Background())
		for _, id := range ids {
			_ = rt.Destroy(context.Background(), id)
		}
		os.RemoveAll(root)
	})
	return rt
}

func TestProbe(t *testing.T) {
	rt := newRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := rt.Probe(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probe: runsc run /bin/true took %s", d)
	ocitest.AssertGone(t, rt, rt.ProbePrefix(), rt.cfg.RootDir)
	if d <= 0 || d > 30*time.Second {
		t.Fatalf("probe duration %s", d)
	}
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

func TestLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name        string
		useTemplate bool
	}{{"hostpaths", false}, {"template", true}} {
		t.Run(tc.name, func(t *testing.T) {
			rt := newRuntime(t)
			id := "gvt-" + tc.name
			f := ocitest.New(t, id, tc.useTemplate, ocitest.ReportScript)
			if tc.useTemplate && f.Template == nil {
				t.Skip("no base template built (go test ./internal/template -run TestBuild with CELLA_TEST_DEBOOTSTRAP=1 CELLA_TEST_BASE=1)")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			start := time.Now()
			if err := rt.Start(ctx, f.Spec); err != nil {
				log, _ := os.ReadFile(f.Spec.LogPath)
				t.Fatalf("Start: %v\n%s", err, log)
			}
			started := time.Since(start)
			rep := f.Accept(t, 30*time.Second)
			t.Logf("Start returned after %s (PID 1 running); report over the socket after %s", started, time.Since(start))
			t.Logf("report: %+v", rep)

			if st, err := rt.State(ctx, id); err != nil || st != runtime.StatusRunning {
				t.Fatalf("State = %q, %v", st, err)
			}
			if ids, err := rt.List(ctx); err != nil || len(ids) != 1 || ids[0] != id {
				t.Fatalf("List = %v, %v", ids, err)
			}
			if rep.Hostname != f.Spec.Hostname {
				t.Errorf("hostname %q", rep.Hostname)
			}
			if rep.Seccomp != "2" || rep.NoNewPrivs != "1" {
				t.Errorf("seccomp %q no_new_privs %q", rep.Seccomp, rep.NoNewPrivs)
			}
			if rep.Unshare == "ok" {
				t.Error("unshare(CLONE_NEWUSER) allowed")
			}
			for _, d := range rep.NetDevs {
				if d != "lo" {
					t.Errorf("network device %q in the sandbox", d)
				}
			}
			if f.Template != nil && rep.UserWrite != "ok" {
				t.Errorf("uid 1000 cannot write /home/user")
			}
			if f.Layer != nil {
				st, err := os.Stat(filepath.Join(f.Layer.Upper, "home/user/written-by-user"))
				if err != nil {
					t.Errorf("user's write not in the upper layer: %v", err)
				} else if uid := statUID(st); uid != 1000 {
					t.Errorf("user's file has on-disk uid %d", uid)
				}
			}
			lim, err := cgroup.MemoryLimit(id)
			if err != nil || lim != f.Spec.Limits.MemoryBytes {
				t.Errorf("memory.limit_in_bytes = %d, %v; want %d", lim, err, f.Spec.Limits.MemoryBytes)
			}
			// Container output reaches the log.
			time.Sleep(100 * time.Millisecond)

			if err := rt.Destroy(ctx, id); err != nil {
				t.Fatal(err)
			}
			if err := rt.Destroy(ctx, id); err != nil {
				t.Fatalf("second Destroy: %v", err)
			}
			ocitest.AssertGone(t, rt, id, rt.cfg.RootDir, f.Spec.BundleDir)
		})
	}
}

// The log gets both streams intact (O_APPEND), and a failed start leaves
// nothing behind and says why.
func TestLogAndFailedStart(t *testing.T) {
	rt := newRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := ocitest.New(t, "gvt-log", false, `for i in 1 2 3; do echo out$i; echo err$i >&2; done; exec sleep 1000`)
	if err := rt.Start(ctx, f.Spec); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	var log []byte
	for time.Now().Before(deadline) {
		log, _ = os.ReadFile(f.Spec.LogPath)
		if strings.Count(string(log), "\n") >= 6 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, w := range []string{"out1", "err1", "out3", "err3"} {
		if !strings.Contains(string(log), w+"\n") {
			t.Errorf("log lacks %s:\n%s", w, log)
		}
	}
	if err := rt.Destroy(ctx, "gvt-log"); err != nil {
		t.Fatal(err)
	}

	bad := ocitest.New(t, "gvt-bad", false, "true")
	bad.Spec.Args = []string{"/nonexistent"}
	err := rt.Start(ctx, bad.Spec)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent") {
		t.Fatalf("Start of a missing binary: %v", err)
	}
	ocitest.AssertGone(t, rt, "gvt-bad", rt.cfg.RootDir)
	ocitest.AssertGone(t, rt, "gvt-log", rt.cfg.RootDir)
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
