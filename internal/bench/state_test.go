package bench

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/agentbin"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
)

// TestStateFloors: a small `cella bench state` under gVisor has every
// figure beside its raw runsc floor (resume, resume of a sandbox of the
// host's CPUs, fork call, fork answers, PSS of forks and of raw restores), and leaves none of its raw containers
// behind: no cgroup, no runsc process, no directory.
func TestStateFloors(t *testing.T) {
	runsc := os.Getenv("CELLA_TEST_RUNSC")
	if os.Geteuid() != 0 || runsc == "" {
		t.Skip("needs root and CELLA_TEST_RUNSC")
	}
	agent, err := agentbin.Binary()
	if err != nil {
		t.Fatal(err)
	}
	// The daemon's socket paths must stay short: the machine's TMPDIR, not
	// the test's. What the run leaves there is what was not there before.
	dirs := func() []string {
		var out []string
		for _, pat := range []string{"cella-bench-rawstate-*", "cella-bench-state-*"} {
			m, _ := filepath.Glob(filepath.Join(os.TempDir(), pat))
			out = append(out, m...)
		}
		return out
	}
	before := dirs()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rs, err := State(ctx, Config{RunscPath: runsc, CacheDir: daemontest.CacheDir(), Agent: agent}, 8, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 {
		t.Fatalf("%d results", len(rs))
	}
	r := rs[0]
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
	if len(r.ResumeRuns) != 2 || len(r.WideResumeRuns) != 2 || len(r.RawRestoreRun) != 2 || len(r.RawPlainRun) != 2 || r.RawForks <= 0 || r.RawSourcePSS <= 0 {
		t.Fatalf("missing runs: %+v", r)
	}
	prefix := rawContainerPrefix()
	for _, h := range []string{"memory", "pids", "cpu"} {
		ents, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", h, "cella"))
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), prefix) {
				t.Errorf("raw container cgroup left: %s/cella/%s", h, e.Name())
			}
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), "--root="+filepath.Join(os.TempDir(), "cella-bench-rawstate-")) {
			t.Errorf("raw runsc process left: %s", strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	for _, d := range dirs() {
		if !slices.Contains(before, d) {
			t.Errorf("directory left: %s", d)
		}
	}
}
