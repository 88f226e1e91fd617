package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/daemon"
	"github.com/cella-sandbox/cella/internal/envd/process"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/sandbox"
)

// StateResult is `cella bench state` for one runtime: the state operations
// on a sandbox holding MB of touched memory, beside a cold create and, under
// gVisor, beside raw runsc restores of the same image shape (statefloor.go)
// in the same run.
type StateResult struct {
	Runtime    string        `json:"runtime"`
	MemoryMB   int           `json:"touched_memory_mb"`
	ColdCreate time.Duration `json:"cold_create_ns"` // create → first exec done
	// Rounds of pause and resume, each resume beside a raw restore (taking
	// turns which goes first); Pause, Resume and RawRestore are the p50s.
	Rounds int           `json:"rounds"`
	Pause  time.Duration `json:"pause_ns"`
	Resume time.Duration `json:"resume_ns"` // connect → the holder answered an exec
	// RawRestore: `runsc restore --background` (the flags of cella's
	// resume) of a raw container's pause-shaped image (same runsc, global
	// flags, memory limit and touched memory) → its holder answered a
	// `runsc exec` of the same ask. ResumeRatio = Resume / it. RawPlain is
	// the same restore without --background, PlainRatio Resume / it.
	RawRestore  time.Duration `json:"raw_restore_ns,omitempty"`
	ResumeRatio float64       `json:"resume_ratio,omitempty"`
	// WideResume: the same rounds of a second sandbox, alike but for its
	// CPU limit: the host's WideCPUs cores, what the raw container (which
	// has no CPU limit) may use. WideRatio = WideResume / RawRestore: the
	// resume against the floor with the CPU limit taken out of it.
	WideCPUs       float64         `json:"wide_cpus,omitempty"`
	WideResume     time.Duration   `json:"wide_resume_ns,omitempty"`
	WideRatio      float64         `json:"wide_resume_ratio,omitempty"`
	WideResumeRuns []time.Duration `json:"wide_resume_runs_ns,omitempty"`
	RawPlain       time.Duration   `json:"raw_restore_plain_ns,omitempty"`
	PlainRatio     float64         `json:"resume_plain_ratio,omitempty"`
	ResumeRuns     []time.Duration `json:"resume_runs_ns"`
	RawRestoreRun  []time.Duration `json:"raw_restore_runs_ns,omitempty"`
	RawPlainRun    []time.Duration `json:"raw_restore_plain_runs_ns,omitempty"`
	Snapshot       time.Duration   `json:"snapshot_ns"`
	Forks          int             `json:"forks"`
	Fork           time.Duration   `json:"fork_ns"` // the fork call, until it answered
	// ForkAllAnswer: fork call → every fork's holder answered (asked all
	// at once once the call answered).
	ForkAllAnswer time.Duration `json:"fork_all_answer_ns"`
	ForksFailed   int           `json:"forks_failed"`
	// RawForks: Forks raw `runsc restore --background` of the raw
	// container's snapshot-shaped image, sandbox.ForkParallel at a time as
	// cella's forks restore, until every holder answered. The ratios are
	// Fork and ForkAllAnswer over it.
	RawForks      time.Duration `json:"raw_forks_all_answer_ns,omitempty"`
	ForkCallRatio float64       `json:"fork_call_ratio,omitempty"`
	ForkAllRatio  float64       `json:"fork_all_answer_ratio,omitempty"`
	// PSS of the original's and each fork's sandbox processes (runsc
	// sandbox + gofer, or the container's processes), from smaps_rollup.
	OriginalPSS int64   `json:"original_pss_bytes"`
	ForkPSS     []int64 `json:"fork_pss_bytes"`
	ForkPSSMean int64   `json:"fork_pss_mean_bytes"`
	// ForkPSSRatio = ForkPSSMean / OriginalPSS (the target: ≤ 0.25, forks
	// sharing their source's pages); the raw pair says what runsc's own
	// restore gives.
	ForkPSSRatio    float64 `json:"fork_pss_ratio,omitempty"`
	RawSourcePSS    int64   `json:"raw_source_pss_bytes,omitempty"`
	RawForkPSSMean  int64   `json:"raw_fork_pss_mean_bytes,omitempty"`
	RawForkPSSRatio float64 `json:"raw_fork_pss_ratio,omitempty"`
	// Mean host CPU per second of an idle fork once all answered (and
	// of an idle raw restore): what forks already up take from the rest.
	ForkIdleCPU     time.Duration `json:"fork_idle_cpu_ns_per_s"`
	OriginalIdleCPU time.Duration `json:"original_idle_cpu_ns_per_s"`
	RawForkIdleCPU  time.Duration `json:"raw_fork_idle_cpu_ns_per_s,omitempty"`
	DiskGrowth      int64         `json:"disk_growth_bytes"` // data dir (own fs) after the forks
	SnapshotBytes   int64         `json:"snapshot_bytes"`
	FloorErr        string        `json:"floor_error,omitempty"`
	Err             string        `json:"error,omitempty"`
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
open(sys.argv[2] if len(sys.argv) > 2 else "/home/user/marker", "w").write("ready")
srv.serve_forever()
`

const askHolder = `python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8000', timeout=30).read().decode())"`

// State measures pause, resume (rounds times), snapshot and fork×forks of a
// sandbox with mb MiB of touched memory, beside a cold create and, under
// gVisor, raw runsc restores of the same image shape, per runtime.
func State(ctx context.Context, cfg Config, mb, forks, rounds int) ([]StateResult, error) {
	if len(cfg.Runtimes) == 0 {
		cfg.Runtimes = []string{"gvisor"}
	}
	var out []StateResult
	for _, rt := range cfg.Runtimes {
		r, err := state(ctx, cfg, rt, mb, forks, max(1, rounds))
		if err != nil {
			r.Err = err.Error()
		}
		r.ratios()
		out = append(out, r)
	}
	return out, nil
}

// Check fails when r has an error, or under gVisor lacks a floor or a
// ratio (a smoke run fails on it, so `make test` keeps every figure).
func (r *StateResult) Check() error {
	if r.Err != "" {
		return fmt.Errorf("bench state %s: %s", r.Runtime, r.Err)
	}
	if r.Runtime != runtime.GVisor {
		return nil
	}
	if r.FloorErr != "" {
		return fmt.Errorf("bench state %s: floor: %s", r.Runtime, r.FloorErr)
	}
	for name, x := range map[string]float64{"resume": r.ResumeRatio, "resume (plain)": r.PlainRatio, "resume at the host's CPUs": r.WideRatio, "fork call": r.ForkCallRatio,
		"fork all answer": r.ForkAllRatio, "fork PSS": r.ForkPSSRatio, "raw fork PSS": r.RawForkPSSRatio} {
		if x <= 0 {
			return fmt.Errorf("bench state %s: no %s ratio", r.Runtime, name)
		}
	}
	return nil
}

func (r *StateResult) ratios() {
	div := func(a, b int64) float64 {
		if a <= 0 || b <= 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	r.ResumeRatio = div(int64(r.Resume), int64(r.RawRestore))
	r.PlainRatio = div(int64(r.Resume), int64(r.RawPlain))
	r.WideRatio = div(int64(r.WideResume), int64(r.RawRestore))
	r.ForkCallRatio = div(int64(r.Fork), int64(r.RawForks))
	r.ForkAllRatio = div(int64(r.ForkAllAnswer), int64(r.RawForks))
	r.ForkPSSRatio = div(r.ForkPSSMean, r.OriginalPSS)
	r.RawForkPSSRatio = div(r.RawForkPSSMean, r.RawSourcePSS)
}

func p50(d []time.Duration) time.Duration { return summarize("", "", slices.Clone(d)).P50 }

func state(ctx context.Context, cfg Config, rt string, mb, forks, rounds int) (StateResult, error) {
	res := StateResult{Runtime: rt, MemoryMB: mb, Forks: forks, Rounds: rounds}
	memMB := max(512, 2*mb+256)
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

	// The raw floor's source, checkpointed in both shapes (it ends there).
	var raw *rawRunsc
	var rawSrc rawSource
	floorFailed := func(err error) {
		if res.FloorErr == "" {
			res.FloorErr = err.Error()
		}
		raw.close()
		raw = nil
	}
	if rt == runtime.GVisor {
		_, base, err := ensureBase(ctx, cfg)
		if err == nil {
			raw, err = newRawRunsc(cfg.RunscPath, base.RootFS, memMB)
		}
		if err != nil {
			res.FloorErr = err.Error()
		} else {
			defer func() {
				if raw != nil {
					raw.close()
				}
			}()
			if rawSrc, err = raw.source(ctx, mb); err != nil {
				floorFailed(err)
			}
			res.RawSourcePSS = rawSrc.pss
		}
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
	sb, err := c.Create(ctx, client.CreateRequest{MemoryMB: int64(memMB), Timeout: new(int64(1800))})
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

	// Beside it, under gVisor, the same holder in a sandbox of the host's
	// CPUs: the raw container the resumes are judged by has no CPU limit.
	var wide *client.SandboxConn
	if rt == runtime.GVisor {
		res.WideCPUs = float64(goruntime.NumCPU())
		w, err := c.Create(ctx, client.CreateRequest{CPUCount: res.WideCPUs, MemoryMB: int64(memMB), Timeout: new(int64(1800))})
		if err != nil {
			return res, fmt.Errorf("sandbox of %g CPUs: %w", res.WideCPUs, err)
		}
		defer c.Kill(context.WithoutCancel(ctx), w.SandboxID)
		if wide, err = c.Sandbox(ctx, w.SandboxID); err != nil {
			return res, err
		}
		if err := startHolder(ctx, wide, mb); err != nil {
			return res, err
		}
	}
	// resume pauses id, then times its connect until its holder answered.
	resume := func(id string) (time.Duration, time.Duration, error) {
		t0 := time.Now()
		if err := c.Pause(ctx, id, true); err != nil {
			return 0, 0, fmt.Errorf("pause: %w", err)
		}
		paused := time.Since(t0)
		t0 = time.Now()
		if _, err := c.Connect(ctx, id); err != nil {
			return 0, 0, fmt.Errorf("resume: %w", err)
		}
		conn, err := c.Sandbox(ctx, id)
		if err != nil {
			return 0, 0, err
		}
		if _, err := exec1(conn, askHolder); err != nil {
			return 0, 0, fmt.Errorf("holder after resume: %w", err)
		}
		return paused, time.Since(t0), nil
	}

	// Pause and resume, each resume beside a raw restore, taking turns
	// which goes first.
	var pauses []time.Duration
	rawResume := func() {
		if raw == nil {
			return
		}
		d, err := raw.rawResume(ctx, rawSrc, "--background")
		if err != nil {
			floorFailed(err)
			return
		}
		res.RawRestoreRun = append(res.RawRestoreRun, d)
		if d, err = raw.rawResume(ctx, rawSrc); err != nil {
			floorFailed(err)
			return
		}
		res.RawPlainRun = append(res.RawPlainRun, d)
	}
	for i := range rounds {
		if i%2 == 1 {
			rawResume()
		}
		paused, resumed, err := resume(sb.SandboxID)
		if err != nil {
			return res, err
		}
		pauses = append(pauses, paused)
		res.ResumeRuns = append(res.ResumeRuns, resumed)
		if wide != nil {
			_, resumed, err := resume(wide.ID)
			if err != nil {
				return res, fmt.Errorf("sandbox of %g CPUs: %w", res.WideCPUs, err)
			}
			res.WideResumeRuns = append(res.WideResumeRuns, resumed)
		}
		if i%2 == 0 {
			rawResume()
		}
	}
	if wide != nil {
		// Gone before the forks, which it would share the machine with.
		_ = c.Kill(ctx, wide.ID)
	}
	res.Pause, res.Resume, res.RawRestore = p50(pauses), p50(res.ResumeRuns), p50(res.RawRestoreRun)
	res.WideResume = p50(res.WideResumeRuns)
	res.RawPlain = p50(res.RawPlainRun)

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
	killForks := func() {
		for _, id := range ids {
			_ = c.Kill(context.WithoutCancel(ctx), id)
		}
		ids = nil
	}
	defer killForks()
	for _, f := range fr {
		if f.Sandbox == nil {
			res.ForksFailed++
			continue
		}
		ids = append(ids, f.Sandbox.SandboxID)
	}
	// Every fork is asked at once, as a client of many forks would.
	askErrs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fc, err := c.Sandbox(ctx, id)
			if err == nil {
				_, err = exec1(fc, askHolder)
			}
			if err != nil {
				askErrs[i] = fmt.Errorf("fork %s: %w", id, err)
			}
		}()
	}
	wg.Wait()
	res.ForkAllAnswer = time.Since(t0)
	if err := errors.Join(askErrs...); err != nil {
		return res, err
	}
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
	res.ForkIdleCPU = idleCPU(ids)
	res.OriginalIdleCPU = idleCPU([]string{sb.SandboxID})
	if ents, err := os.ReadDir(filepath.Join(dataDir, "snapshots")); err == nil {
		for _, e := range ents {
			res.SnapshotBytes += stateDu(filepath.Join(dataDir, "snapshots", e.Name()))
		}
	}
	// The forks' floor, after cella's forks are gone (the same host
	// memory and cores for both).
	killForks()
	if raw != nil {
		took, pss, cpu, err := raw.rawForks(ctx, mb, forks, sandbox.ForkParallel, rawSrc)
		if err != nil {
			floorFailed(err)
		} else {
			res.RawForks, res.RawForkIdleCPU = took, cpu
			for _, p := range pss {
				res.RawForkPSSMean += p / int64(len(pss))
			}
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
		if r.FloorErr != "" {
			fmt.Fprintf(tw, "  floor error\t%s\n", r.FloorErr)
		}
		ratio := func(x float64, of string) string {
			if x == 0 {
				return ""
			}
			return fmt.Sprintf("%.2f× %s", x, of)
		}
		fmt.Fprintf(tw, "  cold create → first exec (baseline)\t%s\n", ms(r.ColdCreate))
		fmt.Fprintf(tw, "  pause (keep memory), p50 of %d\t%s\n", r.Rounds, ms(r.Pause))
		fmt.Fprintf(tw, "  resume → holder answers, p50 of %d\t%s\t%s\n", r.Rounds, ms(r.Resume),
			strings.TrimSuffix(ratio(r.ResumeRatio, "raw runsc restore --background")+"; "+ratio(r.PlainRatio, "raw plain runsc restore"), "; "))
		if r.WideResume > 0 {
			fmt.Fprintf(tw, "  resume → holder answers, a sandbox of the host's %g CPUs (the raw container's), p50 of %d\t%s\t%s\n", r.WideCPUs, len(r.WideResumeRuns), ms(r.WideResume), ratio(r.WideRatio, "raw runsc restore --background"))
		}
		if r.RawRestore > 0 {
			fmt.Fprintf(tw, "  raw runsc restore --background → holder answers (floor), p50 of %d\t%s\n", len(r.RawRestoreRun), ms(r.RawRestore))
			fmt.Fprintf(tw, "  raw plain runsc restore → holder answers, p50 of %d\t%s\n", len(r.RawPlainRun), ms(r.RawPlain))
		}
		fmt.Fprintf(tw, "  snapshot (original keeps running)\t%s\t%s on disk\n", ms(r.Snapshot), mib(r.SnapshotBytes))
		fmt.Fprintf(tw, "  fork ×%d (API call)\t%s\t%s per fork, %d failed; %s\n", r.Forks, ms(r.Fork), ms(r.Fork/time.Duration(max(1, r.Forks))), r.ForksFailed, ratio(r.ForkCallRatio, "raw restores"))
		fmt.Fprintf(tw, "  fork ×%d → every fork's holder answered\t%s\t%s\n", r.Forks, ms(r.ForkAllAnswer), ratio(r.ForkAllRatio, "raw restores"))
		if r.RawForks > 0 {
			fmt.Fprintf(tw, "  raw runsc restore --background ×%d, %d at a time → every holder answered (floor)\t%s\n", r.Forks, sandbox.ForkParallel, ms(r.RawForks))
		}
		fmt.Fprintf(tw, "  host memory (PSS): original\t%s\n", mib(r.OriginalPSS))
		fmt.Fprintf(tw, "  host memory (PSS): per fork, mean\t%s\t%s\n", mib(r.ForkPSSMean), ratio(r.ForkPSSRatio, "the original"))
		if r.RawSourcePSS > 0 {
			fmt.Fprintf(tw, "  host memory (PSS): raw source / per raw restore, mean\t%s / %s\t%s\n", mib(r.RawSourcePSS), mib(r.RawForkPSSMean), ratio(r.RawForkPSSRatio, "the raw source"))
		}
		fmt.Fprintf(tw, "  host CPU of an idle fork, mean / the original / an idle raw restore\t%.1f / %.1f / %.1f ms/s\n",
			float64(r.ForkIdleCPU)/1e6, float64(r.OriginalIdleCPU)/1e6, float64(r.RawForkIdleCPU)/1e6)
		fmt.Fprintf(tw, "  data dir growth for the forks\t%s\n", mib(r.DiskGrowth))
	}
	return tw.Flush()
}

// StateFigures are StateResults as figures, each beside its floor, for
// `cella bench all`.
func StateFigures(rs []StateResult) []Figure {
	var figs []Figure
	for _, r := range rs {
		fig := func(name string, d ...time.Duration) Figure {
			return summarize(fmt.Sprintf("%s (%d MiB touched)", name, r.MemoryMB), r.Runtime, slices.Clone(d))
		}
		rawRestore := fig("raw runsc restore --background → holder answers (resume floor)", r.RawRestoreRun...)
		rawPlain := fig("raw plain runsc restore → holder answers", r.RawPlainRun...)
		resume := fig("resume → holder answers", r.ResumeRuns...)
		resume.against(rawRestore)
		resume.alsoAgainst(rawPlain)
		wide := fig(fmt.Sprintf("resume → holder answers, a sandbox of the host's %g CPUs (the raw container has no CPU limit)", r.WideCPUs), r.WideResumeRuns...)
		wide.against(rawRestore)
		rawForksName := fmt.Sprintf("raw runsc restore --background ×%d, %d at a time → every holder answered (fork floor)", r.Forks, sandbox.ForkParallel)
		rawForks := fig(rawForksName)
		if r.RawForks > 0 {
			rawForks = fig(rawForksName, r.RawForks)
		}
		call := fig(fmt.Sprintf("fork ×%d, the call", r.Forks), r.Fork)
		call.against(rawForks)
		all := fig(fmt.Sprintf("fork ×%d → every fork's holder answered", r.Forks), r.ForkAllAnswer)
		all.against(rawForks)
		mib := func(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
		pss := fig("host memory (PSS) per idle fork")
		pss.Extra = fmt.Sprintf("%s per fork = %.2f× the original's %s; raw runsc restores: %s = %.2f× their source's %s",
			mib(r.ForkPSSMean), r.ForkPSSRatio, mib(r.OriginalPSS), mib(r.RawForkPSSMean), r.RawForkPSSRatio, mib(r.RawSourcePSS))
		pss.Extra += fmt.Sprintf("; idle host CPU %.1f ms/s per fork, %.1f per raw restore", float64(r.ForkIdleCPU)/1e6, float64(r.RawForkIdleCPU)/1e6)
		pause := fig("pause (keep memory), p50 of the rounds", r.Pause)
		pause.N = r.Rounds
		snap := fig("snapshot (original keeps running)", r.Snapshot)
		for _, f := range []*Figure{&pause, &resume, &wide, &rawRestore, &rawPlain, &snap, &call, &all, &rawForks, &pss} {
			if f.Err == "" && r.Err != "" {
				f.Err = r.Err
			}
			if f.Err == "" && r.FloorErr != "" && (f == &rawRestore || f == &rawPlain || f == &rawForks || f == &wide) {
				f.Err = r.FloorErr
			}
		}
		figs = append(figs, pause, resume)
		if r.Runtime == runtime.GVisor {
			figs = append(figs, wide)
		}
		figs = append(figs, rawRestore, rawPlain, snap, call, all, rawForks, pss)
	}
	return figs
}
