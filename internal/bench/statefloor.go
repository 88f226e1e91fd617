package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/cgroup"
)

// The floors of `cella bench state`, measured in the same run outside
// cella's API: raw runsc containers of the base root holding the same
// touched memory under the same memory limit, checkpointed and restored by
// runsc itself with the flags cella's gVisor runtime passes (its global
// flags; the pause's checkpoint and the resume's `restore --background`,
// and beside it a plain restore; the snapshot's `checkpoint --leave-running
// --compression=none` and the forks' `restore --background`), each timed until the holder answers a `runsc exec` of
// the same ask cella's figures run.

// rawAskHolder is askHolder as an argv for `runsc exec`, in the command
// shape cella's exec gives it (E2B's bash -l -c), so that the floor runs
// what cella's figure runs: the ask alone left the login shell out of the
// floor (~20-40 ms under gVisor, more right after a restore).
var rawAskHolder = []string{"/bin/bash", "-l", "-c", askHolder}

// rawRunsc drives raw runsc containers in a directory of its own.
type rawRunsc struct {
	runsc  string
	rootfs string
	memMB  int
	dir    string // bundles, images, runsc's --root, logs
	prefix string // container ids (and their cgroups, /cella/<id>) start with it
	seq    atomic.Int64

	mu  sync.Mutex
	ids []string // every container started, for cleanup
}

func newRawRunsc(runsc, rootfs string, memMB int) (*rawRunsc, error) {
	dir, err := os.MkdirTemp("", "cella-bench-rawstate-")
	if err != nil {
		return nil, err
	}
	return &rawRunsc{runsc: runsc, rootfs: rootfs, memMB: memMB, dir: dir, prefix: rawContainerPrefix()}, nil
}

// rawContainerPrefix starts this process's raw container ids.
func rawContainerPrefix() string { return fmt.Sprintf("bench-state-%d-", os.Getpid()) }

func (r *rawRunsc) root() string { return filepath.Join(r.dir, "state") }

// cmd is a runsc command with cella's global flags (gvisor.globalFlags
// without the seccomp profile the raw spec does not carry).
func (r *rawRunsc) cmd(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, r.runsc, append([]string{"--root=" + r.root(), "--platform=systrap",
		"--network=none", "--host-uds=open", "--overlay2=none", "--ignore-cgroups=false", "--allow-suid"}, args...)...)
}

func (r *rawRunsc) run(ctx context.Context, args ...string) error {
	out, err := r.cmd(ctx, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("runsc %s: %v: %s", args[0], err, out)
	}
	return nil
}

// newID names a new container and remembers it for cleanup.
func (r *rawRunsc) newID() string {
	id := fmt.Sprintf("%s%d", r.prefix, r.seq.Add(1))
	r.mu.Lock()
	r.ids = append(r.ids, id)
	r.mu.Unlock()
	return id
}

// bundle writes container id's bundle: the holder process on the base root
// (read-only, as a raw baseline), with the memory limit in its cgroup.
func (r *rawRunsc) bundle(id string, mb int) (string, error) {
	dir := filepath.Join(r.dir, "bundles", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	limit := int64(r.memMB) << 20
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user": map[string]int{"uid": 0, "gid": 0},
			// The marker goes nowhere: readiness is an answer to the ask.
			"args": []string{"/usr/bin/python3", "-c", holderPy, fmt.Sprint(mb), "/dev/null"},
			"env":  []string{"PATH=/usr/bin:/bin"}, "cwd": "/",
		},
		"root":     map[string]any{"path": r.rootfs, "readonly": true},
		"hostname": "bench",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		},
		"linux": map[string]any{
			"cgroupsPath": cgroup.Path(id),
			"resources":   map[string]any{"memory": map[string]any{"limit": limit, "swap": limit}},
			"namespaces":  []map[string]string{{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}},
		},
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
}

