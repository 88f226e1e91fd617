package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/envd/process"
	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// The floors an exec is judged by, measured in the same run as the exec:
// the agent timing its own fork/exec/wait of the command shape an exec
// uses (bash -l -c true) inside a running sandbox, the same command through
// the agent's exec path, and the runtime's own `runsc exec` / `crun exec`
// into a running container of the same root.

// execShape is E2B's command shape, which every exec figure runs.
var execShape = []string{"/bin/bash", "-l", "-c", "true"}

// The names of the in-sandbox figures.
const (
	spawnFloorName = "in-sandbox spawn floor: the agent's fork/exec/wait of bash -l -c true"
	execPathName   = "the agent's exec path (bash -l -c true: its confinement, pipes, end event)"
	firstSpawnName = "the agent's first spawn of bash -l -c true after a pool hand-out"
)

// spawnFloors asks the agent of sandbox id to time n spawns of the exec
// shape: bare (the spawn floor) and through its exec path.
func (l *local) spawnFloors(ctx context.Context, id string, n int) (floor, path []time.Duration, err error) {
	sb, err := l.Daemon.Manager.Lookup(tenant.System, id)
	if err != nil {
		return nil, nil, err
	}
	res, err := sb.Agent().Spawn(ctx, "", n)
	if err != nil {
		return nil, nil, err
	}
	return nanos(res.FloorNs), nanos(res.PathNs), nil
}

func nanos(ns []int64) []time.Duration {
	out := make([]time.Duration, len(ns))
	for i, n := range ns {
		out[i] = time.Duration(n)
	}
	return out
}

// sdkExec runs the exec shape as E2B's SDKs do (one process.Start stream,
// read to its end) and fails unless it exited 0.
func sdkExec(ctx context.Context, conn *client.SandboxConn) error {
	noStdin := false
	req := &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: execShape[0], Args: execShape[1:]},
		Stdin:   &noStdin,
	}
	stream, err := conn.Process.Start(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	defer stream.Close()
	var end *process.ProcessEvent_EndEvent
	for stream.Receive() {
		if e := stream.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if err := stream.Err(); err != nil {
		return err
	}
	if end == nil || end.GetExitCode() != 0 {
		return fmt.Errorf("%v did not exit 0: %v", execShape, end)
	}
	return nil
}

// rawExecFloor times the runtime's own exec of the exec shape into a
// running container of its own on rootfs (no cella in between): `runsc
// exec` with the flags cella's sandboxes run with, or `crun exec`.
func rawExecFloor(ctx context.Context, cfg Config, rt, rootfs string, n int) (Figure, error) {
	name := map[string]string{runtime.GVisor: "raw runsc exec bash -l -c true", runtime.Namespaces: "raw crun exec bash -l -c true"}[rt]
	fig := Figure{Name: name, Runtime: rt}
	dir, err := os.MkdirTemp("", "cella-bench-exec-")
	if err != nil {
		return fig, err
	}
	defer os.RemoveAll(dir)
	if err := rawBundle(dir, rootfs, "/bin/sleep", "3600"); err != nil {
		return fig, err
	}
	id := fmt.Sprintf("bench-exec-%d", os.Getpid())
	cli, cleanup, err := newRawCLI(cfg, rt, filepath.Join(dir, "state"))
	if err != nil {
		return fig, err
	}
	defer cleanup()
	if err := cli.runDetached(ctx, rt, dir, id); err != nil {
		return fig, err
	}
	defer cli.remove(id)
	ds, err := repeatErr(n, func() error {
		out, err := cli(ctx, append([]string{"exec", id}, execShape...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s exec: %v: %s", rt, err, out)
		}
		return nil
	})
	fig = summarize(name, rt, ds)
	if len(ds) == 0 {
		return fig, errors.Join(errors.New("every exec failed"), err)
	}
	return fig, nil
}

// rawCLI is a runtime's own command line (runsc with the flags cella's
// sandboxes run with but no network stack, or crun) with state in one root
// directory: the raw floors' containers, no cella in between.
type rawCLI func(ctx context.Context, args ...string) *exec.Cmd

// newRawCLI is rt's rawCLI with state in root; cleanup removes what the
// runtime leaves in root (runsc's null-netns bind mount).
func newRawCLI(cfg Config, rt, root string) (cli rawCLI, cleanup func(), err error) {
	switch rt {
	case runtime.GVisor:
		return func(ctx context.Context, args ...string) *exec.Cmd {
				return exec.CommandContext(ctx, cfg.RunscPath, append([]string{"--root", root, "--platform=systrap",
					"--network=none", "--overlay2=none"}, args...)...)
			}, func() {
				_ = unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH)
			}, nil
	case runtime.Namespaces:
		return func(ctx context.Context, args ...string) *exec.Cmd { return crunCommand(ctx, root, args...) }, func() {}, nil
	}
	return nil, nil, fmt.Errorf("no raw baseline for runtime %q", rt)
}

// runDetached starts container id of bundle detached. The detached
// container keeps the stdio it is given: a pipe would never reach EOF, so
// its output goes to a file in the bundle, shown when the run fails.
func (cli rawCLI) runDetached(ctx context.Context, rt, bundle, id string) error {
	logPath := filepath.Join(bundle, "run.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	run := cli(ctx, "run", "--detach", "--bundle", bundle, id)
	run.Stdout, run.Stderr = logf, logf
	err = run.Run()
	logf.Close()
	if err != nil {
		out, _ := os.ReadFile(logPath)
		return fmt.Errorf("%s run: %v: %s", rt, err, out)
	}
	return nil
}

// remove kills and deletes container id, even once the bench's context is
// done (a cancelled bench leaves no container running).
func (cli rawCLI) remove(id string) {
	_ = cli(context.Background(), "kill", id, "KILL").Run()
	_ = cli(context.Background(), "delete", "--force", id).Run()
}

// crunCommand runs crun with state in root. crun refuses this machine's
// hybrid cgroup layout, so it runs in a private mount namespace with
// cgroup2 hidden, exactly as cella's namespaces runtime does.
func crunCommand(ctx context.Context, root string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "/bin/sh", append([]string{"-c",
		`mount -t tmpfs -o size=4k,mode=0755 cella /sys/fs/cgroup/unified && root="$0" && exec crun --root "$root" "$@"`,
		root}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	return cmd
}
