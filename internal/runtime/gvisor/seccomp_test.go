package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/runtime/oci/ocitest"
)

// TestPrecompiledSeccomp: the runsc that make builds (scripts/build-runsc.sh)
// carries the seccomp programs of the configurations cella runs it with, so
// neither the sentry nor the gofer compiles its filter at start (15-24 ms
// and ~6 ms on the critical path of every start, restore and fork). It
// fails for a runsc built straight from the module, and when cella starts
// runsc with options whose program was not generated (tools/runsc/seccompgen,
// wanted).
func TestPrecompiledSeccomp(t *testing.T) {
	ocitest.NeedRoot(t)
	root := t.TempDir()
	logs := t.TempDir()
	rt, err := New(Config{RunscPath: runscPath(t), RootDir: root, DebugLogDir: logs})
	if err != nil {
		t.Fatal(err)
	}
	ocitest.CleanupRuntime(t, rt, root)
	f := ocitest.New(t, "seccomp", true, ocitest.ReportScript)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := rt.Start(ctx, f.Spec); err != nil {
		t.Fatal(err)
	}
	defer rt.Destroy(context.WithoutCancel(ctx), f.Spec.ID)
	f.Accept(t, time.Minute)

	loaded := map[string]bool{}
	names, _ := filepath.Glob(filepath.Join(logs, "*"))
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		log := string(b)
		if i := strings.Index(log, "No precompiled program found"); i >= 0 {
			t.Errorf("%s compiled its seccomp filter at start: %s", filepath.Base(name), firstLine(log[i:]))
		}
		for _, part := range []string{"boot", "gofer"} {
			if strings.Contains(filepath.Base(name), "."+part+".") && strings.Contains(log, "Loaded precompiled seccomp instructions") {
				loaded[part] = true
			}
		}
	}
	for _, part := range []string{"boot", "gofer"} {
		if !loaded[part] {
			t.Errorf("no %s log says it loaded precompiled seccomp instructions (logs: %v)", part, names)
		}
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
