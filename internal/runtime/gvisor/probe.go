package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cella-sandbox/cella/internal/runtime"
	"github.com/cella-sandbox/cella/internal/runtime/oci"
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
	id := runtime.NewProbeID(r.ProbePrefix())
	dir := filepath.Join(scratchDir, id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("gvisor probe: %w", err)
	}
	defer os.RemoveAll(dir)
	spec := runtime.Spec{
		ID:          id,
		BundleDir:   dir,
		RootFS:      filepath.Join(dir, "rootfs"),
		AgentBinary: "/usr/bin/true",
		Args:        []string{"/bin/true"},
		Env:         []string{"PATH=/usr/bin:/bin"},
		RunDir:      filepath.Join(dir, "run"),
		LogPath:     filepath.Join(dir, "container.log"),
		Limits:      runtime.Limits{MemoryBytes: 256 << 20, Pids: 64},
	}
	mounts, err := oci.HostPathsRootfs(spec.RootFS)
	if err != nil {
		return 0, fmt.Errorf("gvisor probe: %w", err)
	}
	spec.Mounts = mounts
	if err := os.Mkdir(spec.RunDir, 0o700); err != nil {
		return 0, fmt.Errorf("gvisor probe: %w", err)
	}
	sp, err := oci.Build(&spec, oci.Options{})
	if err != nil {
		return 0, fmt.Errorf("gvisor probe: %w", err)
	}
	if err := oci.WriteBundle(dir, sp); err != nil {
		return 0, fmt.Errorf("gvisor probe: %w", err)
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
	runscLog := filepath.Join(dir, "runsc.log")
	logf, err := os.OpenFile(spec.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("gvisor probe: %w", err)
	}
	defer logf.Close()
	cmd := r.command(rctx, "--log="+runscLog, "--log-format=json", "run", "--bundle="+dir, id)
	cmd.Stdout, cmd.Stderr = logf, logf
	start := time.Now()
	err = cmd.Run()
	took := time.Since(start)
	if err != nil {
		cause := lastError(runscLog)
		switch {
		case errors.Is(rctx.Err(), context.DeadlineExceeded):
			return 0, fmt.Errorf("gvisor probe: runsc run /bin/true did not finish within %s on platform %q: the platform hangs on this host (kvm does without vmx/svm; use systrap): %s",
				timeout.Round(time.Millisecond), r.cfg.Platform, cause)
		case ctx.Err() != nil:
			return 0, fmt.Errorf("gvisor probe: %w", ctx.Err())
		case strings.Contains(cause, "client sync file") || strings.Contains(cause, "umounter"):
			return 0, fmt.Errorf("gvisor probe: sandbox died at boot (%s): typical of a cgo-built runsc; rebuild with CGO_ENABLED=0", cause)
		case strings.Contains(cause, "unknown platform"):
			return 0, fmt.Errorf("gvisor probe: this runsc does not know platform %q (too old a build?): %s", r.cfg.Platform, cause)
		}
		return 0, fmt.Errorf("gvisor probe: runsc run /bin/true failed: %w: %s", err, cause)
	}
	return took, nil
}

// ProbePrefix starts the ID of every probe container of this runtime.
func (r *Runtime) ProbePrefix() string { return runtime.ProbePrefix("gvisor", r.cfg.RootDir) }
