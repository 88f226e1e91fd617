// Package runtime is the boundary between cella and an isolation engine. A
// Runtime starts one container per sandbox from a prepared root filesystem
// with the cella agent as PID 1, and can find and remove its containers
// again after a crash. Every implementation passes runtimetest.Suite (and,
// under a daemon, daemon/conformance).
package runtime

import (
	"context"
	"errors"
	"time"
)

// Names of the runtimes cella ships.
const (
	GVisor     = "gvisor"
	Namespaces = "namespaces"
)

// ErrNotFound is returned when a container does not exist.
var ErrNotFound = errors.New("container not found")

// ErrNotSupported is returned by Checkpoint and Restore when the engine
// cannot save a container's memory (Capabilities().MemoryCheckpoint is
// false).
var ErrNotSupported = errors.New("not supported by this runtime")

// Capabilities say what an engine can do beyond running containers.
type Capabilities struct {
	// MemoryCheckpoint: Checkpoint saves a container's processes and memory
	// to disk (freeing its memory) and Restore brings them back. Without
	// it, a pause that keeps memory can only Freeze (memory stays in RAM).
	MemoryCheckpoint bool
}

// Limits are the host-side ceilings of one container. The agent enforces the
// sandbox's nominal limits inside; these are the backstop.
type Limits struct {
	CPUs        float64 // CPU quota in cores; 0 = unlimited
	MemoryBytes int64   // cgroup memory ceiling; 0 = unlimited
	Pids        int64   // cgroup pids ceiling; 0 = unlimited
}

// Mount is an extra bind mount into the container.
type Mount struct {
	Source      string
	Destination string
	ReadOnly    bool
}

// Spec describes one container to start.
type Spec struct {
	ID string // container ID, unique on the host, [a-z0-9-]
	// BundleDir is a directory owned by this container where the runtime may
	// write its OCI bundle (config.json) and logs; it exists and is empty.
	BundleDir string
	// RootFS is the container's root, already mounted (template + its own
	// copy-on-write layer). The runtime must not write the template.
	RootFS string
	// AgentBinary is the host path of the agent binary (cmd/cella-agent),
	// mounted read-only at AgentGuestPath and started as PID 1 with Args.
	AgentBinary string
	Args        []string // argv of PID 1 (Args[0] is AgentGuestPath)
	Env         []string // environment of PID 1 only
	// RunDir is the host directory mounted at agentapi.GuestRunDir inside;
	// the agent finds its config and the daemon's socket there.
	RunDir   string
	Hostname string
	Limits   Limits
	Mounts   []Mount
	// LogPath receives the container's own stdout/stderr (the agent's log).
	LogPath string
	// NetNSPath is a network namespace prepared by cella (internal/network)
	// that the container joins; its eth0 is its only way out. Empty means a
	// new namespace with loopback only: no network at all.
	NetNSPath string
	// ContainerEngine says the sandbox runs a container engine of its own
	// (the docker template): its root may make namespaces, mounts, bridges
	// and raw sockets, which gVisor serves in its sentry and netstack
	// without touching the host kernel. A runtime whose sandboxes talk to
	// the host kernel refuses it (ErrNotSupported).
	ContainerEngine bool
}

// Stats is a container's resource use and limit hits, as the host accounts
// them.
type Stats struct {
	// CPU is the CPU time the container used since it started (a restored
	// container counts from zero again).
	CPU time.Duration
	// Memory is what the container is charged, page cache included;
	// FileCache is the reclaimable file cache part of it. gVisor's guest
	// memory is shared memory: used, not cache.
	Memory, FileCache int64
	// OOMKills counts processes the host memory ceiling killed, and
	// PidsMaxHits forks the host pids ceiling refused: what tells a
	// container's death by a limit from any other.
	OOMKills, PidsMaxHits int64
}

// AgentGuestPath is where the agent binary appears inside every container.
// It kept the name of the days when the agent was cella itself: a
// checkpoint restores only onto the mounts it was saved with.
const AgentGuestPath = "/.cella/cella"

// Status is what the runtime knows of a container.
type Status string

const (
	StatusCreated Status = "created"
	StatusRunning Status = "running"
	StatusPaused  Status = "paused"
	StatusStopped Status = "stopped"
)

// Runtime drives one isolation engine.
type Runtime interface {
	// Name is GVisor or Namespaces.
	Name() string
	// Probe checks that the engine works on this host by running a trivial
	// container; it returns a clear error saying what is missing if not.
	Probe(ctx context.Context, scratchDir string) (time.Duration, error)
	// Start creates and starts a container; PID 1 runs when it returns.
	Start(ctx context.Context, spec Spec) error
	// State reports a container's status, or ErrNotFound.
	State(ctx context.Context, id string) (Status, error)
	// Destroy kills every process of the container and deletes it and its
	// host resources (cgroups, runtime state). Destroying a container that
	// does not exist is not an error.
	Destroy(ctx context.Context, id string) error
	// List returns the IDs of every container this runtime holds on the
	// host, including ones cella has no record of (after a crash).
	List(ctx context.Context) ([]string, error)
	// Stats reports a container's resource use and limit hits. They stay
	// readable after its processes died, until Destroy; a container
	// without host accounting is ErrNotFound.
	Stats(ctx context.Context, id string) (Stats, error)
	// RemoveOrphans removes host resources (cgroups) that containers left
	// behind on this host and that keep does not claim: only those no
	// container uses, whichever daemon or runtime made it. It returns the
	// container IDs whose resources it removed.
	RemoveOrphans(ctx context.Context, keep func(id string) bool) ([]string, error)

	// Capabilities reports what the engine supports on this host.
	Capabilities() Capabilities
	// Freeze stops every process of a running container in place (cgroup
	// freezer): memory stays in RAM, State reports StatusPaused.
	Freeze(ctx context.Context, id string) error
	// Thaw resumes a frozen container's processes.
	Thaw(ctx context.Context, id string) error
	// Checkpoint saves a running container's processes and memory into
	// imageDir (an existing empty directory) and removes the container and
	// its host resources as Destroy does; the root filesystem is untouched.
	// ErrNotSupported without Capabilities().MemoryCheckpoint.
	Checkpoint(ctx context.Context, id, imageDir string) error
	// Restore starts spec's container (same ID, bundle and root as the
	// checkpointed one) with its processes restored from imageDir; they go
	// on where they were. ErrNotSupported without MemoryCheckpoint.
	Restore(ctx context.Context, spec Spec, imageDir string) error
	// Close releases what the runtime holds (not the containers).
	Close() error
}
