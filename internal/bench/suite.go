package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
)

// Exec measures the round trip of E2B's command shape (bash -l -c true)
// in a running sandbox through the API, beside its floors measured in the
// same run: the agent's own fork/exec/wait of the same command inside the
// same sandbox, the runtime's raw exec into a container of the same root,
// and a local fork+exec of /bin/true.
func Exec(ctx context.Context, cfg Config) ([]Figure, error) {
	n := max(cfg.N, 50)
	_, base, err := ensureBase(ctx, cfg)
	if err != nil {
		return nil, err
	}
	local := summarize("fork+exec /bin/true", "", repeat(n, func() error { return exec.Command("/bin/true").Run() }))
	figs := []Figure{local}
	for _, rt := range runtimesOf(cfg) {
		raw, err := rawExecFloor(ctx, cfg, rt, base.RootFS, n)
		if err != nil {
			raw.Err = err.Error()
		}
		got, err := execOne(ctx, cfg, rt, n)
		if err != nil {
			figs = append(figs, raw, Figure{Name: "exec round trip", Runtime: rt, Err: err.Error()})
			continue
		}
		api := got[len(got)-1]
		api.alsoAgainst(raw)
		api.alsoAgainst(local)
		figs = append(figs, raw)
		figs = append(figs, got[:len(got)-1]...)
		figs = append(figs, api)
	}
	return figs, nil
}

func runtimesOf(cfg Config) []string {
	if len(cfg.Runtimes) == 0 {
		return []string{"gvisor", "namespaces"}
	}
	return cfg.Runtimes
}

// execOne returns, for one runtime and one sandbox, the spawn floor, the
// agent's exec path and (last) the API round trip against the floor,
// measured in turns so that load changes hit each alike.
func execOne(ctx context.Context, cfg Config, rt string, n int) ([]Figure, error) {
	l, err := startLocal(ctx, cfg, rt)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	conn, err := l.sandbox(ctx, client.CreateRequest{})
	if err != nil {
		return nil, err
	}
	// The first exec warms the client's and the agent's connections; it is
	// not measured.
	if err := sdkExec(ctx, conn); err != nil {
		return nil, err
	}
	var floorD, pathD, apiD []time.Duration
	const turn = 10
	for len(apiD) < n {
		k := min(turn, n-len(apiD))
		floor, path, err := l.spawnFloors(ctx, conn.ID, k)
		if err != nil {
			return nil, fmt.Errorf("spawn floor: %w", err)
		}
		floorD, pathD = append(floorD, floor...), append(pathD, path...)
		ds, err := repeatErr(k, func() error { return sdkExec(ctx, conn) })
		if len(ds) == 0 {
			return nil, fmt.Errorf("exec: %w", err)
		}
		apiD = append(apiD, ds...)
	}
	floor := summarize(spawnFloorName, rt, floorD)
	path := summarize(execPathName, rt, pathD)
	path.against(floor)
	api := summarize("exec bash -l -c true round trip (API, one process.Start stream as E2B's SDKs)", rt, apiD)
	api.against(floor)
	return []Figure{floor, path, api}, nil
}

// Burst creates 50 sandboxes at once and reports per-create latency and
// creates per second, beside a single cold create measured in the same run:
// cold (options no pool serves), and from an adaptive warm pool of set size
// 1 after a first burst taught it the demand.
func Burst(ctx context.Context, cfg Config, concurrent int) ([]Figure, error) {
	if concurrent <= 0 {
		concurrent = 50
	}
	var figs []Figure
	for _, rt := range runtimesOf(cfg) {
		l, err := startLocal(ctx, cfg, rt)
		if err != nil {
			figs = append(figs, Figure{Name: "burst", Runtime: rt, Err: err.Error()})
			continue
		}
		single := summarize("single cold create", rt, repeat(5, func() error {
			sb, err := l.Client.Create(ctx, client.CreateRequest{})
			if err == nil {
				_ = l.Client.Kill(ctx, sb.SandboxID)
			}
			return err
		}))
		// 128 MiB: limits no pool serves, so every create is cold.
		cold := burst(ctx, l.Client, rt, concurrent, client.CreateRequest{MemoryMB: 128}, fmt.Sprintf("%d concurrent creates (cold)", concurrent))
		cold.against(single)
		figs = append(figs, single, cold)
		figs = append(figs, pooledBurst(ctx, l, rt, concurrent, single)...)
		l.Close()
	}
	return figs, nil
}

