package crun

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/oci"
)

// ProbeTimeout bounds Probe's trial run when ctx has no earlier deadline.
const ProbeTimeout = 20 * time.Second

// Probe implements runtime.Runtime: it times a real `crun run` of /bin/true
// with the full isolation spec (user namespace and idmapped rootfs
// included) in a rootfs of read-only binds of the host's /usr and /etc
// under scratchDir, and removes everything afterwards.
func (r *Runtime) Probe(ctx context.Context, scratchDir string) (time.Duration, error) {
	id := runtime.NewProbeID(r.ProbePrefix())
	dir := filepath.Join(scratchDir, id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("crun probe: %w", err)
	}
	defer os.RemoveAll(dir)
	spec := runtime.Spec{
		ID:          id,
		BundleDir:   filepath.Join(dir, "bundle"),
		RootFS:      filepath.Join(dir, "rootfs"),
		AgentBinary: "/usr/bin/true",
		Args:        []string{"/bin/true"},
		Env:         []string{"PATH=/usr/bin:/bin"},
		RunDir:      filepath.Join(dir, "run"),
		LogPath:     filepath.Join(dir, "container.log"),
		Limits:      runtime.Limits{MemoryBytes: 64 << 20, Pids: 64, CPUs: 1},
	}
	mounts, err := oci.HostPathsRootfs(spec.RootFS)
	if err != nil {
		return 0, fmt.Errorf("crun probe: %w", err)
	}
	spec.Mounts = mounts
	for _, d := range []string{spec.BundleDir, spec.RunDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return 0, fmt.Errorf("crun probe: %w", err)
		}
	}
	b, err := r.prepare(&spec)
	if err != nil {
		return 0, fmt.Errorf("crun probe: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CommandTimeout)
		defer cancel()
		_ = r.Destroy(dctx, id)
	}()
	timeout := ProbeTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = time.Until(dl)
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	logf, err := os.OpenFile(spec.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("crun probe: %w", err)
	}
	defer logf.Close()
	cmd := exec.CommandContext(rctx, r.cfg.CrunPath, append(r.globalArgs(b.crunLg), "run", "--bundle="+spec.BundleDir, id)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.WaitDelay = 2 * time.Second
	start := time.Now()
	err = runInPrivateMountNS(r.hideUnified, r.mounts(b), cmd)
	took := time.Since(start)
	if err != nil {
		cause := lastError(b.crunLg)
		switch {
		case errors.Is(rctx.Err(), context.DeadlineExceeded):
			return 0, fmt.Errorf("crun probe: crun run /bin/true did not finish within %s: %s", timeout, cause)
		case ctx.Err() != nil:
			return 0, fmt.Errorf("crun probe: %w", ctx.Err())
		case strings.Contains(cause, "hybrid mode"):
			return 0, fmt.Errorf("crun probe: crun refuses this host's hybrid cgroup layout even with /sys/fs/cgroup/unified hidden: %s", cause)
		}
		return 0, fmt.Errorf("crun probe: crun run /bin/true failed: %w: %s", err, cause)
	}
	return took, nil
}

// ProbePrefix starts the ID of every probe container of this runtime.
func (r *Runtime) ProbePrefix() string { return runtime.ProbePrefix("crun", r.cfg.RootDir) }
