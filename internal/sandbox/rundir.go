package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/rootfs"
)

// A sandbox's run directory (<sandbox>/run, /run/cella inside, read-only)
// holds the daemon's socket for the agent and, only between a cold boot's
// start and the agent's hello, the agent's config.json (agentchannel.go).
// Before a new container is started on it, it is made a small tmpfs of its
// own (rootfs.EnsureTmpfs): the container binds it, and a bind's root shows
// in the sandbox's /proc/self/mountinfo as its path inside its filesystem,
// which on the host's disk would be the daemon's data dir. The tmpfs goes
// whenever the sandbox's mounts do (an archive, a reboot); the config that
// outlives it is the host-only <sandbox>/agent-config.json.

// runDirSize bounds the run tmpfs: a socket and a config file. Not smaller:
// with under 1 MiB free, a tmpfs looks like a full volume to the agent's
// ENOSPC check when it runs on a host (the agent tests do).
const runDirSize = 4 << 20

func runDir(sb *Sandbox) string { return filepath.Join(sb.Dir, "run") }

// openRunDir readies sb's run dir for a container about to start: a tmpfs
// (unless one is there already). A run dir from before the tmpfs and the
// host-only copy (a sandbox paused by an older daemon) may hold the only
// config the sandbox has: it becomes the copy before the tmpfs covers it.
func (m *Manager) openRunDir(sb *Sandbox) (string, error) {
	dir := runDir(sb)
	if _, err := os.Stat(filepath.Join(sb.Dir, savedConfigName)); errors.Is(err, fs.ErrNotExist) {
		if cfg, err := agentapi.ReadConfig(dir); err == nil {
			if err := m.writeAgentConfig(sb, cfg, false); err != nil {
				return "", fmt.Errorf("run dir of %s: %w", sb.ID, err)
			}
		}
	}
	if _, err := rootfs.EnsureTmpfs(dir, runDirSize, 0o700); err != nil {
		return "", fmt.Errorf("run dir of %s: %w", sb.ID, err)
	}
	return dir, nil
}
