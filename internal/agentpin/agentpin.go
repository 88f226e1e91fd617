// Package agentpin keeps the agent binaries sandboxes run on the host, each
// named by its SHA-256, so that a sandbox always runs the very file it was
// booted with: a checkpoint restores only with the agent binary whose pages
// it was saved with (gVisor pages the restored agent's code in again from
// the file), whatever agent the daemon carries by then.
//
// Each binary is kept twice under the daemon's data dir:
//
//   - <data>/agent-binaries/<sha256>, on the data dir's disk: what survives a
//     daemon stop and a host reboot (a checkpoint does too);
//   - <data>/agent/<sha256>, on a tmpfs of the daemon's own
//     (rootfs.EnsureTmpfs), mode 0555 and immutable: what sandboxes bind
//     read-only at runtime.AgentGuestPath. A bind of a tmpfs file shows in
//     the sandbox's mountinfo as "/<sha256>", where one from the disk would
//     show the data dir's path; and every sandbox running that agent reads
//     the same file's pages.
//
// The tmpfs copy is made from the disk copy when a sandbox needs it (the
// daemon's tmpfs is a new one after each stop), checked against its name.
package agentpin

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/rootfs"
)

const (
	memDirName  = "agent"          // the tmpfs sandboxes bind from
	diskDirName = "agent-binaries" // the copies that outlive it
	// tmpfsSize bounds the tmpfs (it holds only what sandboxes use: a
	// few agents of 10 MB).
	tmpfsSize = 512 << 20
)

// Store is the agent binaries of one data dir.
type Store struct {
	mem, disk string

	// mu serializes the changes of both directories.
	mu sync.Mutex
}

// Open mounts (or finds) the data dir's agent tmpfs and makes the disk
// directory.
func Open(dataDir string) (*Store, error) {
	s := &Store{mem: filepath.Join(dataDir, memDirName), disk: filepath.Join(dataDir, diskDirName)}
	if err := os.MkdirAll(s.disk, 0o700); err != nil {
		return nil, fmt.Errorf("agent binaries: %w", err)
	}
	if _, err := rootfs.EnsureTmpfs(s.mem, tmpfsSize, 0o755); err != nil {
		return nil, fmt.Errorf("agent binaries: %w", err)
	}
	return s, nil
}

// Close detaches the tmpfs. Lazily: the containers still running (a
// frozen one, or any after a crash) keep their binds as they are.
func (s *Store) Close() error { return rootfs.Detach(s.mem) }

// Add stores bin unless a binary of its hash is there already, and returns
// the hash.
func (s *Store) Add(bin []byte) (string, error) {
	sum := sha256.Sum256(bin)
	hash := hex.EncodeToString(sum[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := os.Stat(filepath.Join(s.disk, hash)); err == nil {
		return hash, nil
	}
	if err := writeFile(s.disk, hash, func(w io.Writer) error { _, err := w.Write(bin); return err }, true); err != nil {
		return "", fmt.Errorf("store agent binary %s: %w", short(hash), err)
	}
	return hash, nil
}

// Path is the tmpfs file a sandbox running the agent of hash binds, made
// from the disk copy if the tmpfs does not hold it yet.
func (s *Store) Path(hash string) (string, error) {
	if !validHash(hash) {
		return "", fmt.Errorf("agent binary %q: not a sha256", hash)
	}
	p := filepath.Join(s.mem, hash)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := os.Stat(p); err == nil {
		// Immutable already, unless a daemon died between its write and
		// the flag (its tmpfs outlives it).
		return p, immutable(p)
	}
	in, err := os.Open(filepath.Join(s.disk, hash))
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("agent binary %s is not on this host (removed from %s)", short(hash), s.disk)
	}
	if err != nil {
		return "", fmt.Errorf("agent binary %s: %w", short(hash), err)
	}
	defer in.Close()
	copyChecked := func(w io.Writer) error {
		h := sha256.New()
		if _, err := io.Copy(io.MultiWriter(w, h), in); err != nil {
			return err
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != hash {
			return fmt.Errorf("the copy on disk has the sha256 %s: it was altered", short(got))
		}
		return nil
	}
	if err := writeFile(s.mem, hash, copyChecked, false); err != nil {
		return "", fmt.Errorf("agent binary %s: %w", short(hash), err)
	}
	if err := immutable(p); err != nil {
		_ = os.Remove(p)
		return "", err
	}
	return p, nil
}

// immutable sets FS_IMMUTABLE_FL on a tmpfs copy; a kernel whose tmpfs
// lacks the flag (before Linux 6.0) leaves the read-only binds and mode
// 0555 to keep it.
func immutable(p string) error {
	if err := setImmutable(p, true); err != nil && !errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("agent binary %s: make it immutable: %w", filepath.Base(p), err)
	}
	return nil
}

// Prune removes the binaries (both copies) whose hash keep does not hold,
// and anything else there (an interrupted write's file, the single "cella"
// of daemons before binaries were named by hash: running containers keep
// their binds of it); it returns the hashes removed.
func (s *Store) Prune(keep map[string]bool) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var removed []string
	var errs []error
	for _, dir := range []string{s.mem, s.disk} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range entries {
			name := e.Name()
			if keep[name] {
				continue
			}
			p := filepath.Join(dir, name)
			if dir == s.mem {
				_ = setImmutable(p, false)
			}
			if err := os.Remove(p); err != nil {
				errs = append(errs, err)
				continue
			}
			if validHash(name) && dir == s.disk {
				removed = append(removed, name)
			}
		}
	}
	return removed, errors.Join(errs...)
}

// Hashes lists the binaries stored on disk.
func (s *Store) Hashes() ([]string, error) {
	entries, err := os.ReadDir(s.disk)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if validHash(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// writeFile writes name in dir through a temporary file renamed into
// place, read-only and executable; durable syncs it first.
func writeFile(dir, name string, fill func(io.Writer) error, durable bool) error {
	tmp, err := os.CreateTemp(dir, name+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename: ENOENT
	err = fill(tmp)
	if err == nil {
		err = tmp.Chmod(0o555)
	}
	if err == nil && durable {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, name))
	}
	return err
}

// setImmutable sets or clears FS_IMMUTABLE_FL (tmpfs has it since Linux
// 6.0): not even the host's root can then write, truncate, rename or
// remove the file without clearing the flag first. The sandboxes' binds are
// read-only already; this keeps the one file they share intact against any
// writer at all.
func setImmutable(path string, on bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		return err
	}
	if on {
		flags |= fsImmutableFL
	} else {
		flags &^= fsImmutableFL
	}
	return unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, int(flags))
}

// fsImmutableFL is FS_IMMUTABLE_FL of linux/fs.h (not in x/sys/unix).
const fsImmutableFL = 0x00000010

func validHash(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

func short(hash string) string { return hash[:min(len(hash), 12)] }
