package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/envd/process"
)

// StateResult is `cella bench state` for one runtime: the state operations
// on a sandbox holding MB of touched memory, beside a cold create.
type StateResult struct {
	Runtime    string        `json:"runtime"`
	MemoryMB   int           `json:"touched_memory_mb"`
	ColdCreate time.Duration `json:"cold_create_ns"` // create → first exec done
	Pause      time.Duration `json:"pause_ns"`
	Resume     time.Duration `json:"resume_ns"`
	Snapshot   time.Duration `json:"snapshot_ns"`
	Forks      int           `json:"forks"`
	Fork       time.Duration `json:"fork_ns"` // all forks, until every one answers
	// ForkFirstAnswer: fork call → the slowest fork's holder process answered.
	ForkAllAnswer time.Duration `json:"fork_all_answer_ns"`
	ForksFailed   int           `json:"forks_failed"`
	// PSS of the original's and each fork's sandbox processes (runsc
	// sandbox + gofer, or the container's processes), from smaps_rollup.
	OriginalPSS   int64   `json:"original_pss_bytes"`
	ForkPSS       []int64 `json:"fork_pss_bytes"`
	ForkPSSMean   int64   `json:"fork_pss_mean_bytes"`
	DiskGrowth    int64   `json:"disk_growth_bytes"` // data dir (own fs) after the forks
	SnapshotBytes int64   `json:"snapshot_bytes"`
	Err           string  `json:"error,omitempty"`
}

// holderPy holds MB MiB of touched memory and answers on 127.0.0.1:8000
// (the same program as conformance.HolderPy).
const holderPy = `
import http.server, os, sys
mb = int(sys.argv[1])
buf = bytearray(os.urandom(1 << 20)) * mb
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        body = ("%d %d" % (len(buf), buf[len(buf)//2])).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
srv = http.server.HTTPServer(("127.0.0.1", 8000), H)
open("/home/user/marker", "w").write("ready")
srv.serve_forever()
`

const askHolder = `python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8000', timeout=30).read().decode())"`

// State measures pause, resume, snapshot and fork×forks of a sandbox with
// mb MiB of touched memory, beside a cold create, per runtime.
func State(ctx context.Context, cfg Config, mb, forks int) ([]StateResult, error) {
	if len(cfg.Runtimes) == 0 {
		cfg.Runtimes = []string{"gvisor"}
	}
	var out []StateResult
	for _, rt := range cfg.Runtimes {
		r, err := state(ctx, cfg, rt, mb, forks)
		if err != nil {
			r.Err = err.Error()
		}
		out = append(out, r)
	}
	return out, nil
}

