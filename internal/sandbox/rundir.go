package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cella-sandbox/cella/internal/agent"
	"github.com/cella-sandbox/cella/internal/rootfs"
)

// A sandbox's run directory (<sandbox>/run, /run/cella inside) holds the
// daemon's socket for the agent and the agent's config.json. Before a new
// container is started on it, it is made a small tmpfs of its own
// (rootfs.EnsureTmpfs): the container binds it, and a bind's root shows in
// the sandbox's /proc/self/mountinfo as its path inside its filesystem,
// which on the host's disk would be the daemon's data dir.
//
// The tmpfs goes whenever the sandbox's mounts do (an archive, a reboot),
// so the config also lives on disk as <sandbox>/agent-config.json, and
// openRunDir puts it back.

// runDirSize bounds the run tmpfs: a socket and a config file, so that a
// sandbox's root writing there (gVisor binds it read-write) fills 4 MiB of
// RAM, not the host's disk. Not smaller: with under 1 MiB free, a tmpfs
// looks like a full volume to the agent's ENOSPC check when it runs on a
// host (the agent tests do).
const runDirSize = 4 << 20

// agentConfigCopy is the config's copy next to the run dir.
const agentConfigCopy = "agent-config.json"

func runDir(sb *Sandbox) string { return filepath.Join(sb.Dir, "run") }

// openRunDir readies sb's run dir for a container about to start: a tmpfs
// (unless one is there already) holding the last config written.
func openRunDir(sb *Sandbox) (string, error) {
	dir := runDir(sb)
	config := filepath.Join(dir, agent.ConfigName)
	saved := filepath.Join(sb.Dir, agentConfigCopy)
	// A run dir from before the tmpfs (a sandbox paused by an older
	// daemon): its config is the copy.
	if _, err := os.Stat(saved); errors.Is(err, fs.ErrNotExist) {
		if err := copyFile(config, saved); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("run dir of %s: %w", sb.ID, err)
		}
	}
	if _, err := rootfs.EnsureTmpfs(dir, runDirSize, 0o700); err != nil {
		return "", fmt.Errorf("run dir of %s: %w", sb.ID, err)
	}
	if _, err := os.Stat(config); errors.Is(err, fs.ErrNotExist) {
		// A new sandbox has no copy yet: writeAgentConfig comes next.
		if err := copyFile(saved, config); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("run dir of %s: %w", sb.ID, err)
		}
	}
	return dir, nil
}

// writeAgentConfig writes the config a cold boot of sb starts from, into its
// run dir and into the copy that outlives it.
func writeAgentConfig(sb *Sandbox, cfg agent.Config) error {
	dir := runDir(sb)
	if err := agent.WriteConfig(dir, cfg); err != nil {
		return err
	}
	if err := copyFile(filepath.Join(dir, agent.ConfigName), filepath.Join(sb.Dir, agentConfigCopy)); err != nil {
		return fmt.Errorf("keep agent config: %w", err)
	}
	return nil
}

// copyFile replaces dst with a copy of src (mode 0600) atomically.
func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
