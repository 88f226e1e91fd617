package crun

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/ocicli"
)

// ProbeTimeout bounds Probe's trial run when ctx has no earlier deadline.
const ProbeTimeout = 20 * time.Second

// Probe implements runtime.Runtime: it times a real `crun run` of /bin/true
// with the full isolation spec (user namespace and idmapped rootfs
// included) in a rootfs of read-only binds of the host's /usr and /etc
// under scratchDir, and removes everything afterwards.
func (r *Runtime) Probe(ctx context.Context, scratchDir string) (time.Duration, error) {
	took, err := r.cli.Probe(ctx, scratchDir, ocicli.Trial{
		Prefix:    r.ProbePrefix(),
		Limits:    runtime.Limits{MemoryBytes: 64 << 20, Pids: 64, CPUs: 1},
		BundleDir: "bundle",
		Timeout:   ProbeTimeout,
		Prepare: func(spec *runtime.Spec) (func(*exec.Cmd) error, error) {
			b, err := r.prepare(spec)
			if err != nil {
				return nil, err
			}
			return func(cmd *exec.Cmd) error { return runInPrivateMountNS(r.hideUnified, r.mounts(b), cmd) }, nil
		},
		Destroy: r.Destroy,
		Explain: func(timedOut bool, _ time.Duration, cause string) error {
			if !timedOut && strings.Contains(cause, "hybrid mode") {
				return fmt.Errorf("crun refuses this host's hybrid cgroup layout even with /sys/fs/cgroup/unified hidden: %s", cause)
			}
			return nil
		},
	})
	if err != nil {
		return 0, fmt.Errorf("crun probe: %w", err)
	}
	return took, nil
}

// ProbePrefix starts the ID of every probe container of this runtime.
func (r *Runtime) ProbePrefix() string { return runtime.ProbePrefix("crun", r.cfg.RootDir) }
