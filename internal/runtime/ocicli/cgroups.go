package ocicli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/cella-sandbox/cella/internal/cgroup"
	"github.com/cella-sandbox/cella/internal/runtime"
)

// Both runtimes put every container's cgroups at /cella/<id> (oci.Build's
// cgroupsPath), so what the host accounts of a container, and what a
// container left behind there, is read and removed the same way.

// Stats implements runtime.Runtime.Stats from container id's cgroups: v1,
// else a unified (v2) cgroup.
func Stats(id string) (runtime.Stats, error) {
	u, err := cgroup.ReadUsage(id)
	if errors.Is(err, fs.ErrNotExist) {
		return runtime.Stats{}, fmt.Errorf("stats of %s: %w (%v)", id, runtime.ErrNotFound, err)
	}
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("stats of %s: %w", id, err)
	}
	return runtime.Stats{CPU: u.CPU, Memory: u.Memory, FileCache: u.FileCache, OOMKills: u.OOMKills, PidsMaxHits: u.PidsMaxHits}, nil
}

// OrphanMinAge is how old an empty cgroup must be before RemoveOrphans
// takes it for a leftover: a younger one may be another daemon's
// container (or probe) being created, its first process not in yet.
const OrphanMinAge = 2 * time.Minute

// RemoveOrphans implements runtime.Runtime.RemoveOrphans: the cgroups under
// /cella that keep does not claim, that hold no process and are older than
// OrphanMinAge (runsc leaves empty ones after a failed boot; a daemon that
// crashed leaves its containers').
func RemoveOrphans(ctx context.Context, keep func(id string) bool) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	removed, err := cgroup.RemoveOrphans(keep, OrphanMinAge)
	if err != nil {
		return removed, fmt.Errorf("remove orphan cgroups: %w", err)
	}
	return removed, nil
}
