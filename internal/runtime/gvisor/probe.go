package gvisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/oci"
	"github.com/cella-sandbox/cella/internal/runtime/ocicli"
)

// ProbeTimeout bounds Probe's trial run when ctx has no earlier deadline.
// A healthy boot takes ~0.1 s; the kvm platform on a PVM host never returns.
const ProbeTimeout = 30 * time.Second

// Probe implements runtime.Runtime: it times a real `runsc run` of
// /bin/true in a rootfs made of read-only binds of the host's /usr and
// /etc, under scratchDir, and removes everything afterwards.
func (r *Runtime) Probe(ctx context.Context, scratchDir string) (time.Duration, error) {
	if err := CheckBinary(r.cfg.RunscPath); err != nil {
		return 0, err
	}
	if _, err := os.Stat("/usr/bin/true"); err != nil {
		return 0, fmt.Errorf("gvisor probe: host has no /usr/bin/true for the trial container: %w", err)
	}
	took, err := r.cli.Probe(ctx, scratchDir, ocicli.Trial{
		Prefix:  r.ProbePrefix(),
		Limits:  runtime.Limits{MemoryBytes: 256 << 20, Pids: 64},
		Timeout: ProbeTimeout,
		Prepare: func(spec *runtime.Spec) (func(*exec.Cmd) error, error) {
			sp, err := oci.Build(spec, oci.Options{})
			if err != nil {
				return nil, err
			}
			return nil, oci.WriteBundle(spec.BundleDir, sp)
		},
		Destroy: r.Destroy,
		Explain: func(timedOut bool, timeout time.Duration, cause string) error {
			switch {
			case timedOut:
				return fmt.Errorf("runsc run /bin/true did not finish within %s on platform %q: the platform hangs on this host (kvm does without vmx/svm; use systrap): %s",
					timeout.Round(time.Millisecond), r.cfg.Platform, cause)
			case strings.Contains(cause, "client sync file") || strings.Contains(cause, "umounter"):
				return fmt.Errorf("sandbox died at boot (%s): typical of a cgo-built runsc; rebuild with CGO_ENABLED=0", cause)
			case strings.Contains(cause, "unknown platform"):
				return fmt.Errorf("this runsc does not know platform %q (too old a build?): %s", r.cfg.Platform, cause)
			}
			return nil
		},
	})
	if err != nil {
		return 0, fmt.Errorf("gvisor probe: %w", err)
	}
	return took, nil
}

// ProbePrefix starts the ID of every probe container of this runtime.
func (r *Runtime) ProbePrefix() string { return runtime.ProbePrefix("gvisor", r.cfg.RootDir) }
