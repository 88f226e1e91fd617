// Package bench measures cella against baselines taken in the same run, so
// every figure is printed beside what the machine does without cella: raw
// `runsc run` and `crun run` of the same root filesystem, and fork+exec.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/template"
)

// Config says what to measure and with which binaries.
type Config struct {
	Runtimes    []string // runtimes to measure (default both)
	N           int      // iterations per figure
	CellaBinary string
	Agent       []byte // the agent binary the benchmarks' daemons run (cella's own)
	RunscPath   string
	CacheDir    string
	Out         io.Writer
	JSON        bool
}

// Figure is one measured series.
type Figure struct {
	Name     string        `json:"name"`
	Runtime  string        `json:"runtime,omitempty"`
	N        int           `json:"n"`
	P50      time.Duration `json:"p50_ns"`
	P95      time.Duration `json:"p95_ns"`
	P99      time.Duration `json:"p99_ns"`
	Baseline string        `json:"baseline,omitempty"`
	// Ratio is P50 divided by the baseline's P50.
	Ratio float64 `json:"ratio,omitempty"`
	// Floors are the same P50 as ratios of further baselines (an exec
	// against the in-sandbox spawn floor and raw runsc/crun exec).
	Floors []Versus `json:"floors,omitempty"`
	// Extra is a figure that is not a latency (creates/s, MB per sandbox).
	Extra string `json:"extra,omitempty"`
	Err   string `json:"error,omitempty"`
}

// against sets f's baseline and f's P50 as a ratio of the baseline's.
func (f *Figure) against(b Figure) {
	f.Baseline = b.Name
	if b.P50 > 0 {
		f.Ratio = float64(f.P50) / float64(b.P50)
	}
}

// Versus is a figure's P50 as a ratio of another figure's.
type Versus struct {
	Baseline string  `json:"baseline"`
	Ratio    float64 `json:"ratio"`
}

// alsoAgainst adds b to f's floors (nothing when either has no P50).
func (f *Figure) alsoAgainst(b Figure) {
	if b.P50 > 0 && f.P50 > 0 {
		f.Floors = append(f.Floors, Versus{Baseline: b.Name, Ratio: float64(f.P50) / float64(b.P50)})
	}
}

func summarize(name, rt string, d []time.Duration) Figure {
	f := Figure{Name: name, Runtime: rt, N: len(d)}
	if len(d) == 0 {
		return f
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	pick := func(p float64) time.Duration {
		i := int(p*float64(len(d)-1) + 0.5)
		return d[i]
	}
	f.P50, f.P95, f.P99 = pick(0.50), pick(0.95), pick(0.99)
	return f
}

// Create measures create→first exec done through the API for each runtime,
// beside raw runsc/crun runs of /bin/true on the same template root and a
// plain fork+exec.
func Create(ctx context.Context, cfg Config) ([]Figure, error) {
	if cfg.N <= 0 {
		cfg.N = 20
	}
	if len(cfg.Runtimes) == 0 {
		cfg.Runtimes = []string{runtime.GVisor, runtime.Namespaces}
	}
	_, base, err := ensureBase(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var figs []Figure
	fe := summarize("fork+exec /bin/true", "", repeat(cfg.N, func() error { return exec.Command("/bin/true").Run() }))
	figs = append(figs, fe)
	for _, rt := range cfg.Runtimes {
		raw, cold := coldBesideRaw(ctx, cfg, rt, base.RootFS)
		figs = append(figs, raw, cold)
		// The same create from a warm pool (pool.go), beside the cold one.
		warm, err := apiCreatePooled(ctx, cfg, rt)
		if err != nil {
			warm.Err = err.Error()
		}
		warm.against(cold)
		figs = append(figs, warm)
		if call, ok := poolCreateCall[rt]; ok && call.N > 0 {
			call.against(raw)
			figs = append(figs, call)
		}
		figs = append(figs, poolExecs[rt]...)
	}
	return figs, nil
}

// ensureBase opens the bench's template cache and builds base if missing.
func ensureBase(ctx context.Context, cfg Config) (*template.Store, *template.Template, error) {
	tpls, err := template.NewStore(cfg.CacheDir)
	if err != nil {
		return nil, nil, err
	}
	base, err := tpls.EnsureBase(ctx, io.Discard)
	return tpls, base, err
}

func repeat(n int, f func() error) []time.Duration {
	out, _ := repeatErr(n, f)
	return out
}

// repeatErr is repeat that also returns the last failure, so a figure with
// no successful try can say why.
func repeatErr(n int, f func() error) ([]time.Duration, error) {
	var out []time.Duration
	var last error
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if err := f(); err != nil {
			last = err
			continue
		}
		out = append(out, time.Since(t0))
	}
	return out, last
}

// coldBesideRaw times a cold create + exec of true through the API of a
// daemon on the runtime, and a raw run of /bin/true by the runtime's CLI on
// the same root, one after the other N times: both see the same load, so
// their ratio holds on a machine whose load comes and goes.
func coldBesideRaw(ctx context.Context, cfg Config, rt, rootfs string) (raw, cold Figure) {
	rawName, coldName := "raw runsc run /bin/true", "cella create → first exec done (cold)"
	if rt == runtime.Namespaces {
		rawName = "raw crun run /bin/true"
	}
	raw, cold = Figure{Name: rawName, Runtime: rt}, Figure{Name: coldName, Runtime: rt}
	runRaw, cleanup, err := rawRunner(ctx, cfg, rt, rootfs)
	if err != nil {
		raw.Err, cold.Err = err.Error(), err.Error()
		return raw, cold
	}
	defer cleanup()
	l, err := startLocal(ctx, cfg, rt)
	if err != nil {
		raw.Err, cold.Err = err.Error(), err.Error()
		return raw, cold
	}
	defer l.Close()
	var raws, colds []time.Duration
	var rawErr, coldErr error
	for i := 0; i < cfg.N; i++ {
		t0 := time.Now()
		if err := runRaw(i); err != nil {
			rawErr = err
		} else {
			raws = append(raws, time.Since(t0))
		}
		if took, _, err := createThenExec(ctx, l.Client); err != nil {
			coldErr = err
		} else {
			colds = append(colds, took)
		}
	}
	raw, cold = summarize(rawName, rt, raws), summarize(coldName, rt, colds)
	if len(raws) == 0 && rawErr != nil {
		raw.Err = rawErr.Error()
	}
	if len(colds) == 0 && coldErr != nil {
		cold.Err = coldErr.Error()
	}
	cold.against(raw)
	return raw, cold
}

// createThenExec creates a sandbox, runs `true` in it and kills it: the
// time until the command is done, and until the create call answered.
func createThenExec(ctx context.Context, c *client.Client) (total, create time.Duration, err error) {
	return createThenExecOf(ctx, c, client.CreateRequest{})
}

// createThenExecOf is createThenExec with a create request of its own.
func createThenExecOf(ctx context.Context, c *client.Client, req client.CreateRequest) (total, create time.Duration, err error) {
	t, err := createExecs(ctx, c, req, 1)
	return t.total, t.create, err
}

// createTimes are the times of createExecs.
type createTimes struct {
	total  time.Duration // create called → the first exec done
	create time.Duration // the create call alone
	execs  []time.Duration
}

// createExecs creates a sandbox, runs E2B's command shape in it n times
// as its SDKs do (sdkExec) and kills it.
func createExecs(ctx context.Context, c *client.Client, req client.CreateRequest, n int) (createTimes, error) {
	var t createTimes
	t0 := time.Now()
	sb, err := c.Create(ctx, req)
	if err != nil {
		return t, err
	}
	t.create = time.Since(t0)
	defer func() { _ = c.Kill(ctx, sb.SandboxID) }()
	conn, err := c.Sandbox(ctx, sb.SandboxID)
	if err != nil {
		return t, err
	}
	for i := range n {
		start := time.Now()
		if err := sdkExec(ctx, conn); err != nil {
			return t, err
		}
		t.execs = append(t.execs, time.Since(start))
		if i == 0 {
			t.total = time.Since(t0)
		}
	}
	return t, nil
}

// rawBundle writes a minimal OCI bundle running args (default /bin/true)
// on a read-only root, for the runtimes' own baseline.
func rawBundle(dir, rootfs string, args ...string) error {
	if len(args) == 0 {
		args = []string{"/bin/true"}
	}
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user": map[string]int{"uid": 0, "gid": 0}, "args": args,
			"env": []string{"PATH=/usr/bin:/bin"}, "cwd": "/",
		},
		"root":     map[string]any{"path": rootfs, "readonly": true},
		"hostname": "bench",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		},
		"linux": map[string]any{"namespaces": []map[string]string{{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}}},
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
}

