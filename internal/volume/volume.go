// Package volume keeps named persistent volumes: directories that outlive
// the sandboxes they are mounted into, each with a hard size limit.
//
// A volume is an ext4 filesystem in a sparse image file, loop-mounted on the
// host under the data dir:
//
//	<data>/volumes/<id>/disk.img   the image (sparse: only written blocks use disk)
//	<data>/volumes/<id>/mnt/       where the image is mounted (nosuid, nodev)
//	<data>/volumes/<id>/mnt/data/  what sandboxes get (owned by uid/gid 1000)
//
// A volume belongs to a team (tenant.Owner): its name is unique within the
// team, its ID on the daemon (volumes made before teams have their name as
// ID). Every lookup is for a principal, and a volume of another team reads
// as one that does not exist.
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
	"crypto/rand"
	"encoding/hex"
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
	"github.com/cella-sandbox/cella/internal/secrets"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/tenant"
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
	ID        string
	Name      string
	Owner     tenant.Owner
	SizeBytes int64
	CreatedAt time.Time
	UsedBytes int64 // bytes used in its filesystem, when mounted
	Mounted   bool
	// Token opens its files to the standalone file API (content.go).
	Token string
}

// Config configures a Manager.
type Config struct {
	DataDir string
	Store   *store.Store
	// Box seals the volumes' content tokens in the store.
	Box *secrets.Box
	Log *slog.Logger
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
	if cfg.Box == nil {
		return nil, errors.New("volume: no box to seal content tokens")
	}
	m := &Manager{cfg: cfg, log: cfg.Log, held: map[string]int{}}
	if err := os.MkdirAll(m.root(), 0o700); err != nil {
		return nil, fmt.Errorf("create volumes dir: %w", err)
	}
	recs, err := cfg.Store.ListVolumes(ctx, "")
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, v := range recs {
		known[v.ID] = true
		if err := m.mount(v.ID); err != nil {
			m.log.Error("cannot mount volume; sandboxes using it will not start", "volume", v.Name, "id", v.ID, "team", v.TeamID, "err", err)
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

// The paths of a volume are named by its ID.
func (m *Manager) root() string              { return filepath.Join(m.cfg.DataDir, "volumes") }
func (m *Manager) dir(id string) string      { return filepath.Join(m.root(), id) }
func (m *Manager) image(id string) string    { return filepath.Join(m.dir(id), "disk.img") }
func (m *Manager) mountDir(id string) string { return filepath.Join(m.dir(id), "mnt") }

// HostPath is the host directory bind-mounted into sandboxes for the
// volume with this ID.
func (m *Manager) HostPath(id string) string { return filepath.Join(m.mountDir(id), "data") }

// newID is "vol_" and 16 hex digits: a valid volume name too, so that the
// directory of any volume, old (named by its name) or new, is a plain name.
func newID() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate volume id: %w", err)
	}
	return "vol_" + hex.EncodeToString(b), nil
}

// Create makes a volume of sizeBytes (0: DefaultSizeBytes) owned by owner.
func (m *Manager) Create(ctx context.Context, owner tenant.Owner, name string, sizeBytes int64) (Volume, error) {
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
	if _, err := m.cfg.Store.GetVolume(ctx, owner.Team, name); err == nil {
		return Volume{}, errdefs.Conflict("volume %q already exists", name)
	} else if !errors.Is(err, store.ErrNotFound) {
		return Volume{}, err
	}
	id, err := newID()
	if err != nil {
		return Volume{}, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = m.remove(id)
		}
	}()
	if err := os.MkdirAll(m.mountDir(id), 0o700); err != nil {
		return Volume{}, fmt.Errorf("create volume %s: %w", name, err)
	}
	if err := diskimage.Format(ctx, m.image(id), diskimage.Spec{Size: sizeBytes}); err != nil {
		return Volume{}, fmt.Errorf("create volume %s: %w", name, err)
	}
	if err := m.mount(id); err != nil {
		return Volume{}, fmt.Errorf("create volume %s: %w", name, err)
	}
	data := m.HostPath(id)
	if err := os.Mkdir(data, 0o755); err != nil {
		return Volume{}, fmt.Errorf("create volume %s: %w", name, err)
	}
	if err := os.Chown(data, ownerUID, ownerGID); err != nil {
		return Volume{}, fmt.Errorf("create volume %s: %w", name, err)
	}
	token, sealed, err := m.newToken(id)
	if err != nil {
		return Volume{}, err
	}
	rec := store.Volume{ID: id, Name: name, TeamID: owner.Team, KeyID: owner.Key, SizeBytes: sizeBytes, CreatedAt: time.Now().UTC(), Token: sealed}
	if err := m.cfg.Store.PutVolume(ctx, rec); err != nil {
		if errors.Is(err, store.ErrExists) {
			return Volume{}, errdefs.Conflict("volume %q already exists", name)
		}
		return Volume{}, err
	}
	ok = true
	m.log.Info("volume created", "volume", name, "id", id, "team", owner.Team, "size_mib", sizeBytes>>20)
	v := m.info(rec)
	v.Token = token
	return v, nil
}