func state(ctx context.Context, cfg Config, rt string, mb, forks int) (StateResult, error) {
	res := StateResult{Runtime: rt, MemoryMB: mb, Forks: forks}
	dataDir, err := os.MkdirTemp("", "cella-bench-state-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dataDir)
	d, err := daemon.New(ctx, daemon.Config{
		DataDir: dataDir, CacheDir: cfg.CacheDir, Runtime: rt, Domain: "bench.local",
		RunscPath: cfg.RunscPath, Agent: cfg.Agent, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return res, err
	}
	defer d.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	srv := &http.Server{Handler: d.Handler}
	go srv.Serve(ln)
	defer srv.Close()
	key, err := os.ReadFile(d.AdminKeyPath)
	if err != nil {
		return res, err
	}
	c, err := client.New(client.Config{URL: "http://" + ln.Addr().String(), APIKey: strings.TrimSpace(string(key))})
	if err != nil {
		return res, err
	}
	exec1 := func(conn *client.SandboxConn, cmd string) (string, error) {
		r, err := conn.Exec(ctx, cmd, client.ExecOptions{Timeout: time.Minute})
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("%q exited %d: %s", cmd, r.ExitCode, r.Stderr)
		}
		return r.Stdout, err
	}

	// Cold create → first exec, in the same run.
	t0 := time.Now()
	cold, err := c.Create(ctx, client.CreateRequest{})
	if err != nil {
		return res, err
	}
	conn, err := c.Sandbox(ctx, cold.SandboxID)
	if err == nil {
		_, err = exec1(conn, "true")
	}
	res.ColdCreate = time.Since(t0)
	_ = c.Kill(ctx, cold.SandboxID)
	if err != nil {
		return res, err
	}

	// The sandbox holding mb MiB.
	sb, err := c.Create(ctx, client.CreateRequest{MemoryMB: int64(max(512, 2*mb+256)), Timeout: new(int64(1800))})
	if err != nil {
		return res, err
	}
	defer c.Kill(context.WithoutCancel(ctx), sb.SandboxID)
	conn, err = c.Sandbox(ctx, sb.SandboxID)
	if err != nil {
		return res, err
	}
	if err := startHolder(ctx, conn, mb); err != nil {
		return res, err
	}
	res.OriginalPSS = sandboxPSS(sb.SandboxID)

	t0 = time.Now()
	if err := c.Pause(ctx, sb.SandboxID, true); err != nil {
		return res, fmt.Errorf("pause: %w", err)
	}
	res.Pause = time.Since(t0)
	t0 = time.Now()
	if _, err := c.Connect(ctx, sb.SandboxID); err != nil {
		return res, fmt.Errorf("resume: %w", err)
	}
	if conn, err = c.Sandbox(ctx, sb.SandboxID); err != nil {
		return res, err
	}
	if _, err := exec1(conn, askHolder); err != nil {
		return res, fmt.Errorf("holder after resume: %w", err)
	}
	res.Resume = time.Since(t0)

	t0 = time.Now()
	sn, err := c.Snapshot(ctx, sb.SandboxID, "")
	if err != nil {
		return res, fmt.Errorf("snapshot: %w", err)
	}
	res.Snapshot = time.Since(t0)
	_ = c.DeleteSnapshot(ctx, sn.SnapshotID)

	before := stateDu(dataDir)
	t0 = time.Now()
	fr, err := c.Fork(ctx, sb.SandboxID, forks, 30*time.Minute)
	if err != nil {
		return res, fmt.Errorf("fork: %w", err)
	}
	res.Fork = time.Since(t0)
	var ids []string
	for _, f := range fr {
		if f.Sandbox == nil {
			res.ForksFailed++
			continue
		}
		ids = append(ids, f.Sandbox.SandboxID)
		defer c.Kill(context.WithoutCancel(ctx), f.Sandbox.SandboxID)
	}
	for _, id := range ids {
		fc, err := c.Sandbox(ctx, id)
		if err == nil {
			_, err = exec1(fc, askHolder)
		}
		if err != nil {
			return res, fmt.Errorf("fork %s: %w", id, err)
		}
	}
	res.ForkAllAnswer = time.Since(t0)
	res.DiskGrowth = stateDu(dataDir) - before
	time.Sleep(2 * time.Second) // background page loading settles
	for _, id := range ids {
		p := sandboxPSS(id)
		res.ForkPSS = append(res.ForkPSS, p)
		res.ForkPSSMean += p
	}
	if len(ids) > 0 {
		res.ForkPSSMean /= int64(len(ids))
	}
	if ents, err := os.ReadDir(filepath.Join(dataDir, "snapshots")); err == nil {
		for _, e := range ents {
			res.SnapshotBytes += stateDu(filepath.Join(dataDir, "snapshots", e.Name()))
		}
	}
	return res, nil
}

func startHolder(ctx context.Context, conn *client.SandboxConn, mb int) error {
	if err := conn.WriteFile(ctx, "/home/user/holder.py", "user", strings.NewReader(holderPy)); err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	stream, err := conn.Process.Start(sctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/usr/bin/python3", Args: []string{"/home/user/holder.py", strconv.Itoa(mb)}},
	}))
	if err != nil {
		cancel()
		return err
	}
	for stream.Receive() {
		if stream.Msg().GetEvent().GetStart() != nil {
			break
		}
	}
	cancel()
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		r, err := conn.Exec(ctx, "cat /home/user/marker 2>/dev/null", client.ExecOptions{Timeout: 30 * time.Second})
		if err == nil && r.ExitCode == 0 && strings.TrimSpace(r.Stdout) == "ready" {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("the holder process never got ready")
}

func stateDu(dir string) int64 {
	out, err := exec.Command("du", "-sx", "--block-size=1", dir).Output()
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
	return n
}

// PrintState prints StateResults as a table or JSON.
func PrintState(w io.Writer, rs []StateResult, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rs)
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
	mib := func(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range rs {
		fmt.Fprintf(tw, "runtime %s, sandbox holding %d MiB of touched memory\n", r.Runtime, r.MemoryMB)
		if r.Err != "" {
			fmt.Fprintf(tw, "  error\t%s\n", r.Err)
		}
		fmt.Fprintf(tw, "  cold create → first exec (baseline)\t%s\n", ms(r.ColdCreate))
		fmt.Fprintf(tw, "  pause (keep memory)\t%s\n", ms(r.Pause))
		fmt.Fprintf(tw, "  resume → holder answers\t%s\n", ms(r.Resume))
		fmt.Fprintf(tw, "  snapshot (original keeps running)\t%s\t%s on disk\n", ms(r.Snapshot), mib(r.SnapshotBytes))
		fmt.Fprintf(tw, "  fork ×%d (API call)\t%s\t%s per fork, %d failed\n", r.Forks, ms(r.Fork), ms(r.Fork/time.Duration(max(1, r.Forks))), r.ForksFailed)
		fmt.Fprintf(tw, "  fork ×%d → every fork's holder answered\t%s\n", r.Forks, ms(r.ForkAllAnswer))
		fmt.Fprintf(tw, "  host memory (PSS): original\t%s\n", mib(r.OriginalPSS))
		fmt.Fprintf(tw, "  host memory (PSS): per fork, mean\t%s\n", mib(r.ForkPSSMean))
		fmt.Fprintf(tw, "  data dir growth for the forks\t%s\n", mib(r.DiskGrowth))
	}
	return tw.Flush()
}
