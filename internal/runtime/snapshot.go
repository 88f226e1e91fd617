package runtime

import "context"

// Snapshotter is implemented by engines that can save a running
// container's processes and memory without stopping it, and start other
// containers from that image (snapshots and fork). Runtimes without it
// snapshot files only: a sandbox made from such a snapshot boots fresh.
type Snapshotter interface {
	// CheckpointRunning saves id's processes and memory into imageDir (an
	// existing empty directory); the container keeps running.
	CheckpointRunning(ctx context.Context, id, imageDir string) error
	// RestoreFrom starts spec's container (any new ID, its own bundle and
	// a root holding the same files at the same paths) from an image made
	// by CheckpointRunning of another container. The image is only read:
	// any number of containers may be restored from it.
	RestoreFrom(ctx context.Context, spec Spec, imageDir string) error
}