// launch runs `runsc <verb...> --detach --bundle B id` with the
// container's stdio on a log file (a detached container keeps its stdio: a
// pipe would never reach EOF).
func (r *rawRunsc) launch(ctx context.Context, id, bundle string, verb ...string) error {
	logPath := filepath.Join(r.dir, id+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	c := r.cmd(ctx, append(verb, "--detach", "--bundle", bundle, id)...)
	c.Stdout, c.Stderr = logf, logf
	err = c.Run()
	logf.Close()
	if err != nil {
		out, _ := os.ReadFile(logPath)
		return fmt.Errorf("runsc %s %s: %v: %s", verb[0], id, err, out)
	}
	return nil
}

// ask waits until container id's holder answers (by `runsc exec` of the
// ask), polling, for up to a few minutes.
func (r *rawRunsc) ask(ctx context.Context, id string) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, err := r.cmd(ctx, append([]string{"exec", id}, rawAskHolder...)...).CombinedOutput()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("raw holder %s never answered: %v: %s", id, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// remove ends container id and its cgroups.
func (r *rawRunsc) remove(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = r.cmd(ctx, "kill", id, "KILL").Run()
	_ = r.cmd(ctx, "delete", "--force", id).Run()
	_ = cgroup.Remove(id)
}

func (r *rawRunsc) close() {
	r.mu.Lock()
	ids := r.ids
	r.mu.Unlock()
	for _, id := range ids {
		r.remove(id)
	}
	// runsc leaves a null-netns bind mount in its root dir.
	_ = unix.Unmount(filepath.Join(r.root(), "null-netns"), unix.MNT_DETACH)
	os.RemoveAll(r.dir)
}

// rawSource is a raw holder of mb MiB, checkpointed in both of cella's
// shapes: pauseImage as a pause writes it (the source ends), forkImage as a
// snapshot writes it (taken first, while it runs). pss is the source's PSS
// while it held its memory. A resume restores into the source's own id and
// bundle, as cella's does.
type rawSource struct {
	id, bundle            string
	pauseImage, forkImage string
	pss                   int64
}

func (r *rawRunsc) source(ctx context.Context, mb int) (rawSource, error) {
	s := rawSource{id: r.newID()}
	var err error
	if s.bundle, err = r.bundle(s.id, mb); err != nil {
		return s, err
	}
	if err := r.launch(ctx, s.id, s.bundle, "run"); err != nil {
		return s, err
	}
	defer r.remove(s.id) // a checkpointed sandbox is gone, but runsc still lists it
	if err := r.ask(ctx, s.id); err != nil {
		return s, err
	}
	s.pss = sandboxPSS(s.id)
	s.forkImage = filepath.Join(r.dir, "fork-image")
	if err := r.run(ctx, "checkpoint", "--leave-running", "--compression=none", "--image-path="+s.forkImage, s.id); err != nil {
		return s, err
	}
	s.pauseImage = filepath.Join(r.dir, "pause-image")
	if err := r.run(ctx, "checkpoint", "--image-path="+s.pauseImage, s.id); err != nil {
		return s, err
	}
	return s, nil
}

// rawResume is the floor of a resume: `runsc restore` (with extra: cella's
// resume passes --background) of the pause-shaped image into the source's
// container until the holder answers; the container is removed after, so
// the next round can restore again.
func (r *rawRunsc) rawResume(ctx context.Context, s rawSource, extra ...string) (time.Duration, error) {
	t0 := time.Now()
	err := r.launch(ctx, s.id, s.bundle, append([]string{"restore", "--image-path=" + s.pauseImage}, extra...)...)
	if err == nil {
		err = r.ask(ctx, s.id)
	}
	d := time.Since(t0)
	r.remove(s.id)
	return d, err
}

// rawForks is the floor of fork ×n: n `runsc restore --background` of the
// snapshot-shaped image into new containers (spec validation a warning, as
// for cella's forks), parallel at most at a time as cella's forks restore,
// each until its holder answers; the time until every one answered, each
// restored container's PSS once all answered and their mean idle CPU (they
// are removed after).
func (r *rawRunsc) rawForks(ctx context.Context, mb, n, parallel int, s rawSource) (took time.Duration, pss []int64, cpu time.Duration, err error) {
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	t0 := time.Now()
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ids[i] = r.newID()
			bundle, err := r.bundle(ids[i], mb)
			if err == nil {
				err = r.launch(ctx, ids[i], bundle, "--restore-spec-validation=warning", "restore", "--background", "--image-path="+s.forkImage)
			}
			if err == nil {
				err = r.ask(ctx, ids[i])
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	took = time.Since(t0)
	defer func() {
		for _, id := range ids {
			r.remove(id)
		}
	}()
	if err := errors.Join(errs...); err != nil {
		return took, nil, 0, err
	}
	time.Sleep(2 * time.Second) // background page loading settles, as for cella's forks
	pss = make([]int64, n)
	for i, id := range ids {
		pss[i] = sandboxPSS(id)
	}
	return took, pss, idleCPU(ids), nil
}

// idleCPUWindow is how long idleCPU watches the forks.
const idleCPUWindow = 2 * time.Second

// idleCPU is the mean host CPU time per second that each container of ids
// used over idleCPUWindow (cpuacct v1 of its cgroup, /cella/<id>): what
// idle forks take from the restores still to come.
func idleCPU(ids []string) time.Duration {
	usage := func() (total int64) {
		for _, id := range ids {
			b, err := os.ReadFile(filepath.Join(cgroup.Root, "cpuacct", cgroup.Parent, id, "cpuacct.usage"))
			if err == nil {
				n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				total += n
			}
		}
		return total
	}
	if len(ids) == 0 {
		return 0
	}
	before, t0 := usage(), time.Now()
	time.Sleep(idleCPUWindow)
	used := usage() - before
	return time.Duration(float64(used) / time.Since(t0).Seconds() / float64(len(ids)))
}
