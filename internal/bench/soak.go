package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// SoakConfig sizes `cella bench soak`.
type SoakConfig struct {
	Config
	Runtime  string
	Agents   int // concurrent agents, each with its own sandbox
	Commands int // commands per agent
	// Crash runs the crash phase after the load: the same load, the daemon
	// killed with SIGKILL once KillAfter commands completed (0: a quarter
	// of the load), restarted on the same data dir.
	Crash     bool
	KillAfter int
	// MaxFile is the largest file an agent uploads (a few MiB).
	MaxFile int
	// Progress receives a line per phase and what it found.
	Progress io.Writer
	// Keep keeps the work dir (data dir, daemon log) even when the soak
	// passed.
	Keep bool
}

// SoakReport is what a soak measured and found. It passed when Errors and
// Leaks are empty.
type SoakReport struct {
	Runtime  string   `json:"runtime"`
	Agents   int      `json:"agents"`
	Commands int      `json:"commands"`
	Figures  []Figure `json:"figures"`
	// CommandsPerSec is the load phase's completed commands over its wall
	// time (creates and kills included in the time).
	CommandsPerSec float64    `json:"commands_per_sec"`
	Crash          *SoakCrash `json:"crash,omitempty"`
	Errors         []string   `json:"errors"`
	Leaks          []string   `json:"leaks"`
	WorkDir        string     `json:"work_dir"` // kept when the soak failed: the daemon's log is there
}

// SoakCrash is what the crash phase found.
type SoakCrash struct {
	KilledAfter int `json:"killed_after_commands"`
	// Confirmed sandboxes had their create answered 201 before the kill;
	// each is Adopted (running, exec works, its files intact) or Dead with
	// a reason.
	Confirmed int `json:"confirmed"`
	Adopted   int `json:"adopted"`
	Dead      int `json:"dead"`
	Files     int `json:"files_checked"`
	// DeadReasons are what the dead ones' records say.
	DeadReasons []string      `json:"dead_reasons,omitempty"`
	Restart     time.Duration `json:"restart_ns"` // start of the new daemon → /health answers
}

// soakUpstream is what the upstream answers for a path; the sandbox's curl
// must print exactly that.
func soakUpstream(path string) string { return "soak upstream " + path + "\n" }