// pooledBurst sets a pool of 1 for base, sends one burst (which the pool
// learns from), waits until the pool has grown toward it, and measures a
// second burst.
func pooledBurst(ctx context.Context, l *local, rt string, concurrent int, single Figure) []Figure {
	name := fmt.Sprintf("%d concurrent creates (adaptive warm pool, set size 1)", concurrent)
	if _, err := l.Client.SetPool(ctx, "base", 1); err != nil {
		return []Figure{{Name: name, Runtime: rt, Err: err.Error()}}
	}
	first := burst(ctx, l.Client, rt, concurrent, client.CreateRequest{}, "the burst the pool learns from")
	// Wait for the pool to grow toward the burst (within its budget), as
	// far as it will: until it holds the burst or stops growing.
	deadline := time.Now().Add(5 * time.Minute)
	grown, last, still := 0, -1, 0
	lastErr := ""
	for time.Now().Before(deadline) && grown < concurrent && still < 300 {
		ps, err := l.Client.ListPools(ctx)
		if err != nil || len(ps) != 1 {
			break
		}
		grown, lastErr = ps[0].Ready, ps[0].LastError
		if grown == last && ps[0].Filling == 0 {
			still++
		} else {
			still = 0
		}
		last = grown
		time.Sleep(100 * time.Millisecond)
	}
	f := burst(ctx, l.Client, rt, concurrent, client.CreateRequest{}, name)
	f.against(single)
	f.Extra = fmt.Sprintf("%s; the pool held %d after the first burst", f.Extra, grown)
	if lastErr != "" {
		f.Extra += "; its last fill error: " + lastErr
	}
	return []Figure{first, f}
}

// burst sends concurrent creates of req to c at once, then kills them.
func burst(ctx context.Context, c *client.Client, rt string, concurrent int, req client.CreateRequest, name string) Figure {
	var mu sync.Mutex
	var ds []time.Duration
	var ids []string
	var firstErr error
	var wg sync.WaitGroup
	t0 := time.Now()
	for range concurrent {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := time.Now()
			sb, err := c.Create(ctx, req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			ds = append(ds, time.Since(s))
			ids = append(ids, sb.SandboxID)
		}()
	}
	wg.Wait()
	wall := time.Since(t0)
	f := summarize(name, rt, ds)
	f.Extra = fmt.Sprintf("%.1f creates/s", float64(len(ds))/wall.Seconds())
	if firstErr != nil {
		f.Err = fmt.Sprintf("%d of %d failed: %v", concurrent-len(ds), concurrent, firstErr)
	}
	// Killed even when the bench is cancelled (an interrupt): with a
	// bound of their own, not the bench's context.
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for _, id := range ids {
		_ = c.Kill(kctx, id)
	}
	return f
}

