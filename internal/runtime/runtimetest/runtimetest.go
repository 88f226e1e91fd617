// Package runtimetest is the conformance suite of the runtime.Runtime
// interface: what every engine must do on its own, below any daemon. A
// runtime's tests call Suite with a constructor of fresh runtimes; each
// test starts real containers from ocitest fixtures (the base template
// through an overlay, or read-only binds of the host's /usr and /etc) with
// a shell script as PID 1, and checks what the interface promises: Start,
// State, List, Stats and its limit counters, Freeze and Thaw, Checkpoint
// and Restore (or ErrNotSupported), CheckpointRunning and RestoreFrom when
// the runtime is a runtime.Snapshotter, Destroy (idempotent, nothing left
// behind), RemoveOrphans and Probe.
//
// (The whole-daemon suite, which drives a real daemon on each runtime
// through the API, is daemon/conformance.)
package runtimetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cella-sandbox/cella/internal/cgroup"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/oci"
	"github.com/cella-sandbox/cella/internal/runtime/oci/ocitest"
)

// Suite runs every test against runtimes made by newRuntime, which gives
// each test a runtime of its own (own state dir) and removes it when the
// test ends.
func Suite(t *testing.T, newRuntime func(t *testing.T) runtime.Runtime) {
	ocitest.NeedRoot(t)
	t.Run("Lifecycle", func(t *testing.T) {
		for _, tc := range []struct {
			name        string
			useTemplate bool
		}{{"hostpaths", false}, {"template", true}} {
			t.Run(tc.name, func(t *testing.T) { testLifecycle(t, newRuntime(t), tc.useTemplate) })
		}
	})
	t.Run("LogAndFailedStart", func(t *testing.T) { testLogAndFailedStart(t, newRuntime(t)) })
	t.Run("FreezeThaw", func(t *testing.T) { testFreezeThaw(t, newRuntime(t)) })
	t.Run("Checkpoint", func(t *testing.T) { testCheckpoint(t, newRuntime(t)) })
	t.Run("Snapshotter", func(t *testing.T) { testSnapshotter(t, newRuntime(t)) })
	t.Run("StatsCountLimits", func(t *testing.T) { testStatsCountLimits(t, newRuntime(t)) })
	t.Run("RemoveOrphans", func(t *testing.T) { testRemoveOrphans(t, newRuntime(t)) })
	t.Run("Probe", func(t *testing.T) { testProbe(t, newRuntime(t)) })
}

// NewID returns a container ID that no other test on the host uses (tests
// of other checkouts may run the same suite at the same time, and cgroups
// are named by container ID host-wide).
func NewID(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "rt-" + prefix + "-" + hex.EncodeToString(b)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// start starts f's container and destroys it when the test ends.
func start(t *testing.T, rt runtime.Runtime, f *ocitest.Fixture) {
	t.Helper()
	if err := rt.Start(ctxT(t, time.Minute), f.Spec); err != nil {
		log, _ := os.ReadFile(f.Spec.LogPath)
		t.Fatalf("Start: %v\ncontainer log:\n%s", err, log)
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), f.Spec.ID) })
}

// destroy destroys id twice (Destroy is idempotent) and checks that
// nothing of it is left.
func destroy(t *testing.T, rt runtime.Runtime, id string, mountPrefixes ...string) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}
	ocitest.AssertGone(t, rt, id, mountPrefixes...)
}

func state(t *testing.T, rt runtime.Runtime, id string) runtime.Status {
	t.Helper()
	st, err := rt.State(ctxT(t, time.Minute), id)
	if err != nil {
		t.Fatalf("State %s: %v", id, err)
	}
	return st
}