// rawRunner prepares runs of /bin/true on rootfs by the runtime's own CLI
// (runsc or crun, as cella's runtime drives it), the baseline of a cold
// create; run(i) is the i-th run.
func rawRunner(ctx context.Context, cfg Config, rt, rootfs string) (run func(i int) error, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "cella-bench-raw-")
	if err != nil {
		return nil, nil, err
	}
	if err := rawBundle(dir, rootfs); err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	root := filepath.Join(dir, "state")
	cleanup = func() {
		// runsc leaves a null-netns bind mount in its root dir; without
		// this the benchmark would leak one mount per run.
		_ = unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH)
		os.RemoveAll(dir)
	}
	id := func(i int) string { return fmt.Sprintf("bench-%s-%d-%d", rt, os.Getpid(), i) }
	switch rt {
	case runtime.GVisor:
		run = func(i int) error {
			out, err := exec.CommandContext(ctx, cfg.RunscPath, "--root", root, "--platform=systrap", "--network=none",
				"--overlay2=none", "run", "--bundle", dir, id(i)).CombinedOutput()
			if err != nil {
				return fmt.Errorf("runsc run: %v: %s", err, out)
			}
			return nil
		}
	case runtime.Namespaces:
		run = func(i int) error {
			if out, err := crunCommand(ctx, root, "run", "--bundle", dir, id(i)).CombinedOutput(); err != nil {
				return fmt.Errorf("crun run: %v: %s", err, out)
			}
			return nil
		}
	default:
		cleanup()
		return nil, nil, fmt.Errorf("no raw baseline for runtime %q", rt)
	}
	return run, cleanup, nil
}

// Print writes figures as a table or JSON.
func Print(w io.Writer, figs []Figure, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(figs)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tRUNTIME\tN\tP50\tP95\tP99\tVS BASELINE")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }
	for _, f := range figs {
		vs := ""
		if f.Ratio > 0 {
			vs = fmt.Sprintf("%.2f× %s", f.Ratio, f.Baseline)
		}
		for _, x := range f.Floors {
			vs = strings.TrimPrefix(vs+fmt.Sprintf("; %.2f× %s", x.Ratio, x.Baseline), "; ")
		}
		if f.Extra != "" {
			vs = strings.TrimPrefix(vs+"; "+f.Extra, "; ")
		}
		if f.Err != "" {
			vs = "error: " + f.Err
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", f.Name, f.Runtime, f.N, ms(f.P50), ms(f.P95), ms(f.P99), vs)
	}
	return tw.Flush()
}