// Files uploads and downloads 1 MB and (unless short) 1 GB through the API,
// beside copying the same bytes between two local files in the same run,
// beside the sandbox's own copy of them through a socket (from a file of
// its writable layer through a stream socket into another file, inside one
// running process: both ends in the sandbox, so an upper bound of the
// sandbox's share of a transfer, which has one end outside, rather than a
// floor), and for 1 MiB beside the same calls for one byte.
func Files(ctx context.Context, cfg Config, short bool) ([]Figure, error) {
	sizes := []int64{1 << 20, 1 << 30}
	if short {
		sizes = sizes[:1]
	}
	var figs []Figure
	for _, rt := range runtimesOf(cfg) {
		l, err := startLocal(ctx, cfg, rt)
		if err != nil {
			figs = append(figs, Figure{Name: "files", Runtime: rt, Err: err.Error()})
			continue
		}
		// The writable layer is RAM (a tmpfs upper; under gVisor the sentry
		// caches the file too) and it is charged to the sandbox: a 1 GiB
		// file needs the memory as well as the disk.
		// The in-sandbox floor holds a second copy for a moment.
		conn, err := l.sandbox(ctx, client.CreateRequest{DiskSizeMB: 3072, MemoryMB: 4096})
		if err != nil {
			l.Close()
			figs = append(figs, Figure{Name: "files", Runtime: rt, Err: err.Error()})
			continue
		}
		if err := conn.WriteFile(ctx, "/tmp/bench-socket-copy.py", "", strings.NewReader(socketCopyFloor)); err != nil {
			l.Close()
			figs = append(figs, Figure{Name: "files", Runtime: rt, Err: err.Error()})
			continue
		}
		for _, size := range sizes {
			data := make([]byte, size)
			_, _ = rand.Read(data)
			label := humanSize(size)
			n := max(cfg.N, 5)
			if size >= 1<<30 {
				n = 1
			}
			local := summarize("local file copy "+label, "", repeat(n, func() error { return localCopy(data) }))
			upD, upErr := repeatErr(n, func() error {
				return conn.WriteFile(ctx, "/home/user/bench.bin", "", bytes.NewReader(data))
			})
			up := summarize("upload "+label, rt, upD)
			downD, downErr := repeatErr(n, func() error {
				r, err := conn.ReadFile(ctx, "/home/user/bench.bin", "")
				if err != nil {
					return err
				}
				defer r.Close()
				got, err := io.Copy(io.Discard, r)
				if err == nil && got != size {
					err = fmt.Errorf("downloaded %d of %d bytes", got, size)
				}
				return err
			})
			down := summarize("download "+label, rt, downD)
			floorD, floorErr := repeatTimed(n, func() (time.Duration, error) { return sandboxCopy(ctx, conn) })
			floor := summarize("in-sandbox file → socket → file "+label, rt, floorD)
			if floor.N == 0 {
				floor.Err = fmt.Sprintf("every try failed: %v", floorErr)
			}
			// A request's own cost: the same calls for a file of one byte.
			var tinyUp, tinyDown Figure
			if size < 1<<30 {
				tinyUp, tinyDown = fileRoundTrips(ctx, conn, rt, n)
			}
			for _, x := range []struct {
				f    *Figure
				tiny Figure
				err  error
			}{{&up, tinyUp, upErr}, {&down, tinyDown, downErr}} {
				x.f.against(local)
				x.f.alsoAgainst(floor)
				x.f.alsoAgainst(x.tiny)
				if x.f.N == 0 {
					x.f.Err = fmt.Sprintf("every try failed: %v", x.err)
				}
			}
			figs = append(figs, local, floor)
			if tinyUp.Name != "" {
				figs = append(figs, tinyUp, tinyDown)
			}
			figs = append(figs, up, down)
		}
		l.Close()
	}
	return figs, nil
}

// fileRoundTrips times n uploads and n downloads of a one-byte file: what
// a file request costs beside its bytes (the API, the way to the agent,
// the agent's open as the user).
func fileRoundTrips(ctx context.Context, conn *client.SandboxConn, rt string, n int) (up, down Figure) {
	upD, upErr := repeatErr(n, func() error {
		return conn.WriteFile(ctx, "/home/user/bench.byte", "", strings.NewReader("x"))
	})
	downD, downErr := repeatErr(n, func() error {
		r, err := conn.ReadFile(ctx, "/home/user/bench.byte", "")
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.Copy(io.Discard, r)
		return err
	})
	up, down = summarize("upload 1 B", rt, upD), summarize("download 1 B", rt, downD)
	if up.N == 0 {
		up.Err = fmt.Sprintf("every try failed: %v", upErr)
	}
	if down.N == 0 {
		down.Err = fmt.Sprintf("every try failed: %v", downErr)
	}
	return up, down
}

