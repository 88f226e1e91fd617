// Package volume keeps named persistent volumes: directories that outlive
// the sandboxes they are mounted into, each with a hard size limit.
//
// A volume is an ext4 filesystem in a sparse image file, loop-mounted on the
// host under the data dir:
//
//	<data>/volumes/<name>/disk.img   the image (sparse: only written blocks use disk)
//	<data>/volumes/<name>/mnt/       where the image is mounted (nosuid, nodev)
//	<data>/volumes/<name>/mnt/data/  what sandboxes get (owned by uid/gid 1000)
//
// Why an image and not a quota: the limit is the filesystem's size, so a
// writer gets a real ENOSPC at the limit whatever the host filesystem is (the
// data dir lives on ext4 here, where project quotas need a feature and mount
// option the host does not have; XFS project quotas would tie cella to XFS),
// each volume is its own filesystem (no hard links or inode sharing across
// volumes or with the host), and the image survives daemon restarts and host
// reboots as one file. Sandboxes get mnt/data, a directory inside the
// filesystem: if the image is not mounted the directory does not exist and a
// sandbox start fails instead of writing to the host disk unbounded.
//
// The image is mounted once per host and bind-mounted into every sandbox
// that uses it. The image and its loop device are internal/diskimage's,
// the mechanism sandbox writable layers use too: the device goes away with
// the last mount; a mount that survives the daemon (a frozen
// sandbox's namespace) keeps its loop device, which the next daemon finds by
// its backing file and mounts again (the same superblock, never a second one
// on the same image).
package volume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/diskimage"
	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/rootfs"
	"github.com/cella-sandbox/cella/internal/store"
)

// Size bounds of a volume.
const (
	DefaultSizeBytes = 1 << 30
	MinSizeBytes     = 16 << 20
	MaxSizeBytes     = 1 << 40
)

// Owner of a new volume's data directory: the templates' default user.
const (
	ownerUID = 1000
	ownerGID = 1000
)

var nameRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`)

// ValidateName rejects names that are not [a-zA-Z0-9][a-zA-Z0-9._-]{0,62}.
func ValidateName(name string) error {
	if !nameRe.MatchString(name) {
		return errdefs.InvalidArgument("invalid volume name %q: use 1-63 letters, digits, '.', '_' and '-', starting with a letter or digit", name)
	}
	return nil
}

// Volume is a volume as the API shows it.
type Volume struct {
	Name      string
	SizeBytes int64
	CreatedAt time.Time
	UsedBytes int64 // bytes used in its filesystem, when mounted
	Mounted   bool
}

// Config configures a Manager.
type Config struct {
	DataDir string
	Store   *store.Store
	Log     *slog.Logger
}

// Manager creates, mounts and deletes the volumes of one daemon.
type Manager struct {
	cfg Config
	log *slog.Logger

	mu sync.Mutex
	// held counts sandbox creates in flight per volume: Delete refuses a
	// volume that one of them is about to mount.
	held map[string]int
}

// New opens the volume store and mounts every recorded volume; directories
// without a record (a create cut short) are removed.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	m := &Manager{cfg: cfg, log: cfg.Log, held: map[string]int{}}
	if err := os.MkdirAll(m.root(), 0o700); err != nil {
		return nil, fmt.Errorf("create volumes dir: %w", err)
	}
	if err := cfg.Store.InitVolumes(ctx); err != nil {
		return nil, err
	}
	recs, err := cfg.Store.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, v := range recs {
		known[v.Name] = true
		if err := m.mount(v.Name); err != nil {
			m.log.Error("cannot mount volume; sandboxes using it will not start", "volume", v.Name, "err", err)
		}
	}
	entries, _ := os.ReadDir(m.root())
	for _, e := range entries {
		if !known[e.Name()] {
			m.log.Warn("removing volume directory without a record", "dir", e.Name())
			_ = m.remove(e.Name())
		}
	}
	return m, nil
}

func (m *Manager) root() string                { return filepath.Join(m.cfg.DataDir, "volumes") }
func (m *Manager) dir(name string) string      { return filepath.Join(m.root(), name) }
func (m *Manager) image(name string) string    { return filepath.Join(m.dir(name), "disk.img") }
func (m *Manager) mountDir(name string) string { return filepath.Join(m.dir(name), "mnt") }

// HostPath is the host directory bind-mounted into sandboxes for name.
func (m *Manager) HostPath(name string) string { return filepath.Join(m.mountDir(name), "data") }

// Create makes a volume of sizeBytes (0: DefaultSizeBytes).
func (m *Manager) Create(ctx context.Context, name string, sizeBytes int64) (Volume, error) {
	if err := ValidateName(name); err != nil {
		return Volume{}, err
	}
	if sizeBytes == 0 {
		sizeBytes = DefaultSizeBytes
	}
	if sizeBytes < MinSizeBytes || sizeBytes > MaxSizeBytes {
		return Volume{}, errdefs.InvalidArgument("volume size %d MiB is outside %d MiB .. %d GiB", sizeBytes>>20, MinSizeBytes>>20, MaxSizeBytes>>30)
	}
	sizeBytes = (sizeBytes + 4095) &^ 4095
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.cfg.Store.GetVolume(ctx, name); err == nil {
		return Volume{}, errdefs.Conflict("volume %q already exists", name)
	} else if !errors.Is(err, store.ErrNotFound) {
		return Volume{}, err
	}
	if _, err := os.Stat(m.dir(name)); err == nil {
		_ = m.remove(name) // a leftover of a create cut short
	}
	ok := false
	defer func() {
		if !ok {
			_ = m.remove(name)
		}
	}()
	if err := os.MkdirAll(m.mountDir(name), 0o700); err != nil {
		return Volume{}, fmt.Errorf("create volume %s: %w", name, err)
	}
	if err := diskimage.Format(ctx, m.image(name), diskimage.Spec{Size: sizeBytes}); err != nil {
		return Volume{}, fmt.Errorf("create volume %s: %w", name, err)
	}
	if err := m.mount(name); err != nil {
		return Volume{}, fmt.Errorf("create volume %s: %w", name, err)
	}
	data := m.HostPath(name)
	if err := os.Mkdir(data, 0o755); err != nil {
		return Volume{}, fmt.Errorf("create volume %s: %w", name, err)
	}
	if err := os.Chown(data, ownerUID, ownerGID); err != nil {
		return Volume{}, fmt.Errorf("create volume %s: %w", name, err)
	}
	rec := store.Volume{Name: name, SizeBytes: sizeBytes, CreatedAt: time.Now().UTC()}
	if err := m.cfg.Store.PutVolume(ctx, rec); err != nil {
		return Volume{}, err
	}
	ok = true
	m.log.Info("volume created", "volume", name, "size_mib", sizeBytes>>20)
	return m.info(rec), nil
}

func (m *Manager) info(rec store.Volume) Volume {
	v := Volume{Name: rec.Name, SizeBytes: rec.SizeBytes, CreatedAt: rec.CreatedAt.UTC()}
	if m.isMounted(rec.Name) {
		v.Mounted = true
		var st unix.Statfs_t
		if err := unix.Statfs(m.mountDir(rec.Name), &st); err == nil {
			v.UsedBytes = int64(st.Blocks-st.Bfree) * st.Bsize
		}
	}
	return v
}

// Get returns one volume.
func (m *Manager) Get(ctx context.Context, name string) (Volume, error) {
	if err := ValidateName(name); err != nil {
		return Volume{}, err
	}
	rec, err := m.cfg.Store.GetVolume(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return Volume{}, errdefs.NotFound("volume %q not found", name)
	}
	if err != nil {
		return Volume{}, err
	}
	return m.info(rec), nil
}

// List returns every volume, by name.
func (m *Manager) List(ctx context.Context) ([]Volume, error) {
	recs, err := m.cfg.Store.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Volume, 0, len(recs))
	for _, r := range recs {
		out = append(out, m.info(r))
	}
	return out, nil
}

// Delete removes a volume and its data. usedBy names the sandboxes that
// mount it (it is called under the manager's lock, so a create cannot slip
// in between); a volume in use is a Conflict.
func (m *Manager) Delete(ctx context.Context, name string, usedBy func(name string) []string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.cfg.Store.GetVolume(ctx, name); errors.Is(err, store.ErrNotFound) {
		return errdefs.NotFound("volume %q not found", name)
	} else if err != nil {
		return err
	}
	if m.held[name] > 0 {
		return errdefs.Conflict("volume %q is in use: a sandbox that mounts it is being created", name)
	}
	if users := usedBy(name); len(users) > 0 {
		sort.Strings(users)
		return errdefs.Conflict("volume %q is in use by sandbox(es) %s: kill them first", name, strings.Join(users, ", "))
	}
	if err := m.cfg.Store.DeleteVolume(ctx, name); err != nil {
		return err
	}
	if err := m.remove(name); err != nil {
		return fmt.Errorf("delete volume %s: %w", name, err)
	}
	m.log.Info("volume deleted", "volume", name)
	return nil
}

// Hold checks that every named volume exists and is mounted and keeps Delete
// off them until release is called (after the sandbox is registered).
func (m *Manager) Hold(ctx context.Context, names []string) (release func(), err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, n := range names {
		if _, err := m.cfg.Store.GetVolume(ctx, n); errors.Is(err, store.ErrNotFound) {
			return nil, errdefs.InvalidArgument("volume %q does not exist (create it with: cella volume create %s)", n, n)
		} else if err != nil {
			return nil, err
		}
		if !m.isMounted(n) {
			if err := m.mount(n); err != nil {
				return nil, fmt.Errorf("volume %q is not mounted on the host: %w", n, err)
			}
		}
	}
	for _, n := range names {
		m.held[n]++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			for _, n := range names {
				if m.held[n]--; m.held[n] <= 0 {
					delete(m.held, n)
				}
			}
		})
	}, nil
}

// Close unmounts the host mounts of the volumes. Sandboxes still holding a
// volume (a frozen container kept for the next daemon) keep their own mount
// and its loop device.
func (m *Manager) Close() error {
	recs, err := m.cfg.Store.ListVolumes(context.Background())
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		if err := rootfs.Detach(m.mountDir(r.Name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) isMounted(name string) bool {
	mounts, err := rootfs.FindMounts(m.mountDir(name))
	if err != nil {
		return false
	}
	for _, mp := range mounts {
		if mp == m.mountDir(name) {
			return true
		}
	}
	return false
}

// mount loop-mounts name's image at its mount dir, reusing the loop device
// that already backs the image if there is one.
func (m *Manager) mount(name string) error {
	if m.isMounted(name) {
		return nil
	}
	img, mnt := m.image(name), m.mountDir(name)
	if _, err := os.Stat(img); err != nil {
		return fmt.Errorf("volume image: %w", err)
	}
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return err
	}
	return diskimage.Mount(img, mnt, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, "")
}

// remove unmounts and deletes a volume's directory.
func (m *Manager) remove(name string) error {
	if err := rootfs.Detach(m.mountDir(name)); err != nil {
		return err
	}
	return os.RemoveAll(m.dir(name))
}