// Soak runs agents × commands through a real `cella serve` child process:
// exec, file upload and download with checksums, and curl through the
// egress proxy to an upstream on loopback. Every error and every leaked
// resource is reported; then, with Crash, the same load again, a kill -9 of
// the daemon mid-load, a restart on the same data dir and the check that
// nothing confirmed was lost or orphaned.
func Soak(ctx context.Context, cfg SoakConfig) (*SoakReport, error) {
	if cfg.Runtime == "" {
		cfg.Runtime = runtime.GVisor
	}
	if cfg.MaxFile <= 0 {
		cfg.MaxFile = 3 << 20
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	rep := &SoakReport{Runtime: cfg.Runtime, Agents: cfg.Agents, Commands: cfg.Commands, Errors: []string{}, Leaks: []string{}}
	work, err := os.MkdirTemp("", "cella-soak-")
	if err != nil {
		return nil, err
	}
	rep.WorkDir = work

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, soakUpstream(r.URL.Path))
	})}
	go up.Serve(ln)
	defer up.Close()
	upPort := ln.Addr().(*net.TCPAddr).Port

	d, err := newSoakDaemon(cfg, work, upPort)
	if err != nil {
		return rep, err
	}
	defer d.abandon()
	logf := func(format string, args ...any) { fmt.Fprintf(cfg.Progress, "soak: "+format+"\n", args...) }
	logf("daemon: %s serve --data-dir %s (log %s)", cfg.CellaBinary, d.dataDir, d.logPath)
	if err := d.start(ctx); err != nil {
		return rep, err
	}

	s := &soak{cfg: cfg, d: d, upPort: upPort}
	idle, err := s.idleExec(ctx)
	if err != nil {
		return rep, fmt.Errorf("idle exec baseline: %w", err)
	}

	logf("load: %d agents × %d commands", cfg.Agents, cfg.Commands)
	t0 := time.Now()
	res := &loadResult{}
	s.run(ctx, res, nil)
	wall := time.Since(t0)
	rep.Errors = append(rep.Errors, res.errors()...)
	rep.CommandsPerSec = float64(res.completed.Load()) / wall.Seconds()
	rep.Figures = append(rep.Figures, idle)
	for _, k := range soakKinds {
		f := summarize("load: "+k.name, cfg.Runtime, res.latencies(k.name))
		if k.name == "exec" {
			f.against(idle)
			f.Extra = fmt.Sprintf("%.1f commands/s overall (%d agents)", rep.CommandsPerSec, cfg.Agents)
		}
		rep.Figures = append(rep.Figures, f)
	}
	logf("load: %d commands in %v (%.1f/s), %d errors", res.completed.Load(), wall.Round(time.Second), rep.CommandsPerSec, len(rep.Errors))
	rep.Leaks = append(rep.Leaks, s.leaksRunning(ctx, res.created())...)

	if cfg.Crash {
		c, errs, leaks := s.crash(ctx, logf)
		rep.Crash = c
		rep.Errors = append(rep.Errors, errs...)
		rep.Leaks = append(rep.Leaks, leaks...)
	}

	logf("stopping the daemon (SIGTERM)")
	if err := d.stop(); err != nil {
		rep.Errors = append(rep.Errors, "stop the daemon: "+err.Error())
	}
	rep.Leaks = append(rep.Leaks, s.leaksStopped(s.everCreated())...)
	if len(rep.Errors) == 0 && len(rep.Leaks) == 0 && !cfg.Keep {
		os.RemoveAll(work)
		rep.WorkDir = ""
	}
	return rep, nil
}

type soak struct {
	cfg    SoakConfig
	d      *soakDaemon
	upPort int

	mu  sync.Mutex
	ids map[string]bool // every sandbox ID a create answered, over all phases
}

func (s *soak) remember(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil {
		s.ids = map[string]bool{}
	}
	s.ids[id] = true
}

func (s *soak) everCreated() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.ids))
	for id := range s.ids {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// idleExec is the baseline: the same exec as the load's, on a daemon with
// one idle sandbox.
func (s *soak) idleExec(ctx context.Context) (Figure, error) {
	c := s.d.client
	sb, err := c.Create(ctx, client.CreateRequest{Timeout: new(int64(600))})
	if err != nil {
		return Figure{}, err
	}
	s.remember(sb.SandboxID)
	defer c.Kill(context.WithoutCancel(ctx), sb.SandboxID)
	conn, err := c.Sandbox(ctx, sb.SandboxID)
	if err != nil {
		return Figure{}, err
	}
	var ds []time.Duration
	for i := range 31 {
		t := time.Now()
		if err := checkEcho(ctx, conn, "soak-idle-"+strconv.Itoa(i)); err != nil {
			return Figure{}, err
		}
		if i > 0 { // the first warms the agent's connection
			ds = append(ds, time.Since(t))
		}
	}
	return summarize("idle daemon: exec echo", s.cfg.Runtime, ds), nil
}

func checkEcho(ctx context.Context, conn *client.SandboxConn, token string) error {
	res, err := conn.Exec(ctx, "echo "+token, client.ExecOptions{Timeout: 2 * time.Minute})
	switch {
	case err != nil:
		return err
	case res.ExitCode != 0 || res.Stdout != token+"\n":
		return fmt.Errorf("echo %s: exit %d, stdout %q, stderr %q, error %q", token, res.ExitCode, res.Stdout, res.Stderr, res.Error)
	}
	return nil
}

// soakKinds is the command mix, taken in turn (each agent starting at
// another place in it).
var soakKinds = []struct{ name string }{{"exec"}, {"upload"}, {"download"}, {"curl"}}

// loadResult collects the agents of one run.
type loadResult struct {
	completed atomic.Int64
	mu        sync.Mutex
	lat       map[string][]time.Duration
	agents    []*soakAgent
	errs      []string
}

func (r *loadResult) add(kind string, d time.Duration) {
	r.completed.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lat == nil {
		r.lat = map[string][]time.Duration{}
	}
	r.lat[kind] = append(r.lat[kind], d)
}

func (r *loadResult) fail(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, msg)
}

