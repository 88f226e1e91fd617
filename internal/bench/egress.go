package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
)

// egressClient is the same small HTTP client on both sides of the
// comparison: n GETs, each on a new connection (what a sandbox's pip or
// curl does per host), timed one by one.
const egressClient = `
import http.client, json, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = []
for _ in range(n):
    t = time.perf_counter_ns()
    c = http.client.HTTPConnection(host, port, timeout=10)
    c.request("GET", "/")
    r = c.getresponse()
    r.read()
    c.close()
    if r.status != 200:
        sys.exit("status %d" % r.status)
    out.append(time.perf_counter_ns() - t)
print(json.dumps(out))
`

// Egress measures what the egress proxy costs: n small HTTP requests from
// inside a sandbox to an allowed name (DNS through cella, every connection
// decided and proxied), beside the same client on the host talking to the
// same upstream directly, in the same run.
func Egress(ctx context.Context, cfg Config, n int) ([]Figure, error) {
	if n <= 0 {
		n = 1000
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})}
	go srv.Serve(ln)
	defer srv.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)

	script := filepath.Join(os.TempDir(), fmt.Sprintf("cella-bench-egress-%d.py", os.Getpid()))
	if err := os.WriteFile(script, []byte(egressClient), 0o644); err != nil {
		return nil, err
	}
	defer os.Remove(script)
	out, err := exec.CommandContext(ctx, "python3", script, "127.0.0.1", port, strconv.Itoa(n)).Output()
	if err != nil {
		return nil, fmt.Errorf("host client: %w", err)
	}
	base, err := parseNanos(out)
	if err != nil {
		return nil, err
	}
	figs := []Figure{summarize(fmt.Sprintf("%d HTTP GETs, host → upstream (no proxy)", n), "", base)}
	for _, rt := range runtimesOf(cfg) {
		f, err := egressOne(ctx, cfg, rt, port, n)
		if err != nil {
			f.Err = err.Error()
		}
		f.against(figs[0])
		figs = append(figs, f)
	}
	return figs, nil
}

func egressOne(ctx context.Context, cfg Config, rt, port string, n int) (Figure, error) {
	name := fmt.Sprintf("%d HTTP GETs, sandbox → egress proxy → upstream", n)
	l, err := startLocalNet(ctx, cfg, rt, daemon.NetworkConfig{
		Allow: []string{"bench.test"}, Resolve: []string{"bench.test=127.0.0.1"},
	})
	if err != nil {
		return Figure{Name: name, Runtime: rt}, err
	}
	defer l.Close()
	conn, err := l.sandbox(ctx, client.CreateRequest{})
	if err != nil {
		return Figure{Name: name, Runtime: rt}, err
	}
	if err := conn.WriteFile(ctx, "/tmp/egress.py", "", strings.NewReader(egressClient)); err != nil {
		return Figure{Name: name, Runtime: rt}, err
	}
	res, err := conn.Exec(ctx, "python3 /tmp/egress.py bench.test "+port+" "+strconv.Itoa(n), client.ExecOptions{Timeout: 10 * time.Minute})
	if err != nil {
		return Figure{Name: name, Runtime: rt}, err
	}
	if res.ExitCode != 0 {
		return Figure{Name: name, Runtime: rt}, fmt.Errorf("sandbox client exited %d: %s %v", res.ExitCode, res.Stderr, res.SandboxEvents)
	}
	ds, err := parseNanos([]byte(res.Stdout))
	if err != nil {
		return Figure{Name: name, Runtime: rt}, err
	}
	return summarize(name, rt, ds), nil
}

func parseNanos(b []byte) ([]time.Duration, error) {
	var ns []int64
	if err := json.Unmarshal(b, &ns); err != nil {
		return nil, fmt.Errorf("client output: %w", err)
	}
	out := make([]time.Duration, len(ns))
	for i, v := range ns {
		out[i] = time.Duration(v)
	}
	return out, nil
}
