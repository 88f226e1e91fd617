package ocicli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cella-sandbox/cella/internal/runtime"
)

// LastError reads the runtimes' JSON logs: any level for crun, only errors
// for runsc, the last line when no JSON line qualifies.
func TestLastError(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	log := write("json.log", `{"msg":"first","level":"error"}
{"msg":"later warning","level":"warning"}
`)
	crun := &CLI{Name: "crun"}
	runsc := &CLI{Name: "runsc", ErrorLevels: []string{"error", "fatal"}}
	for _, tc := range []struct {
		cli  *CLI
		path string
		want string
	}{
		{crun, log, "later warning"},
		{runsc, log, "first"},
		{runsc, write("plain.log", "not json\nlast words\n"), "last words"},
		{crun, write("empty.log", ""), "(empty crun log)"},
		{runsc, filepath.Join(dir, "missing.log"), "(no runsc log)"},
	} {
		if got := tc.cli.LastError(tc.path); got != tc.want {
			t.Errorf("%s LastError(%s) = %q, want %q", tc.cli.Name, filepath.Base(tc.path), got, tc.want)
		}
	}
}

func TestRuntimeStatus(t *testing.T) {
	for in, want := range map[string]runtime.Status{
		"creating": runtime.StatusCreated, "created": runtime.StatusCreated, "running": runtime.StatusRunning,
		"paused": runtime.StatusPaused, "stopped": runtime.StatusStopped,
	} {
		if got, err := (State{Status: in}).RuntimeStatus(); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := (State{Status: "exploded"}).RuntimeStatus(); err == nil {
		t.Error("an unknown status mapped")
	}
	if got := subcommand([]string{"--in-sandbox-cgroup=v2", "restore", "--image-path=x"}); got != "restore" {
		t.Errorf("subcommand = %q", got)
	}
}