// socketCopyFloor is the sandbox's own kernel moving a transfer's bytes,
// with no API, host or agent in between, and both ends inside: the
// uploaded file's bytes sent through a stream socket (a thread started
// beforehand writing 1 MiB pieces) and written into another file, in one
// process already running, timed by that process (its start is not
// counted: cp started per copy was mostly a spawn, ~40 ms under gVisor).
const socketCopyFloor = `
import os, socket, sys, threading, time
src, dst = sys.argv[1], sys.argv[2]
a, b = socket.socketpair()
go = threading.Event()
def send():
    go.wait()
    with open(src, "rb", buffering=0) as f:
        while True:
            d = f.read(1 << 20)
            if not d:
                break
            a.sendall(d)
    a.close()
t = threading.Thread(target=send)
t.start()
t0 = time.perf_counter_ns()
go.set()
with open(dst, "wb", buffering=0) as f:
    while True:
        d = b.recv(1 << 20)
        if not d:
            break
        f.write(d)
t.join()
print(time.perf_counter_ns() - t0)
os.unlink(dst)
`

// sandboxCopy runs socketCopyFloor on the uploaded file once.
func sandboxCopy(ctx context.Context, conn *client.SandboxConn) (time.Duration, error) {
	res, err := conn.Exec(ctx, "python3 /tmp/bench-socket-copy.py /home/user/bench.bin /home/user/bench.floor", client.ExecOptions{Timeout: 10 * time.Minute})
	if err != nil {
		return 0, err
	}
	if res.ExitCode != 0 {
		return 0, fmt.Errorf("in-sandbox copy exited %d: %s %v", res.ExitCode, res.Stderr, res.SandboxEvents)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(res.Stdout), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("in-sandbox copy: %q: %w", res.Stdout, err)
	}
	return time.Duration(ns), nil
}

// repeatTimed runs f n times and keeps the durations it reports (its own
// clock), and the last error.
func repeatTimed(n int, f func() (time.Duration, error)) ([]time.Duration, error) {
	var out []time.Duration
	var last error
	for range n {
		d, err := f()
		if err != nil {
			last = err
			continue
		}
		out = append(out, d)
	}
	return out, last
}