func testLifecycle(t *testing.T, rt runtime.Runtime, useTemplate bool) {
	id := NewID("lc")
	f := ocitest.New(t, id, useTemplate, ocitest.ReportScript)
	if useTemplate && f.Template == nil {
		t.Skip("no base template built (cella template ensure base)")
	}
	ctx := ctxT(t, 2*time.Minute)
	t0 := time.Now()
	start(t, rt, f)
	started := time.Since(t0)
	rep := f.Accept(t, 30*time.Second)
	t.Logf("%s: Start returned after %s (PID 1 running), report after %s: %+v", rt.Name(), started, time.Since(t0), rep)

	if st := state(t, rt, id); st != runtime.StatusRunning {
		t.Fatalf("State = %q, want running", st)
	}
	if ids, err := rt.List(ctx); err != nil || !slices.Equal(ids, []string{id}) {
		t.Fatalf("List = %v, %v; want [%s]", ids, err, id)
	}
	if rep.Hostname != f.Spec.Hostname {
		t.Errorf("hostname %q, want %q", rep.Hostname, f.Spec.Hostname)
	}
	// gVisor lets setuid binaries (sudo) elevate inside its sentry; on the
	// host kernel (crun) no_new_privs stays on.
	wantNNP := "1"
	if rt.Name() == "gvisor" {
		wantNNP = "0"
	}
	if rep.Seccomp != "2" || rep.NoNewPrivs != wantNNP {
		t.Errorf("seccomp %q no_new_privs %q, want 2 and %s", rep.Seccomp, rep.NoNewPrivs, wantNNP)
	}
	if rep.Unshare == "ok" {
		t.Error("unshare(CLONE_NEWUSER) allowed")
	}
	for _, d := range rep.NetDevs {
		if d != "lo" {
			t.Errorf("network device %q in a container without a network slot", d)
		}
	}
	if f.Layer != nil {
		if rep.UserWrite != "ok" {
			log, _ := os.ReadFile(f.Spec.LogPath)
			t.Errorf("uid 1000 cannot write /home/user; log:\n%s", log)
		}
		st, err := os.Stat(filepath.Join(f.Layer.Upper, "home/user/written-by-user"))
		if err != nil {
			t.Errorf("user's write not in the upper layer: %v", err)
		} else if uid := st.Sys().(*syscall.Stat_t).Uid; uid != 1000 {
			t.Errorf("user's file has on-disk uid %d, want 1000", uid)
		}
	}
	if lim, err := cgroup.MemoryLimit(id); err != nil || lim != f.Spec.Limits.MemoryBytes {
		t.Errorf("memory.limit_in_bytes = %d, %v; want %d", lim, err, f.Spec.Limits.MemoryBytes)
	}
	assertCPULimit(t, f.Spec)
	s, err := rt.Stats(ctx, id)
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	if s.CPU <= 0 || s.Memory <= 0 || s.FileCache < 0 || s.FileCache > s.Memory {
		t.Errorf("Stats of a container that ran python3: %+v", s)
	}
	if s.OOMKills != 0 || s.PidsMaxHits != 0 {
		t.Errorf("Stats count limit hits of a container far below its limits: %+v", s)
	}
	destroy(t, rt, id, f.Spec.BundleDir)
	if _, err := rt.Stats(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Stats after Destroy: %v, want ErrNotFound", err)
	}
}

// assertCPULimit: the container of spec has spec's CPU limit in its
// cgroup (a runtime may restore under another, but not return with it).
func assertCPULimit(t *testing.T, spec runtime.Spec) {
	t.Helper()
	if spec.Limits.CPUs <= 0 {
		t.Fatalf("the fixture of %s has no CPU limit to check", spec.ID)
	}
	wantQuota, wantPeriod := oci.CPUQuota(spec.Limits.CPUs)
	if quota, period, err := cgroup.CPUQuota(spec.ID); err != nil || quota != wantQuota || period != wantPeriod {
		t.Errorf("CPU limit of %s: quota %d period %d (%v); want %d every %d (%g CPUs)", spec.ID, quota, period, err, wantQuota, wantPeriod, spec.Limits.CPUs)
	}
}

// The log gets both streams intact (the file is opened O_APPEND), and a
// failed start says why and leaves nothing behind.
func testLogAndFailedStart(t *testing.T, rt runtime.Runtime) {
	id := NewID("log")
	f := ocitest.New(t, id, false, `for i in 1 2 3; do echo out$i; echo err$i >&2; done; exec sleep 1000`)
	start(t, rt, f)
	log := waitLog(t, f, func(log string) bool { return strings.Count(log, "\n") >= 6 })
	for _, w := range []string{"out1", "err1", "out2", "err2", "out3", "err3"} {
		if !strings.Contains(log, w+"\n") {
			t.Errorf("log lacks %s:\n%s", w, log)
		}
	}
	destroy(t, rt, id, f.Spec.BundleDir)

	bad := NewID("bad")
	fb := ocitest.New(t, bad, false, "true")
	fb.Spec.Args = []string{"/nonexistent"}
	err := rt.Start(ctxT(t, time.Minute), fb.Spec)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent") {
		t.Fatalf("Start of a missing binary: %v, want an error naming it", err)
	}
	ocitest.AssertGone(t, rt, bad, fb.Spec.BundleDir)
}

