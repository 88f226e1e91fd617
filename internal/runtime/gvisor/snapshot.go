package gvisor

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cella-sandbox/cella/internal/runtime"
)

var _ runtime.Snapshotter = (*Runtime)(nil)

// CheckpointRunning implements runtime.Snapshotter with `runsc checkpoint
// --leave-running`: the sentry stops its tasks, writes its kernel state and
// the pages of its memory file uncompressed into imageDir, and carries on
// (runtime-notes §1b: 29 ms small, ~0.5 s for 200 MB). Uncompressed is what
// lets restore load pages in the background.
func (r *Runtime) CheckpointRunning(ctx context.Context, id, imageDir string) error {
	start := time.Now()
	if err := r.checkpoint(ctx, id, imageDir, "--leave-running", "--compression=none"); err != nil {
		return fmt.Errorf("gvisor checkpoint --leave-running %s: %w", id, err)
	}
	// The save broke the agent's host socket; tell it to redial now
	// (agentapi.RedialSignal) rather than at its next keepalive.
	if err := r.cli.Signal(ctx, id, "USR1"); err != nil {
		return fmt.Errorf("gvisor checkpoint --leave-running %s: signal the agent: %w", id, err)
	}
	slog.Debug("gvisor: container snapshotted", "id", id, "took", time.Since(start))
	return nil
}

// RestoreFrom implements runtime.Snapshotter: `runsc restore --background`
// of another container's image into spec's new container. --background
// makes restore return once the kernel state is loaded and lets the pages
// stream into the new sandbox's memory file afterwards, so the tasks run
// before all memory is in; the image file is only read (gVisor copies the
// pages into each sandbox's own memfd: it cannot map one image into several
// sandboxes, so every fork ends up with its own copy of the touched memory).
// The spec's mount sources differ from the original's (its own root and run
// dir at the same guest paths), which restore's spec validation would
// refuse: it runs with --restore-spec-validation=warning.
func (r *Runtime) RestoreFrom(ctx context.Context, spec runtime.Spec, imageDir string) error {
	return r.restore(ctx, spec, imageDir, "--restore-spec-validation=warning", "restore", "--background", "--image-path="+imageDir)
}