func localCopy(data []byte) error {
	dir, err := os.MkdirTemp("", "cella-bench-copy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(filepath.Join(dir, "dst"))
	if err != nil {
		return err
	}
	defer out.Close()
	_, err = io.Copy(out, in)
	return err
}

func humanSize(n int64) string {
	if n >= 1<<30 {
		return strconv.FormatInt(n>>30, 10) + " GiB"
	}
	return strconv.FormatInt(n>>20, 10) + " MiB"
}

// Density starts n idle sandboxes and reports the host memory each adds
// (PSS of everything in its cgroups plus its writable layer) beside the
// floor measured first in the same run (raw idle containers of the
// runtime on the same root, rawIdleFloor), and the API's latency while
// they idle.
func Density(ctx context.Context, cfg Config, n int) ([]Figure, error) {
	if n <= 0 {
		n = 200
	}
	_, base, err := ensureBase(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var figs []Figure
	for _, rt := range runtimesOf(cfg) {
		floor, floorErr := rawIdleFloor(ctx, cfg, rt, base.RootFS, min(n, 8))
		l, err := startLocal(ctx, cfg, rt)
		if err != nil {
			figs = append(figs, Figure{Name: "density", Runtime: rt, Err: err.Error()})
			continue
		}
		idle := summarize("API GET /health, no sandboxes", rt, repeat(50, func() error { return health(l.URL) }))
		var ids []string
		var firstErr error
		for i := 0; i < n; i++ {
			sb, err := l.Client.Create(ctx, client.CreateRequest{MemoryMB: 128, Timeout: new(int64(3600))})
			if err != nil {
				firstErr = err
				break
			}
			ids = append(ids, sb.SandboxID)
		}
		time.Sleep(2 * time.Second) // let the sandboxes settle to idle
		var total, charged int64
		for _, id := range ids {
			total += sandboxPSS(id)
			charged += cgroupCharge(id)
		}
		f := Figure{Name: fmt.Sprintf("idle memory per sandbox (%d sandboxes)", len(ids)), Runtime: rt, N: len(ids)}
		if len(ids) > 0 {
			// PSS sums what the sandbox's processes map, shared pages split
			// among their users; the cgroup charge is what the kernel bills
			// the sandbox (its own anon memory, gVisor's memory file, page
			// cache it brought in).
			pss, charge := float64(total)/float64(len(ids)), float64(charged)/float64(len(ids))
			f.Extra = fmt.Sprintf("%.1f MB PSS each, %.1f MB cgroup charge each", pss/1e6, charge/1e6)
			switch {
			case floorErr != nil:
				f.Extra += "; the raw floor: error: " + floorErr.Error()
			case floor.Charged > 0:
				f.Extra += fmt.Sprintf("; %.2f× the charge (%.2f× the PSS) of %s each: %.1f MB charge, %.1f MB PSS",
					charge/float64(floor.Charged), pss/float64(max(floor.PSS, 1)), floorName(rt, floor.N), float64(floor.Charged)/1e6, float64(floor.PSS)/1e6)
			}
		}
		if firstErr != nil {
			f.Err = fmt.Sprintf("stopped at %d: %v", len(ids), firstErr)
		}
		busy := summarize(fmt.Sprintf("API GET /health with %d idle sandboxes", len(ids)), rt, repeat(50, func() error { return health(l.URL) }))
		busy.against(idle)
		// The create alone: the kill after it is not the create's time (it
		// was timed with it, and a gVisor sandbox's kill is a few hundred
		// ms of runsc's own).
		createD, createErr := repeatTimed(3, func() (time.Duration, error) {
			t0 := time.Now()
			sb, err := l.Client.Create(ctx, client.CreateRequest{})
			took := time.Since(t0)
			if err != nil {
				return 0, err
			}
			_ = l.Client.Kill(ctx, sb.SandboxID)
			return took, nil
		})
		create := summarize(fmt.Sprintf("create with %d idle sandboxes", len(ids)), rt, createD)
		if create.N == 0 {
			create.Err = fmt.Sprintf("every create failed: %v", createErr)
		}
		figs = append(figs, f, idle, busy, create)
		l.Close()
	}
	return figs, nil
}

func health(base string) error {
	resp, err := http.Get(base + "/health")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("health: %d", resp.StatusCode)
	}
	return nil
}

// sandboxPSS sums the proportional set size of every process in the
// sandbox's memory cgroup (cella/<id>): runsc's sandbox (sentry) and gofer,
// or the crun container's processes.
func sandboxPSS(id string) int64 { return cgroupPSS(filepath.Join("/sys/fs/cgroup/memory/cella", id)) }

// cgroupCharge is the memory cgroup v1 usage of a sandbox's container.
func cgroupCharge(id string) int64 {
	return cgroupUsage(filepath.Join("/sys/fs/cgroup/memory/cella", id))
}

// cgroupPSS sums the proportional set size of every process in the memory
// cgroup at dir.
func cgroupPSS(dir string) int64 {
	var total int64
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err == nil {
		for _, f := range strings.Fields(string(b)) {
			total += pssOf(f)
		}
	}
	return total
}

// cgroupUsage is the usage of the memory cgroup v1 at dir.
func cgroupUsage(dir string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, "memory.usage_in_bytes"))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func pssOf(pid string) int64 {
	b, err := os.ReadFile("/proc/" + pid + "/smaps_rollup")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Pss:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