func (r *loadResult) errors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.errs)
}

func (r *loadResult) latencies(kind string) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lat[kind])
}

func (r *loadResult) created() []string {
	var out []string
	for _, a := range r.agents {
		if a.id != "" {
			out = append(out, a.id)
		}
	}
	return out
}

// soakAgent is one agent's sandbox and what it confirmed.
type soakAgent struct {
	n  int
	id string // set once the create answered 201
	// files are the paths whose upload was answered 200, with the SHA-256
	// of what was sent. A path whose later upload failed is dropped: its
	// content is unknown.
	files map[string][32]byte
}

// run starts the agents and waits for them. With stop set, an agent ends
// at the first failure after stop is closed (the daemon was killed) and
// such failures are not errors.
func (s *soak) run(ctx context.Context, res *loadResult, stop <-chan struct{}) {
	var wg sync.WaitGroup
	for n := range s.cfg.Agents {
		a := &soakAgent{n: n, files: map[string][32]byte{}}
		res.agents = append(res.agents, a)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.agent(ctx, a, res, stop)
		}()
	}
	wg.Wait()
}

func stopped(stop <-chan struct{}) bool {
	if stop == nil {
		return false
	}
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// agent creates its sandbox, runs its commands and, unless the daemon was
// killed under it, kills its sandbox.
func (s *soak) agent(ctx context.Context, a *soakAgent, res *loadResult, stop <-chan struct{}) {
	c := s.d.client
	rng := rand.New(rand.NewPCG(uint64(a.n), 0x50a4))
	fail := func(i int, kind string, err error) bool {
		if stopped(stop) {
			return true // the daemon is gone: the crash phase checks the rest
		}
		res.fail(fmt.Sprintf("agent %d command %d (%s): %v", a.n, i, kind, err))
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	sb, err := c.Create(cctx, client.CreateRequest{Timeout: new(int64(3600)), MemoryMB: 256})
	cancel()
	if err != nil {
		fail(-1, "create", err)
		return
	}
	a.id = sb.SandboxID
	s.remember(a.id)
	conn, err := c.Sandbox(ctx, a.id)
	if err != nil {
		fail(-1, "attach", err)
		return
	}
	sizes := []int{4 << 10, 64 << 10, 512 << 10, s.cfg.MaxFile}
	for i := range s.cfg.Commands {
		kind := soakKinds[(a.n+i)%len(soakKinds)].name
		path := fmt.Sprintf("/home/user/soak/f%d.bin", i%6)
		if kind == "download" && len(a.files) == 0 {
			kind = "upload"
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		t := time.Now()
		var err error
		switch kind {
		case "exec":
			err = checkEcho(cctx, conn, fmt.Sprintf("soak-%d-%d", a.n, i))
		case "upload":
			data := make([]byte, sizes[rng.IntN(len(sizes))])
			for j := range data {
				data[j] = byte(rng.Uint32())
			}
			err = s.upload(cctx, conn, a, path, data)
		case "download":
			err = s.download(cctx, conn, a, rng)
		case "curl":
			err = s.curl(cctx, conn, fmt.Sprintf("/%d/%d", a.n, i))
		}
		cancel()
		if err != nil {
			if fail(i, kind, err) {
				return
			}
			continue
		}
		res.add(kind, time.Since(t))
	}
	if stopped(stop) {
		return
	}
	kctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := c.Kill(kctx, a.id); err != nil {
		fail(s.cfg.Commands, "kill", err)
	}
}

// upload writes data at path and checks the sandbox sees its checksum.
func (s *soak) upload(ctx context.Context, conn *client.SandboxConn, a *soakAgent, path string, data []byte) error {
	sum := sha256.Sum256(data)
	if err := conn.WriteFile(ctx, path, "", bytes.NewReader(data)); err != nil {
		delete(a.files, path) // it may be half written now
		return err
	}
	a.files[path] = sum
	res, err := conn.Exec(ctx, "sha256sum "+path, client.ExecOptions{Timeout: 2 * time.Minute})
	if err != nil {
		return err
	}
	if got, _, _ := strings.Cut(res.Stdout, " "); res.ExitCode != 0 || got != hex.EncodeToString(sum[:]) {
		return fmt.Errorf("sha256sum of the %d bytes uploaded to %s: %q (exit %d, %s), want %x", len(data), path, got, res.ExitCode, res.Stderr, sum)
	}
	return nil
}

// download reads back one of the files the agent wrote.
func (s *soak) download(ctx context.Context, conn *client.SandboxConn, a *soakAgent, rng *rand.Rand) error {
	paths := make([]string, 0, len(a.files))
	for p := range a.files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	p := paths[rng.IntN(len(paths))]
	return checkFile(ctx, conn, p, a.files[p])
}

func checkFile(ctx context.Context, conn *client.SandboxConn, path string, want [32]byte) error {
	r, err := conn.ReadFile(ctx, path, "")
	if err != nil {
		return err
	}
	defer r.Close()
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return fmt.Errorf("download %s: %w", path, err)
	}
	if got := h.Sum(nil); !bytes.Equal(got, want[:]) {
		return fmt.Errorf("download %s: %d bytes with sha256 %x, want %x", path, n, got, want)
	}
	return nil
}

// curl fetches path from the upstream through the egress proxy.
func (s *soak) curl(ctx context.Context, conn *client.SandboxConn, path string) error {
	url := fmt.Sprintf("http://soak.test:%d%s", s.upPort, path)
	res, err := conn.Exec(ctx, "curl -sS --max-time 60 "+url, client.ExecOptions{Timeout: 2 * time.Minute})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || res.Stdout != soakUpstream(path) {
		return fmt.Errorf("curl %s: exit %d, stdout %q, stderr %q, blocked: %v", url, res.ExitCode, res.Stdout, res.Stderr, res.SandboxEvents)
	}
	return nil
}

// crash runs the load again, kills the daemon with SIGKILL once killAfter
// commands completed, restarts it on the same data dir and checks every
// sandbox confirmed before the kill.
func (s *soak) crash(ctx context.Context, logf func(string, ...any)) (*SoakCrash, []string, []string) {
	total := s.cfg.Agents * s.cfg.Commands
	killAfter := s.cfg.KillAfter
	if killAfter <= 0 || killAfter >= total {
		killAfter = max(total/4, 1)
	}
	c := &SoakCrash{KilledAfter: killAfter}
	logf("crash: the same load, kill -9 after %d commands", killAfter)
	stop := make(chan struct{})
	res := &loadResult{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.run(ctx, res, stop)
	}()
	// Polled: the commands' own pace decides when, not a timer.
	tick := time.NewTicker(20 * time.Millisecond)
wait:
	for res.completed.Load() < int64(killAfter) {
		select {
		case <-done:
			break wait // the load ended first (a tiny run): kill now
		case <-tick.C:
		}
	}
	tick.Stop()
	close(stop)
	s.d.kill9()
	onDisk := dirNames(filepath.Join(s.d.dataDir, "sandboxes")) // what the dead daemon had made
	<-done
	s.d.saveLeftovers(filepath.Join(filepath.Dir(s.d.dataDir), "at-kill"))
	var errs []string
	errs = append(errs, res.errors()...)
	logf("crash: killed after %d commands; %d agents had a sandbox", res.completed.Load(), len(res.created()))

	t := time.Now()
	if err := s.d.start(ctx); err != nil {
		return c, append(errs, "restart after kill -9: "+err.Error()), nil
	}
	c.Restart = time.Since(t)
	logf("crash: restarted in %v", c.Restart.Round(time.Millisecond))

	all, err := s.d.list(ctx)
	if err != nil {
		return c, append(errs, "list after restart: "+err.Error()), nil
	}
	records := map[string]client.Detail{}
	for _, d := range all {
		records[d.SandboxID] = d
	}
	for _, a := range res.agents {
		if a.id == "" {
			continue
		}
		c.Confirmed++
		d, ok := records[a.id]
		if !ok {
			errs = append(errs, fmt.Sprintf("lost: sandbox %s (agent %d) was confirmed before the kill and is not listed after the restart", a.id, a.n))
			continue
		}
		switch d.State {
		case "running":
			if e := s.checkAdopted(ctx, a); e != "" {
				errs = append(errs, e)
				continue
			}
			c.Adopted++
			c.Files += len(a.files)
		case "dead":
			// The list leaves the reason out; the detail has it.
			gctx, cancel := context.WithTimeout(ctx, time.Minute)
			full, err := s.d.client.Get(gctx, a.id)
			cancel()
			if err != nil || full.Error == "" {
				errs = append(errs, fmt.Sprintf("sandbox %s (agent %d) is dead after the restart without a reason (%v)", a.id, a.n, err))
				continue
			}
			c.Dead++
			c.DeadReasons = append(c.DeadReasons, a.id+": "+full.Error)
		default:
			errs = append(errs, fmt.Sprintf("sandbox %s (agent %d) is %s after the restart, neither adopted nor dead", a.id, a.n, d.State))
		}
	}
	logf("crash: %d confirmed: %d adopted (%d files intact), %d dead", c.Confirmed, c.Adopted, c.Files, c.Dead)

	// None orphaned: what the dead daemon had made either has a record or
	// is gone.
	candidates := append(res.created(), onDisk...)
	var leaks []string
	for _, id := range uniqueStrings(candidates) {
		if _, ok := records[id]; ok {
			continue
		}
		for _, l := range s.d.resourcesOf(id) {
			leaks = append(leaks, "orphaned after the restart: "+l)
		}
	}
	running := 0
	for _, d := range all {
		if d.State == "running" {
			running++
		}
	}
	leaks = append(leaks, s.d.slotLeaks(running)...)

	for _, d := range all {
		kctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		if err := s.d.client.Kill(kctx, d.SandboxID); err != nil && !client.IsNotFound(err) {
			errs = append(errs, fmt.Sprintf("kill %s after the restart: %v", d.SandboxID, err))
		}
		cancel()
	}
	leaks = append(leaks, s.leaksRunning(ctx, candidates)...)
	return c, errs, leaks
}

// checkAdopted: an adopted sandbox runs commands and kept its files.
func (s *soak) checkAdopted(ctx context.Context, a *soakAgent) string {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	conn, err := s.d.client.Sandbox(cctx, a.id)
	if err != nil {
		return fmt.Sprintf("adopted sandbox %s (agent %d): attach: %v", a.id, a.n, err)
	}
	if err := checkEcho(cctx, conn, "soak-adopted"); err != nil {
		return fmt.Sprintf("adopted sandbox %s (agent %d): exec: %v", a.id, a.n, err)
	}
	for p, sum := range a.files {
		if err := checkFile(cctx, conn, p, sum); err != nil {
			return fmt.Sprintf("adopted sandbox %s (agent %d): a file written before the kill: %v", a.id, a.n, err)
		}
	}
	return ""
}

// leaksRunning checks a running daemon once every sandbox is gone: no
// record, and nothing of the given sandboxes left on the host.
func (s *soak) leaksRunning(ctx context.Context, ids []string) []string {
	var leaks []string
	all, err := s.d.list(ctx)
	if err != nil {
		return []string{"list: " + err.Error()}
	}
	for _, d := range all {
		leaks = append(leaks, fmt.Sprintf("record: sandbox %s is still listed (%s)", d.SandboxID, d.State))
	}
	for _, id := range uniqueStrings(ids) {
		leaks = append(leaks, s.d.resourcesOf(id)...)
	}
	leaks = append(leaks, s.d.slotLeaks(0)...)
	// The daemon's own while it runs: the slots (checked above), the
	// agent binary's tmpfs and runsc's shared empty network namespace.
	for _, m := range s.d.mounts() {
		if !strings.HasPrefix(m, filepath.Join(s.d.dataDir, "net")+"/") && m != filepath.Join(s.d.dataDir, "runsc", "null-netns") &&
			m != filepath.Join(s.d.dataDir, "agent") {
			leaks = append(leaks, "mount: "+m)
		}
	}
	// The writable layers kept ready ahead (rootfs.Layers.Keep) hold loop
	// devices while the daemon runs; any other is a leak.
	var ready []string
	for _, l := range s.d.loopDevices() {
		if _, f, _ := strings.Cut(l, ": "); strings.HasPrefix(f, filepath.Join(s.d.dataDir, "layers", "ready-")) {
			ready = append(ready, l)
			continue
		}
		leaks = append(leaks, "loop device: "+l)
	}
	if len(ready) > soakReadyLayers {
		leaks = append(leaks, fmt.Sprintf("ready layers: %d loop devices (%s), the daemon keeps %d", len(ready), strings.Join(ready, ", "), soakReadyLayers))
	}
	return leaks
}

// soakReadyLayers is how many writable layers the daemon keeps mounted
// ahead (sandbox.readyLayers).
const soakReadyLayers = 2

// leaksStopped checks the host once the daemon has exited: nothing of it
// is left but files in its data dir.
func (s *soak) leaksStopped(ids []string) []string {
	var leaks []string
	for _, id := range ids {
		leaks = append(leaks, s.d.resourcesOf(id)...)
	}
	for _, m := range s.d.mounts() {
		leaks = append(leaks, "mount after the daemon stopped: "+m)
	}
	for _, p := range s.d.processes() {
		leaks = append(leaks, "process after the daemon stopped: "+p)
	}
	for _, l := range s.d.loopDevices() {
		leaks = append(leaks, "loop device after the daemon stopped: "+l)
	}
	leaks = append(leaks, s.d.probeLeaks()...)
	for _, sub := range []string{"sandboxes", "net", "archive", "snapshots"} {
		for _, n := range dirNames(filepath.Join(s.d.dataDir, sub)) {
			if sub == "net" && n == ".lock" {
				continue // the slot manager's lock file, kept between daemons
			}
			leaks = append(leaks, fmt.Sprintf("left in the data dir: %s/%s", sub, n))
		}
	}
	return leaks
}

func dirNames(dir string) []string {
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func uniqueStrings(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}

// soakDaemon is a `cella serve` child process on its own data dir and port.
type soakDaemon struct {
	bin, dataDir, logPath, url, rt string
	args                           []string
	poolSize                       int

	cmd    *exec.Cmd
	exited chan struct{}
	client *client.Client
}

func newSoakDaemon(cfg SoakConfig, work string, upPort int) (*soakDaemon, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	listen := ln.Addr().String()
	ln.Close()
	d := &soakDaemon{bin: cfg.CellaBinary, dataDir: filepath.Join(work, "data"), logPath: filepath.Join(work, "daemon.log"),
		url: "http://" + listen, rt: cfg.Runtime, poolSize: 4}
	d.args = []string{"serve", "--data-dir", d.dataDir, "--cache-dir", cfg.CacheDir, "--listen", listen,
		"--runtime", cfg.Runtime, "--egress-allow", "soak.test",
		// On the upstream's port only: a loopback mapping without one
		// opens every port of the host's loopback to the name.
		"--egress-resolve", fmt.Sprintf("soak.test=127.0.0.1:%d", upPort),
		"--network-pool", strconv.Itoa(d.poolSize), "--log-level", "info"}
	if cfg.RunscPath != "" {
		d.args = append(d.args, "--runsc", cfg.RunscPath)
	}
	return d, nil
}

// start runs the daemon and waits until it answers (reconciliation is
// done by then: the listener opens after it).
func (d *soakDaemon) start(ctx context.Context) error {
	if err := os.MkdirAll(d.dataDir, 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "=== %s %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(d.args, " "))
	d.cmd = exec.Command(d.bin, d.args...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	logf.Close()
	d.exited = make(chan struct{})
	go func() {
		_ = d.cmd.Wait()
		close(d.exited)
	}()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if err := health(d.url); err == nil {
			break
		}
		select {
		case <-d.exited:
			return fmt.Errorf("the daemon exited before it answered (%v); see %s", d.cmd.ProcessState, d.logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the daemon did not answer in 3 minutes; see %s", d.logPath)
		}
	}
	key, err := os.ReadFile(filepath.Join(d.dataDir, "admin.key"))
	if err != nil {
		return err
	}
	d.client, err = client.New(client.Config{URL: d.url, APIKey: strings.TrimSpace(string(key))})
	return err
}

func (d *soakDaemon) running() bool {
	if d.exited == nil {
		return false
	}
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

func (d *soakDaemon) kill9() {
	if d.running() {
		_ = d.cmd.Process.Signal(syscall.SIGKILL)
		<-d.exited
	}
}

// stop ends the daemon as an operator does (SIGTERM stops every sandbox).
func (d *soakDaemon) stop() error {
	if !d.running() {
		return errors.New("the daemon is not running")
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(3 * time.Minute):
		d.kill9()
		return errors.New("the daemon did not exit within 3 minutes of SIGTERM")
	}
	if st := d.cmd.ProcessState; !st.Success() {
		return fmt.Errorf("the daemon exited with %v; see %s", st, d.logPath)
	}
	return nil
}

// abandon stops a daemon the soak left running (an early error).
func (d *soakDaemon) abandon() {
	if d.running() {
		_ = d.stop()
	}
}

// list returns every sandbox record: running, paused and dead.
func (d *soakDaemon) list(ctx context.Context) ([]client.Detail, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return d.client.ListStates(cctx, "running,paused,dead")
}

// mounts are the mount points under the data dir.
func (d *soakDaemon) mounts() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{"read mountinfo: " + err.Error()}
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == d.dataDir || strings.HasPrefix(f[4], d.dataDir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// processes are the processes whose command line names the data dir
// (runsc, crun and their children are started with paths under it).
func (d *soakDaemon) processes() []string {
	var out []string
	for _, pid := range dirNames("/proc") {
		if _, err := strconv.Atoi(pid); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + pid + "/cmdline")
		if err != nil || !bytes.Contains(b, []byte(d.dataDir)) {
			continue
		}
		out = append(out, pid+" "+strings.Join(strings.Fields(strings.ReplaceAll(string(b), "\x00", " ")), " "))
	}
	return out
}

// resourcesOf lists what is left of sandbox id on the host: its cgroups,
// mounts, processes, runtime state and directory.
func (d *soakDaemon) resourcesOf(id string) []string {
	var out []string
	cgs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "cella", id))
	for _, cg := range cgs {
		out = append(out, fmt.Sprintf("cgroup of %s: %s", id, cg))
	}
	for _, m := range d.mounts() {
		if strings.Contains(m, "/"+id+"/") || strings.HasSuffix(m, "/"+id) {
			out = append(out, fmt.Sprintf("mount of %s: %s", id, m))
		}
	}
	for _, p := range d.processes() {
		if strings.Contains(p, id) {
			out = append(out, fmt.Sprintf("process of %s: %s", id, p))
		}
	}
	for _, p := range inCgroup("cella/" + id) {
		out = append(out, fmt.Sprintf("process in the cgroup of %s: %s", id, p))
	}
	for _, l := range d.loopDevices() {
		if strings.Contains(l, "/"+id+"/") {
			out = append(out, fmt.Sprintf("loop device of %s: %s", id, l))
		}
	}
	for _, p := range []string{filepath.Join(d.dataDir, "sandboxes", id), filepath.Join(d.dataDir, "runsc", id+".state"), filepath.Join(d.dataDir, "crun", id)} {
		if _, err := os.Lstat(p); err == nil {
			out = append(out, fmt.Sprintf("state of %s: %s", id, p))
		}
	}
	return out
}

// loopDevices are the loop devices backed by a file in the data dir (the
// sandboxes' writable layers, volumes), as "loopN: backing file".
func (d *soakDaemon) loopDevices() []string {
	var out []string
	for _, dev := range dirNames("/sys/block") {
		b, err := os.ReadFile(filepath.Join("/sys/block", dev, "loop", "backing_file"))
		if err != nil {
			continue
		}
		if f := strings.TrimSpace(string(b)); strings.HasPrefix(f, d.dataDir+"/") {
			out = append(out, dev+": "+f)
		}
	}
	return out
}

// inCgroup lists the processes whose cgroup path contains name.
func inCgroup(name string) []string {
	var out []string
	for _, pid := range dirNames("/proc") {
		if _, err := strconv.Atoi(pid); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + pid + "/cgroup")
		if err == nil && bytes.Contains(b, []byte("/"+name+"\n")) {
			out = append(out, pid)
		}
	}
	return out
}

// slotLeaks reports network slots beyond the running sandboxes' and the
// pool made ahead: each slot is two namespace mounts under <data>/net.
func (d *soakDaemon) slotLeaks(running int) []string {
	slots := map[string]bool{}
	for _, m := range d.mounts() {
		if rest, ok := strings.CutPrefix(m, filepath.Join(d.dataDir, "net")+"/"); ok {
			slots[strings.TrimSuffix(strings.TrimSuffix(rest, "-s"), "-o")] = true
		}
	}
	if len(slots) > running+d.poolSize {
		names := make([]string, 0, len(slots))
		for s := range slots {
			names = append(names, s)
		}
		sort.Strings(names)
		return []string{fmt.Sprintf("network slots: %d (%s) for %d running sandboxes and a pool of %d", len(slots), strings.Join(names, ", "), running, d.poolSize)}
	}
	return nil
}

// saveLeftovers keeps, for a diagnosis, what a killed daemon left: the
// processes naming its data dir and each sandbox's logs (agent.log, the
// runsc logs of its bundle).
func (d *soakDaemon) saveLeftovers(dir string) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return
	}
	_ = os.WriteFile(filepath.Join(dir, "processes"), []byte(strings.Join(d.processes(), "\n")+"\n"), 0o600)
	for _, id := range dirNames(filepath.Join(d.dataDir, "sandboxes")) {
		for _, rel := range []string{"agent.log", "bundle/runsc.log", "bundle/pid"} {
			b, err := os.ReadFile(filepath.Join(d.dataDir, "sandboxes", id, rel))
			if err != nil {
				continue
			}
			_ = os.MkdirAll(filepath.Join(dir, id), 0o700)
			_ = os.WriteFile(filepath.Join(dir, id, strings.ReplaceAll(rel, "/", "_")), b, 0o600)
		}
	}
}

// probeLeaks reports the start-up probe's containers (cgroups named by
// the runtime's probe prefix for this data dir).
func (d *soakDaemon) probeLeaks() []string {
	root := map[string]string{runtime.GVisor: "runsc", runtime.Namespaces: "crun"}[d.rt]
	name := map[string]string{runtime.GVisor: "gvisor", runtime.Namespaces: "crun"}[d.rt]
	prefix := runtime.ProbePrefix(name, filepath.Join(d.dataDir, root))
	cgs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "cella", prefix+"*"))
	var out []string
	for _, cg := range cgs {
		out = append(out, "probe cgroup: "+cg)
	}
	return out
}
