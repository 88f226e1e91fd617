package api_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/cgroup"
	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon/daemontest"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// TestDeathCauseMetrics: a sandbox whose container ends on its own is
// counted in cella_sandbox_deaths_total under why — "crash" when nothing
// on the host recorded a limit, "oom" when its host memory ceiling killed
// in it, "pids" when its host process ceiling refused a fork — and its
// record says the same. The container's end is forced from the host (its
// processes SIGKILLed, as a host OOM killer or a runtime crash would); the
// ceilings are really hit: a memory hog past the host ceiling, and a fork
// loop past a host pids ceiling the host lowered below the agent's own cap
// (which otherwise stops a fork bomb first, by design).
func TestDeathCauseMetrics(t *testing.T) {
	env := daemontest.Start(t, runtime.Namespaces, daemontest.Options{})
	a := apiT{env: env}
	c := env.Client
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	deaths := func(cause string) float64 {
		return counterValue(a.scrape(t), "cella_sandbox_deaths_total", map[string]string{"cause": cause, "runtime": runtime.Namespaces})
	}
	create := func() (string, *client.SandboxConn) {
		t.Helper()
		sb, err := c.Create(ctx, client.CreateRequest{TemplateID: "base", Timeout: new(int64(300)), MemoryMB: 256, PidsLimit: 128})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Kill(context.WithoutCancel(ctx), sb.SandboxID) })
		conn, err := c.Sandbox(ctx, sb.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		return sb.SandboxID, conn
	}
	// crashIt SIGKILLs every process of the sandbox's container from the
	// host and waits for the daemon to find it dead; it returns the
	// record's error.
	crashIt := func(id string) string {
		t.Helper()
		pids, err := cgroup.Pids(id)
		if err != nil || len(pids) == 0 {
			t.Fatalf("processes of %s: %v %v", id, pids, err)
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		deadline := time.Now().Add(2 * time.Minute)
		for {
			d, err := c.Get(ctx, id)
			if err == nil && d.State == "dead" {
				return d.Error
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not dead 2 min after its container was killed: %+v %v", id, d, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// lower sets the container's host cgroup file limit to what current
	// reads plus extra.
	lower := func(id, limit, current string, extra int64) {
		t.Helper()
		dirs, err := cgroup.Dirs(id)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range dirs {
			cur, err := os.ReadFile(filepath.Join(d, current))
			if err != nil {
				continue
			}
			n, err := strconv.ParseInt(strings.TrimSpace(string(cur)), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, limit), []byte(strconv.FormatInt(n+extra, 10)), 0); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Fatalf("no %s among %v", current, dirs)
	}
	before := map[string]float64{}
	for _, cause := range []string{"crash", "oom", "pids"} {
		before[cause] = deaths(cause)
	}
	want := func(cause string, n float64) {
		t.Helper()
		if got := deaths(cause) - before[cause]; got != n {
			t.Errorf("deaths{cause=%s}: +%v, want +%v", cause, got, n)
		}
	}

	// crash: nothing recorded.
	id, _ := create()
	if e := crashIt(id); !strings.Contains(e, "stopped unexpectedly") {
		t.Fatalf("crashed sandbox's error: %q", e)
	}
	want("crash", 1)

	// oom: the host lowers the container's memory ceiling to what it uses
	// plus 48 MiB, and a 200 MiB hog (which the agent would stop at the
	// sandbox's 256 MiB) meets it; the agent lives on, then the container
	// ends.
	id, conn := create()
	lower(id, "memory.limit_in_bytes", "memory.usage_in_bytes", 48<<20)
	res, err := conn.Exec(ctx, "python3 -c 'b = bytearray(200 << 20); print(len(b))'", client.ExecOptions{})
	if err != nil || res.ExitCode == 0 {
		t.Fatalf("memory hog: %+v %v", res, err)
	}
	if e := crashIt(id); !strings.Contains(e, "host memory ceiling") {
		t.Fatalf("error after an OOM kill: %q", e)
	}
	want("oom", 1)

	// pids: the host lowers the container's pids ceiling below what is
	// running plus a few, and a fork loop meets it.
	id, conn = create()
	lower(id, "pids.max", "pids.current", 8)
	res, _ = conn.Exec(ctx, "for i in $(seq 40); do sleep 30 & done; wait", client.ExecOptions{Timeout: 60 * time.Second})
	t.Logf("fork loop: %+v", res)
	if e := crashIt(id); !strings.Contains(e, "host process ceiling") {
		t.Fatalf("error after the pids ceiling refused forks: %q", e)
	}
	want("pids", 1)
}