// waitLog polls f's container log until ok says it holds what is wanted.
func waitLog(t *testing.T, f *ocitest.Fixture, ok func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		b, _ := os.ReadFile(f.Spec.LogPath)
		if ok(string(b)) {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the container log never got what the test waits for:\n%s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tickScript prints "tick N" every 50 ms, N counting from 1: its log says
// whether the process ran (N moved), and whether it went on from where it
// was (N+1 follows N) or started again (1).
const tickScript = `trap '' USR1; i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.05; done`

// ticks returns the tick numbers in a log, in order.
func ticks(log string) []int {
	var out []int
	for line := range strings.Lines(log) {
		if n, ok := strings.CutPrefix(strings.TrimSpace(line), "tick "); ok {
			if v, err := strconv.Atoi(n); err == nil {
				out = append(out, v)
			}
		}
	}
	return out
}

func lastTick(t *testing.T, f *ocitest.Fixture) int {
	t.Helper()
	b, _ := os.ReadFile(f.Spec.LogPath)
	ts := ticks(string(b))
	if len(ts) == 0 {
		return 0
	}
	return ts[len(ts)-1]
}

// waitTick waits until the log's last tick is above n and returns it.
func waitTick(t *testing.T, f *ocitest.Fixture, n int) int {
	t.Helper()
	waitLog(t, f, func(log string) bool { ts := ticks(log); return len(ts) > 0 && ts[len(ts)-1] > n })
	return lastTick(t, f)
}

// frozenFor is how long a frozen container is watched for a tick: at its
// pace (50 ms) a running one would print about 20.
const frozenFor = time.Second

func testFreezeThaw(t *testing.T, rt runtime.Runtime) {
	id := NewID("frz")
	f := ocitest.New(t, id, false, tickScript)
	start(t, rt, f)
	waitTick(t, f, 2)
	ctx := ctxT(t, 2*time.Minute)
	for round := range 3 {
		if err := rt.Freeze(ctx, id); err != nil {
			t.Fatalf("round %d: Freeze: %v", round, err)
		}
		if st := state(t, rt, id); st != runtime.StatusPaused {
			t.Fatalf("round %d: State after Freeze = %q, want paused", round, st)
		}
		n := lastTick(t, f)
		time.Sleep(frozenFor)
		if after := lastTick(t, f); after != n {
			t.Fatalf("round %d: a frozen container ran: tick %d, then %d", round, n, after)
		}
		if _, err := rt.Stats(ctx, id); err != nil {
			t.Fatalf("round %d: Stats of a frozen container: %v", round, err)
		}
		if err := rt.Thaw(ctx, id); err != nil {
			t.Fatalf("round %d: Thaw: %v", round, err)
		}
		if st := state(t, rt, id); st != runtime.StatusRunning {
			t.Fatalf("round %d: State after Thaw = %q, want running", round, st)
		}
		waitTick(t, f, n)
	}
	// A frozen container is destroyed as well as a running one.
	if err := rt.Freeze(ctx, id); err != nil {
		t.Fatal(err)
	}
	destroy(t, rt, id, f.Spec.BundleDir)
}

// startTicking starts a tickScript container and waits until it counted
// past 2; it returns the fixture, the count then and an empty directory
// for a checkpoint image.
func startTicking(t *testing.T, rt runtime.Runtime, prefix string) (f *ocitest.Fixture, count int, imageDir string) {
	t.Helper()
	f = ocitest.New(t, NewID(prefix), false, tickScript)
	start(t, rt, f)
	count = waitTick(t, f, 2)
	imageDir = filepath.Join(f.Dir, "image")
	if err := os.Mkdir(imageDir, 0o700); err != nil {
		t.Fatal(err)
	}
	return f, count, imageDir
}

// testCheckpoint: with MemoryCheckpoint, Checkpoint saves the container and
// removes it as Destroy does, and Restore brings its processes back where
// they were (the count goes on); without, both are ErrNotSupported and the
// container is left as it was.
func testCheckpoint(t *testing.T, rt runtime.Runtime) {
	f, before, img := startTicking(t, rt, "ckp")
	id := f.Spec.ID
	ctx := ctxT(t, 2*time.Minute)
	if !rt.Capabilities().MemoryCheckpoint {
		if err := rt.Checkpoint(ctx, id, img); !errors.Is(err, runtime.ErrNotSupported) {
			t.Fatalf("Checkpoint without MemoryCheckpoint: %v, want ErrNotSupported", err)
		}
		if err := rt.Restore(ctx, f.Spec, img); !errors.Is(err, runtime.ErrNotSupported) {
			t.Fatalf("Restore without MemoryCheckpoint: %v, want ErrNotSupported", err)
		}
		if st := state(t, rt, id); st != runtime.StatusRunning {
			t.Fatalf("State after a refused Checkpoint = %q, want running", st)
		}
		waitTick(t, f, lastTick(t, f))
		destroy(t, rt, id, f.Spec.BundleDir)
		return
	}
	if err := rt.Checkpoint(ctx, id, img); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	saved := lastTick(t, f)
	// Gone as after Destroy: no process, cgroup, mount or state.
	ocitest.AssertGone(t, rt, id, f.Spec.BundleDir)
	if err := rt.Restore(ctx, f.Spec, img); err != nil {
		log, _ := os.ReadFile(f.Spec.LogPath)
		t.Fatalf("Restore: %v\ncontainer log:\n%s", err, log)
	}
	if st := state(t, rt, id); st != runtime.StatusRunning {
		t.Fatalf("State after Restore = %q, want running", st)
	}
	assertCPULimit(t, f.Spec)
	waitTick(t, f, saved)
	b, _ := os.ReadFile(f.Spec.LogPath)
	ts := ticks(string(b))
	if i := slices.Index(ts, saved); i < 0 || i+1 >= len(ts) || ts[i+1] != saved+1 || saved < before {
		t.Fatalf("after a checkpoint at tick %d the restored container did not go on from there: %v", saved, ts)
	}
	destroy(t, rt, id, f.Spec.BundleDir)
}

// testSnapshotter: a runtime.Snapshotter saves a running container that
// goes on running, and starts another container from the image whose
// processes go on from the save, any number of times.
func testSnapshotter(t *testing.T, rt runtime.Runtime) {
	sn, ok := rt.(runtime.Snapshotter)
	if !ok {
		t.Skipf("%s is no runtime.Snapshotter", rt.Name())
	}
	f, before, img := startTicking(t, rt, "snap")
	id := f.Spec.ID
	ctx := ctxT(t, 2*time.Minute)
	if err := sn.CheckpointRunning(ctx, id, img); err != nil {
		t.Fatalf("CheckpointRunning: %v", err)
	}
	saved := lastTick(t, f)
	if st := state(t, rt, id); st != runtime.StatusRunning {
		t.Fatalf("State after CheckpointRunning = %q, want running", st)
	}
	waitTick(t, f, saved)
	for i := range 2 {
		cid := NewID("fork")
		c := ocitest.New(t, cid, false, "exit 1") // never run: the restore brings the saved processes
		c.Spec.Args = f.Spec.Args
		if err := sn.RestoreFrom(ctx, c.Spec, img); err != nil {
			log, _ := os.ReadFile(c.Spec.LogPath)
			t.Fatalf("RestoreFrom %d: %v\ncontainer log:\n%s", i, err, log)
		}
		t.Cleanup(func() { _ = rt.Destroy(context.Background(), cid) })
		assertCPULimit(t, c.Spec)
		first := waitTick(t, c, 0)
		b, _ := os.ReadFile(c.Spec.LogPath)
		// The save came after tick "before" and before the read of "saved".
		if ts := ticks(string(b)); ts[0] <= before || ts[0] > saved+1 {
			t.Fatalf("restore %d of a save between ticks %d and %d counted %v: not from the save", i, before, saved, ts)
		}
		t.Logf("restore %d: first tick %d (saved at %d or just after)", i, first, saved)
		destroy(t, rt, cid, c.Spec.BundleDir)
	}
	if st := state(t, rt, id); st != runtime.StatusRunning {
		t.Fatalf("the original after its restores: %q, want running", st)
	}
	destroy(t, rt, id, f.Spec.BundleDir)
}

// testStatsCountLimits: a container hitting its pids ceiling and one
// hitting its memory ceiling are counted in Stats, and the counts can be
// read until Destroy even when the hit ended the whole container (gVisor:
// its sentry is one process to the host).
func testStatsCountLimits(t *testing.T, rt runtime.Runtime) {
	ctx := ctxT(t, 3*time.Minute)
	wait := func(t *testing.T, id string, what string, hit func(runtime.Stats) bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			s, err := rt.Stats(ctx, id)
			if err == nil && hit(s) {
				t.Logf("%s: %+v", what, s)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: never counted (Stats %+v, %v)", what, s, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Run("Pids", func(t *testing.T) {
		id := NewID("pids")
		f := ocitest.New(t, id, false, `i=0; while [ $i -lt 1000 ]; do sleep 600 & i=$((i+1)); done; exec sleep 1000`)
		f.Spec.Limits.Pids = 64
		start(t, rt, f)
		wait(t, id, "forks past 64 pids", func(s runtime.Stats) bool { return s.PidsMaxHits > 0 })
		destroy(t, rt, id, f.Spec.BundleDir)
	})
	t.Run("Memory", func(t *testing.T) {
		id := NewID("mem")
		// tail keeps a line without a newline whole: 400 MB of it.
		f := ocitest.New(t, id, false, `head -c 400000000 /dev/zero | tail >/dev/null; exec sleep 1000`)
		f.Spec.Limits.MemoryBytes = 128 << 20
		start(t, rt, f)
		wait(t, id, "400 MB under a 128 MiB ceiling", func(s runtime.Stats) bool { return s.OOMKills > 0 })
		destroy(t, rt, id, f.Spec.BundleDir)
	})
}

// testRemoveOrphans: an empty, old cgroup of a container that no longer
// exists goes; a running container's cgroups stay although keep does not
// claim them (they could be another daemon's), and so does a young empty
// one (a container being created).
func testRemoveOrphans(t *testing.T, rt runtime.Runtime) {
	id := NewID("live")
	f := ocitest.New(t, id, false, "exec sleep 1000")
	start(t, rt, f)
	orphan, young := NewID("orphan"), NewID("young")
	old := time.Now().Add(-time.Hour)
	for _, o := range []string{orphan, young} {
		d := filepath.Join(cgroup.Root, "pids", cgroup.Parent, o)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cgroup.Remove(o) })
		if o == orphan {
			if err := os.Chtimes(d, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, d := range mustDirs(t, id) {
		if err := os.Chtimes(d, old, old); err != nil {
			t.Fatal(err)
		}
	}
	// Only this test's IDs are candidates: other tests' cgroups are theirs.
	mine := []string{id, orphan, young}
	removed, err := rt.RemoveOrphans(ctxT(t, time.Minute), func(c string) bool { return !slices.Contains(mine, c) })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{orphan}) {
		t.Fatalf("RemoveOrphans removed %v, want [%s]", removed, orphan)
	}
	if d := mustDirs(t, orphan); len(d) > 0 {
		t.Fatalf("the orphan's cgroups are left: %v", d)
	}
	if d := mustDirs(t, young); len(d) == 0 {
		t.Fatal("a young empty cgroup was removed")
	}
	if st := state(t, rt, id); st != runtime.StatusRunning {
		t.Fatalf("a running container after RemoveOrphans: %q", st)
	}
	if _, err := rt.Stats(ctxT(t, time.Minute), id); err != nil {
		t.Fatalf("a running container's cgroups after RemoveOrphans: %v", err)
	}
	destroy(t, rt, id, f.Spec.BundleDir)
}

func mustDirs(t *testing.T, id string) []string {
	t.Helper()
	d, err := cgroup.Dirs(id)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// testProbe: Probe times a real trial container and leaves nothing of it
// (probe containers are named by the runtime's ProbePrefix, when it tells).
func testProbe(t *testing.T, rt runtime.Runtime) {
	scratch := t.TempDir()
	d, err := rt.Probe(ctxT(t, time.Minute), scratch)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probe: %s", d)
	if d <= 0 || d > time.Minute {
		t.Fatalf("probe duration %s", d)
	}
	if ents, err := os.ReadDir(scratch); err != nil || len(ents) > 0 {
		t.Fatalf("the probe left %v in its scratch dir (%v)", ents, err)
	}
	if ids, err := rt.List(ctxT(t, time.Minute)); err != nil || len(ids) > 0 {
		t.Fatalf("List after Probe = %v, %v; want none", ids, err)
	}
	if p, ok := rt.(interface{ ProbePrefix() string }); ok {
		ocitest.AssertGone(t, rt, p.ProbePrefix(), scratch)
	}
}