func (m *Manager) info(rec store.Volume) Volume {
	v := Volume{ID: rec.ID, Name: rec.Name, Owner: tenant.Owner{Team: rec.TeamID, Key: rec.KeyID},
		SizeBytes: rec.SizeBytes, CreatedAt: rec.CreatedAt.UTC()}
	if m.isMounted(rec.ID) {
		v.Mounted = true
		var st unix.Statfs_t
		if err := unix.Statfs(m.mountDir(rec.ID), &st); err == nil {
			v.UsedBytes = int64(st.Blocks-st.Bfree) * st.Bsize
		}
	}
	return v
}

// lookup finds the volume p means by ref: the name of one of its team's
// volumes, else the ID of a volume p may act on. Another team's volume is
// "not found", word for word as an unknown one.
func (m *Manager) lookup(ctx context.Context, p tenant.Principal, ref string) (store.Volume, error) {
	if err := ValidateName(ref); err != nil {
		return store.Volume{}, err
	}
	rec, err := m.cfg.Store.GetVolume(ctx, p.Team, ref)
	if errors.Is(err, store.ErrNotFound) {
		rec, err = m.cfg.Store.GetVolumeByID(ctx, ref)
		if err == nil && !p.Can(tenant.Owner{Team: rec.TeamID, Key: rec.KeyID}) {
			err = store.ErrNotFound
		}
	}
	if errors.Is(err, store.ErrNotFound) {
		return store.Volume{}, errdefs.NotFound("volume %q not found", ref)
	}
	return rec, err
}

// Get returns the volume p means by ref (a name of its team, or an ID).
func (m *Manager) Get(ctx context.Context, p tenant.Principal, ref string) (Volume, error) {
	rec, err := m.lookup(ctx, p, ref)
	if err != nil {
		return Volume{}, err
	}
	v := m.info(rec)
	if v.Token, err = m.token(ctx, rec); err != nil {
		return Volume{}, err
	}
	return v, nil
}

// List returns the volumes p may see, by name (the admin's: every team's).
func (m *Manager) List(ctx context.Context, p tenant.Principal) ([]Volume, error) {
	team := p.Team
	if p.Admin {
		team = ""
	}
	recs, err := m.cfg.Store.ListVolumes(ctx, team)
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
// mount the volume with this ID (it is called under the manager's lock, so
// a create cannot slip in between); a volume in use is a Conflict.
func (m *Manager) Delete(ctx context.Context, p tenant.Principal, ref string, usedBy func(id string) []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, err := m.lookup(ctx, p, ref)
	if err != nil {
		return err
	}
	if m.held[rec.ID] > 0 {
		return errdefs.Conflict("volume %q is in use: a sandbox that mounts it is being created", ref)
	}
	if users := usedBy(rec.ID); len(users) > 0 {
		sort.Strings(users)
		return errdefs.Conflict("volume %q is in use by sandbox(es) %s: kill them first", ref, strings.Join(users, ", "))
	}
	if err := m.cfg.Store.DeleteVolume(ctx, rec.ID); err != nil {
		return err
	}
	if err := m.remove(rec.ID); err != nil {
		return fmt.Errorf("delete volume %s: %w", ref, err)
	}
	m.log.Info("volume deleted", "volume", rec.Name, "id", rec.ID, "team", rec.TeamID)
	return nil
}

// Hold resolves the volumes p names (names of its team's volumes, or IDs of
// volumes it may use), checks each is mounted, and keeps Delete off them
// until release is called (after the sandbox is registered). It returns
// their IDs in the order of refs.
func (m *Manager) Hold(ctx context.Context, p tenant.Principal, refs []string) (ids []string, release func(), err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ref := range refs {
		rec, err := m.lookup(ctx, p, ref)
		if errdefs.Is(err, errdefs.KindNotFound) {
			return nil, nil, errdefs.InvalidArgument("volume %q does not exist (create it with: cella volume create %s)", ref, ref)
		}
		if err != nil {
			return nil, nil, err
		}
		if !m.isMounted(rec.ID) {
			if err := m.mount(rec.ID); err != nil {
				return nil, nil, fmt.Errorf("volume %q is not mounted on the host: %w", ref, err)
			}
		}
		ids = append(ids, rec.ID)
	}
	for _, id := range ids {
		m.held[id]++
	}
	var once sync.Once
	return ids, func() {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			for _, id := range ids {
				if m.held[id]--; m.held[id] <= 0 {
					delete(m.held, id)
				}
			}
		})
	}, nil
}

// Close unmounts the host mounts of the volumes. Sandboxes still holding a
// volume (a frozen container kept for the next daemon) keep their own mount
// and its loop device.
func (m *Manager) Close() error {
	recs, err := m.cfg.Store.ListVolumes(context.Background(), "")
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		if err := rootfs.Detach(m.mountDir(r.ID)); err != nil {
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
