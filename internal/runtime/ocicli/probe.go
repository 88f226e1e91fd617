package ocicli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/oci"
)

// Trial is what a runtime's Probe runs: a container of /bin/true (the
// host's /usr/bin/true as its "agent") with the runtime's full isolation
// spec, in a root of read-only binds of the host's /usr and /etc.
type Trial struct {
	// Prefix starts the container's ID (runtime.ProbePrefix).
	Prefix string
	Limits runtime.Limits
	// BundleDir is the bundle's directory below the trial's ("": the
	// trial's directory itself).
	BundleDir string
	// Timeout bounds the run when ctx has no earlier deadline.
	Timeout time.Duration
	// Prepare writes the bundle of spec and returns how to run a command
	// on it (nil: the CLI's Exec).
	Prepare func(spec *runtime.Spec) (exec func(*exec.Cmd) error, err error)
	// Destroy removes the trial container (the runtime's Destroy).
	Destroy func(ctx context.Context, id string) error
	// Explain names what a failed run means on this runtime, from whether
	// it timed out and the runtime log's last error; nil: nothing known.
	Explain func(timedOut bool, timeout time.Duration, cause string) error
}

// Probe times `run` of the trial (attached: until /bin/true exited) under
// scratchDir and removes everything afterwards.
func (c *CLI) Probe(ctx context.Context, scratchDir string, tr Trial) (time.Duration, error) {
	id := runtime.NewProbeID(tr.Prefix)
	dir := filepath.Join(scratchDir, id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	spec := runtime.Spec{
		ID:          id,
		BundleDir:   filepath.Join(dir, tr.BundleDir),
		RootFS:      filepath.Join(dir, "rootfs"),
		AgentBinary: "/usr/bin/true",
		Args:        []string{"/bin/true"},
		Env:         []string{"PATH=/usr/bin:/bin"},
		RunDir:      filepath.Join(dir, "run"),
		LogPath:     filepath.Join(dir, "container.log"),
		Limits:      tr.Limits,
	}
	mounts, err := oci.HostPathsRootfs(spec.RootFS)
	if err != nil {
		return 0, err
	}
	spec.Mounts = mounts
	for _, d := range []string{spec.BundleDir, spec.RunDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return 0, err
		}
	}
	run, err := tr.Prepare(&spec)
	if err != nil {
		return 0, err
	}
	if run == nil {
		run = c.exec
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.Timeout)
		defer cancel()
		_ = tr.Destroy(dctx, id)
	}()
	timeout := tr.Timeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = time.Until(dl)
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	logf, err := os.OpenFile(spec.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	runtimeLog := filepath.Join(spec.BundleDir, c.Name+".log")
	cmd := c.Command(rctx, runtimeLog, "run", "--bundle="+spec.BundleDir, id)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.WaitDelay = 2 * time.Second
	start := time.Now()
	err = run(cmd)
	took := time.Since(start)
	if err == nil {
		return took, nil
	}
	cause := c.LastError(runtimeLog)
	timedOut := errors.Is(rctx.Err(), context.DeadlineExceeded)
	if !timedOut && ctx.Err() != nil {
		return 0, ctx.Err()
	}
	if tr.Explain != nil {
		if err := tr.Explain(timedOut, timeout, cause); err != nil {
			return 0, err
		}
	}
	if timedOut {
		return 0, fmt.Errorf("%s run /bin/true did not finish within %s: %s", c.Name, timeout.Round(time.Millisecond), cause)
	}
	return 0, fmt.Errorf("%s run /bin/true failed: %w: %s", c.Name, err, cause)
}
