package crun

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

func newRuntime(t *testing.T, noUserNS bool) *Runtime {
	t.Helper()
	ocitest.NeedRoot(t)
	root, err := os.MkdirTemp("", "cella-crun-root-")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := New(Config{RootDir: root, NoUserNS: noUserNS})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ids, _ := rt.List(context.Background())
		for _, id := range ids {
			_ = rt.Destroy(context.Background(), id)
		}
		rt.Close()
		os.RemoveAll(root)
	})
	return rt
}

func TestProbe(t *testing.T) {
	rt := newRuntime(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	scratch := t.TempDir()
	d, err := rt.Probe(ctx, scratch)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probe: crun run /bin/true took %s", d)
	ocitest.AssertGone(t, rt, rt.ProbePrefix(), scratch)
}

func TestLifecycle(t *testing.T) {
	for _, tc := range []struct {
		name        string
		useTemplate bool
		noUserNS    bool
	}{{"hostpaths", false, false}, {"template", true, false}, {"template-nouserns", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			rt := newRuntime(t, tc.noUserNS)
			id := "crt-" + tc.name
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
			wantMap := "0 100000 65536"
			if tc.noUserNS {
				wantMap = "0 0 4294967295"
			}
			if got := strings.Join(rep.UIDMap, " "); got != wantMap {
				t.Errorf("uid_map %q, want %q", got, wantMap)
			}
			if rep.Hostname != f.Spec.Hostname {
				t.Errorf("hostname %q", rep.Hostname)
			}
			if rep.Seccomp != "2" || rep.NoNewPrivs != "1" {
				t.Errorf("seccomp %q no_new_privs %q", rep.Seccomp, rep.NoNewPrivs)
			}
			if rep.CapEff != "00000000800405fb" {
				t.Errorf("CapEff %s", rep.CapEff)
			}
			if rep.Unshare == "ok" {
				t.Error("unshare(CLONE_NEWUSER) allowed")
			}
			if rep.PPID != 1 && rep.PID < 10 == false {
				t.Errorf("pid %d ppid %d: not in a pid namespace?", rep.PID, rep.PPID)
			}
			for _, d := range rep.NetDevs {
				if d != "lo" {
					t.Errorf("network device %q in the sandbox", d)
				}
			}
			if f.Template != nil {
				if rep.UserWrite != "ok" {
					log, _ := os.ReadFile(f.Spec.LogPath)
					t.Errorf("uid 1000 cannot write /home/user; log:\n%s", log)
				}
				st, err := os.Stat(filepath.Join(f.Layer.Upper, "home/user/written-by-user"))
				if err != nil {
					t.Errorf("user's write not in the upper layer: %v", err)
				} else if uid := statUID(st); uid != 1000 {
					t.Errorf("user's file has on-disk uid %d, want 1000", uid)
				}
			}
			lim, err := cgroup.MemoryLimit(id)
			if err != nil || lim != f.Spec.Limits.MemoryBytes {
				t.Errorf("memory.limit_in_bytes = %d, %v; want %d", lim, err, f.Spec.Limits.MemoryBytes)
			}
			if err := rt.Destroy(ctx, id); err != nil {
				t.Fatal(err)
			}
			if err := rt.Destroy(ctx, id); err != nil {
				t.Fatalf("second Destroy: %v", err)
			}
			ocitest.AssertGone(t, rt, id, f.Spec.BundleDir, rt.cfg.RootDir)
		})
	}
}

// TestStartLatency measures Start (CELLA_TEST_TIMING=N runs, e.g. 20).
func TestStartLatency(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CELLA_TEST_TIMING"))
	if n <= 0 {
		t.Skip("set CELLA_TEST_TIMING=20 to measure start latency")
	}
	rt := newRuntime(t, false)
	ocitest.Latency(t, rt, "crlat", n)
}
