package crun

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/oci/ocitest"
	"github.com/cella-sandbox/cella/internal/runtime/runtimetest"
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
	ocitest.CleanupRuntime(t, rt, root)
	return rt
}

// TestSuite: the runtime.Runtime conformance suite, with the user
// namespace (idmapped mounts) and without.
func TestSuite(t *testing.T) {
	for _, noUserNS := range []bool{false, true} {
		t.Run("noUserNS="+strconv.FormatBool(noUserNS), func(t *testing.T) {
			runtimetest.Suite(t, func(t *testing.T) runtime.Runtime { return newRuntime(t, noUserNS) })
		})
	}
}

// TestIsolation: what only the namespaces runtime promises inside (gVisor's
// sentry ignores the user namespace and serves its own capabilities): the
// user namespace's mapping (or none), the minimal capability set, PID 1 in
// its own pid namespace.
func TestIsolation(t *testing.T) {
	for _, tc := range []struct {
		name     string
		noUserNS bool
		uidMap   string
		noRun    bool // the image has no /run: crun makes it in the upper layer
	}{{"userns", false, "0 100000 65536", false}, {"nouserns", true, "0 0 4294967295", false}, {"userns-no-run", false, "0 100000 65536", true}} {
		t.Run(tc.name, func(t *testing.T) {
			rt := newRuntime(t, tc.noUserNS)
			id := runtimetest.NewID("iso")
			f := ocitest.New(t, id, true, ocitest.ReportScript)
			if f.Template == nil {
				t.Skip("no base template built (cella template ensure base)")
			}
			if tc.noRun {
				if err := os.RemoveAll(filepath.Join(f.Spec.RootFS, "run")); err != nil {
					t.Fatal(err)
				}
			}
			image, err := os.ReadDir(filepath.Join(f.Spec.RootFS, "run"))
			if err != nil && !tc.noRun {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := rt.Start(ctx, f.Spec); err != nil {
				log, _ := os.ReadFile(f.Spec.LogPath)
				t.Fatalf("Start: %v\n%s", err, log)
			}
			t.Cleanup(func() { _ = rt.Destroy(context.Background(), id) })
			rep := f.Accept(t, 30*time.Second)
			if got := strings.Join(rep.UIDMap, " "); got != tc.uidMap {
				t.Errorf("uid_map %q, want %q", got, tc.uidMap)
			}
			if rep.CapEff != "00000000800405fb" {
				t.Errorf("CapEff %s", rep.CapEff)
			}
			if rep.PPID != 1 || rep.PID >= 10 {
				t.Errorf("pid %d ppid %d: not in a pid namespace", rep.PID, rep.PPID)
			}
			// /run is a mount of its own, holding the image's /run: root
			// cannot rename it (it holds the agent's private dir, which the
			// commands' Landlock rules find by path), also where the image
			// has none and it is made in the upper layer (an image's own
			// /run, in a lower layer, refuses with EXDEV anyway).
			if !rep.RunMounted || rep.RunRename != "Device or resource busy" {
				t.Errorf("/run mounted %v, rename %q: want a mount point, busy", rep.RunMounted, rep.RunRename)
			}
			want := []string{"cella"} // the run dir's mount point
			for _, e := range image {
				if e.Name() != "cella" {
					want = append(want, e.Name())
				}
			}
			slices.Sort(want)
			if !slices.Equal(rep.RunEntries, want) {
				t.Errorf("/run holds %q, the image's /run %q", rep.RunEntries, want)
			}
			if err := rt.Destroy(ctx, id); err != nil {
				t.Fatal(err)
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

// TestRefusesContainerEngine: a sandbox that would run a container engine
// is refused before anything starts (its mounts and namespaces would be
// the host kernel's), and nothing is left behind.
func TestRefusesContainerEngine(t *testing.T) {
	rt := newRuntime(t, false)
	// An ID no other process on the machine has in its command line.
	f := ocitest.New(t, fmt.Sprintf("crun-engine-refused-%d", os.Getpid()), false, "sleep 60")
	f.Spec.ContainerEngine = true
	err := rt.Start(context.Background(), f.Spec)
	if !errors.Is(err, runtime.ErrNotSupported) || !strings.Contains(err.Error(), "needs the gvisor runtime") {
		t.Fatalf("Start with ContainerEngine: %v; want ErrNotSupported naming the gvisor runtime", err)
	}
	ocitest.AssertGone(t, rt, f.Spec.ID)
}

// TestRefusesLinkedRunDir: a root whose /run or /run/cella is a symlink is
// refused before anything starts (crun would mount the sandbox's /run or
// its run dir where the link leads, and leave the link for root to rename),
// and nothing is left behind.
func TestRefusesLinkedRunDir(t *testing.T) {
	rt := newRuntime(t, false)
	for _, link := range []struct{ path, target string }{{"run", "var/run"}, {"run/cella", "/tmp"}} {
		t.Run(strings.ReplaceAll(link.path, "/", "-"), func(t *testing.T) {
			f := ocitest.New(t, fmt.Sprintf("crun-linked-%s-%d", strings.ReplaceAll(link.path, "/", "-"), os.Getpid()), true, "sleep 60")
			if f.Template == nil {
				t.Skip("no base template built (cella template ensure base)")
			}
			p := filepath.Join(f.Spec.RootFS, link.path)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(link.target, p); err != nil {
				t.Fatal(err)
			}
			err := rt.Start(context.Background(), f.Spec)
			if !errors.Is(err, runtime.ErrNotSupported) || !strings.Contains(err.Error(), "/"+link.path+" is a symlink") {
				t.Fatalf("Start with /%s a symlink: %v; want ErrNotSupported naming it", link.path, err)
			}
			ocitest.AssertGone(t, rt, f.Spec.ID)
		})
	}
}
