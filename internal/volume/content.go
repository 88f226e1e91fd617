package volume

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cella-sandbox/cella/internal/errdefs"
	"github.com/cella-sandbox/cella/internal/store"
	"github.com/cella-sandbox/cella/internal/tenant"
)

// The standalone file API (E2B's /volumecontent/{id}/*) works on a volume's
// data directory from the host, with no sandbox. What a sandbox wrote there
// is untrusted: symlinks that point out of the volume (absolute, or up
// through ".."), FIFOs, paths swapped between two calls. Every access goes
// through an os.Root opened on the data directory, which resolves each path
// component inside that directory (openat with O_NOFOLLOW, symlinks
// followed only while they stay inside) and fails rather than leave it,
// whatever a sandbox does meanwhile; and the volume is its own ext4
// filesystem, so no hard link inside it can name a host file. Files are
// opened non-blocking and must be regular, so a FIFO cannot stall the
// daemon.

// Limits of the file API.
const (
	// MaxListEntries bounds one list answer.
	MaxListEntries = 10000
	// MaxListDepth bounds a list's depth.
	MaxListDepth = 64
)

// newToken is a content token for the volume with this ID: 32 random
// bytes, URL-safe base64; and the same sealed under the master key (bound
// to the volume's ID) as the store keeps it.
func (m *Manager) newToken(id string) (token, sealed string, err error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("generate volume token: %w", err)
	}
	token = "vtok_" + base64.RawURLEncoding.EncodeToString(b)
	ct, err := m.cfg.Box.Seal(tokenName(id), []byte(token))
	if err != nil {
		return "", "", fmt.Errorf("seal volume token: %w", err)
	}
	return token, base64.StdEncoding.EncodeToString(ct), nil
}

// tokenName binds a sealed token to its volume (no secret's name has a
// '/').
func tokenName(id string) string { return "volume-token/" + id }

// openToken is the token a record keeps sealed.
func (m *Manager) openToken(rec store.Volume) (string, error) {
	ct, err := base64.StdEncoding.DecodeString(rec.Token)
	if err != nil {
		return "", fmt.Errorf("volume %s: stored token: %w", rec.ID, err)
	}
	t, err := m.cfg.Box.Open(tokenName(rec.ID), ct)
	if err != nil {
		return "", fmt.Errorf("volume %s: stored token: %w", rec.ID, err)
	}
	return string(t), nil
}

// token returns rec's content token, giving it one first if it has none
// (a volume made before tokens).
func (m *Manager) token(ctx context.Context, rec store.Volume) (string, error) {
	if rec.Token == "" {
		_, sealed, err := m.newToken(rec.ID)
		if err != nil {
			return "", err
		}
		if rec.Token, err = m.cfg.Store.EnsureVolumeToken(ctx, rec.ID, sealed); err != nil {
			return "", err
		}
	}
	return m.openToken(rec)
}

// Token returns the content token of the volume p means by ref.
func (m *Manager) Token(ctx context.Context, p tenant.Principal, ref string) (string, error) {
	rec, err := m.lookup(ctx, p, ref)
	if err != nil {
		return "", err
	}
	return m.token(ctx, rec)
}

// errNoAccess is the one answer for a volume that does not exist and for a
// token or key that does not open it, so that neither tells which IDs exist.
func errNoAccess(id string) error {
	return errdefs.NotFound("volume %q not found, or the token does not open it", id)
}

// OpenContent opens the file tree of the volume with this ID for a bearer
// of its content token, or for a principal (an API key) that may act on
// it (p nil: token only). The caller closes it.
func (m *Manager) OpenContent(ctx context.Context, id, token string, p *tenant.Principal) (*Content, error) {
	if ValidateName(id) != nil {
		return nil, errNoAccess(id)
	}
	rec, err := m.cfg.Store.GetVolumeByID(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errNoAccess(id)
	}
	if err != nil {
		return nil, err
	}
	tokenOK := false
	if rec.Token != "" {
		want, err := m.openToken(rec)
		if err != nil {
			return nil, err
		}
		tokenOK = subtle.ConstantTimeCompare([]byte(want), []byte(token)) == 1
	}
	keyOK := p != nil && p.Can(tenant.Owner{Team: rec.TeamID, Key: rec.KeyID})
	if !tokenOK && !keyOK {
		return nil, errNoAccess(id)
	}
	if !m.isMounted(rec.ID) {
		if err := m.mount(rec.ID); err != nil {
			return nil, errdefs.Unavailable("volume %q is not mounted on the host: %v", rec.Name, err)
		}
	}
	root, err := os.OpenRoot(m.HostPath(rec.ID))
	if err != nil {
		return nil, fmt.Errorf("open volume %s: %w", rec.Name, err)
	}
	return &Content{root: root, name: rec.Name, size: rec.SizeBytes}, nil
}

// Content is one volume's file tree, seen from the host.
type Content struct {
	root *os.Root
	name string
	size int64
}

// Close releases the tree.
func (c *Content) Close() error { return c.root.Close() }

// Entry is a file, directory or symlink of a volume (E2B's VolumeEntryStat).
type Entry struct {
	Name   string
	Path   string // absolute within the volume: "/dir/file"
	Type   string // "file", "directory", "symlink" or "unknown"
	Size   int64
	Mode   uint32 // permission bits (and sticky/setuid/setgid), not the type
	UID    uint32
	GID    uint32
	Atime  time.Time
	Mtime  time.Time
	Ctime  time.Time
	Target string // a symlink's target, as stored
}

// Attrs are the owner and mode a write or an update sets; nil fields keep
// (or, for a new entry, default to the volume owner's 1000:1000 and 0644 /
// 0755).
type Attrs struct {
	UID, GID, Mode *uint32
}

// validate refuses modes beyond permission bits and setuid/setgid: the
// API is no way to plant a set-ID program for a sandbox's user.
func (a Attrs) validate() error {
	if a.Mode != nil && *a.Mode&^0o1777 != 0 {
		return errdefs.InvalidArgument("mode %#o: only permission bits and the sticky bit (at most 01777) can be set through the volume API", *a.Mode)
	}
	for _, id := range []*uint32{a.UID, a.GID} {
		if id != nil && *id == ^uint32(0) {
			return errdefs.InvalidArgument("uid/gid 4294967295 is not a valid owner")
		}
	}
	return nil
}

// clean turns an API path ("/a/b", "a/b", "/") into the volume-absolute
// path the answers show and the root-relative name os.Root takes.
func clean(p string) (abs, rel string, err error) {
	if p == "" || strings.ContainsRune(p, 0) {
		return "", "", errdefs.InvalidArgument("path %q: give a non-empty path without NUL bytes", p)
	}
	abs = path.Clean("/" + p)
	rel = strings.TrimPrefix(abs, "/")
	if rel == "" {
		rel = "."
	}
	return abs, rel, nil
}

// fsErr maps a file system error on p to the API's kinds.
func (c *Content) fsErr(op, p string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.NotFound("path %s not found in volume %q", p, c.name)
	case errors.Is(err, fs.ErrExist):
		return errdefs.Conflict("path %s already exists in volume %q", p, c.name)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return errdefs.ResourceExhausted("volume %q is full (%d MiB): remove files or use a larger volume", c.name, c.size>>20)
	case errors.Is(err, syscall.ENOTDIR):
		return errdefs.InvalidArgument("%s %s: a path component is not a directory", op, p)
	case errors.Is(err, syscall.EISDIR):
		return errdefs.InvalidArgument("%s %s: is a directory", op, p)
	case errors.Is(err, syscall.ENOTEMPTY):
		return errdefs.Conflict("%s %s: directory not empty", op, p)
	case errors.Is(err, syscall.ELOOP), strings.Contains(err.Error(), "escapes from parent"):
		// A symlink that leads out of the volume (or loops): refused,
		// never followed.
		return errdefs.Forbidden("%s %s: the path leads out of volume %q through a symlink", op, p, c.name)
	case errors.Is(err, fs.ErrPermission):
		return errdefs.Forbidden("%s %s: permission denied", op, p)
	}
	return fmt.Errorf("%s %s in volume %s: %w", op, p, c.name, err)
}

func entryOf(abs string, fi fs.FileInfo, target string) Entry {
	e := Entry{Name: path.Base(abs), Path: abs, Size: fi.Size(), Mtime: fi.ModTime().UTC(), Target: target}
	if abs == "/" {
		e.Name = "/"
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		e.Type = "file"
	case m.IsDir():
		e.Type = "directory"
	case m&fs.ModeSymlink != 0:
		e.Type = "symlink"
	default:
		e.Type = "unknown"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Mode = st.Mode & 0o7777
		e.UID, e.GID = st.Uid, st.Gid
		e.Atime = time.Unix(st.Atim.Sec, st.Atim.Nsec).UTC()
		e.Ctime = time.Unix(st.Ctim.Sec, st.Ctim.Nsec).UTC()
	}
	return e
}

// stat describes the entry at rel itself (a symlink is not followed).
func (c *Content) stat(abs, rel string) (Entry, error) {
	fi, err := c.root.Lstat(rel)
	if err != nil {
		return Entry{}, c.fsErr("stat", abs, err)
	}
	target := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, _ = c.root.Readlink(rel)
	}
	return entryOf(abs, fi, target), nil
}

// Stat describes the entry at p.
func (c *Content) Stat(p string) (Entry, error) {
	abs, rel, err := clean(p)
	if err != nil {
		return Entry{}, err
	}
	return c.stat(abs, rel)
}

// List returns the entries under the directory p, depth levels deep
// (0: 1), directories before their contents, each level by name.
func (c *Content) List(p string, depth int) ([]Entry, error) {
	abs, rel, err := clean(p)
	if err != nil {
		return nil, err
	}
	if depth <= 0 {
		depth = 1
	}
	if depth > MaxListDepth {
		return nil, errdefs.InvalidArgument("depth %d is over the limit of %d", depth, MaxListDepth)
	}
	fi, err := c.root.Stat(rel)
	if err != nil {
		return nil, c.fsErr("list", abs, err)
	}
	if !fi.IsDir() {
		return nil, errdefs.InvalidArgument("list %s: not a directory", abs)
	}
	out := []Entry{}
	var walk func(abs, rel string, level int) error
	walk = func(abs, rel string, level int) error {
		f, err := c.root.Open(rel)
		if err != nil {
			return c.fsErr("list", abs, err)
		}
		// At most what the answer may still hold, plus one to tell that
		// there is more: a sandbox may fill a directory with millions.
		names, err := f.Readdirnames(MaxListEntries - len(out) + 1)
		f.Close()
		if err != nil && !errors.Is(err, io.EOF) {
			return c.fsErr("list", abs, err)
		}
		if len(out)+len(names) > MaxListEntries {
			return errdefs.ResourceExhausted("list %s: more than %d entries; list a subdirectory or a smaller depth", p, MaxListEntries)
		}
		slices.Sort(names)
		for _, n := range names {
			cabs, crel := path.Join(abs, n), path.Join(rel, n)
			e, err := c.stat(cabs, crel)
			if errdefs.Is(err, errdefs.KindNotFound) {
				continue // removed meanwhile
			}
			if err != nil {
				return err
			}
			out = append(out, e)
			if e.Type == "directory" && level < depth {
				if err := walk(cabs, crel, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(abs, rel, 1); err != nil {
		return nil, err
	}
	return out, nil
}

// setAttrs applies a to the entry at rel (new: fill in the defaults).
// Owners are set without following a final symlink.
func (c *Content) setAttrs(abs, rel string, a Attrs, isDir, created bool) error {
	uid, gid := -1, -1
	if a.UID != nil {
		uid = int(*a.UID)
	} else if created {
		uid = ownerUID
	}
	if a.GID != nil {
		gid = int(*a.GID)
	} else if created {
		gid = ownerGID
	}
	if uid != -1 || gid != -1 {
		if err := c.root.Lchown(rel, uid, gid); err != nil {
			return c.fsErr("chown", abs, err)
		}
	}
	mode := a.Mode
	if mode == nil && created {
		m := uint32(0o644)
		if isDir {
			m = 0o755
		}
		mode = &m
	}
	if mode != nil {
		fi, err := c.root.Lstat(rel)
		if err != nil {
			return c.fsErr("chmod", abs, err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return nil // Linux has no mode for a symlink
		}
		// After a chown, which clears set-ID bits anyway.
		if err := c.root.Chmod(rel, fs.FileMode(*mode&0o777)|stickyOf(*mode)); err != nil {
			return c.fsErr("chmod", abs, err)
		}
	}
	return nil
}

func stickyOf(m uint32) fs.FileMode {
	if m&0o1000 != 0 {
		return fs.ModeSticky
	}
	return 0
}

// MakeDir creates the directory p (force: with its missing parents, and no
// error if it exists).
func (c *Content) MakeDir(p string, a Attrs, force bool) (Entry, error) {
	abs, rel, err := clean(p)
	if err != nil {
		return Entry{}, err
	}
	if err := a.validate(); err != nil {
		return Entry{}, err
	}
	if rel == "." {
		return Entry{}, errdefs.Conflict("path / already exists in volume %q", c.name)
	}
	if force {
		if err := c.mkdirParents(path.Dir(abs)); err != nil {
			return Entry{}, err
		}
	}
	created := true
	if err := c.root.Mkdir(rel, 0o700); err != nil {
		if !force || !errors.Is(err, fs.ErrExist) {
			return Entry{}, c.fsErr("make directory", abs, err)
		}
		created = false
	}
	if err := c.setAttrs(abs, rel, a, true, created); err != nil {
		return Entry{}, err
	}
	return c.stat(abs, rel)
}

// mkdirParents creates the directories on the way to abs that are missing,
// each owned by the volume owner.
func (c *Content) mkdirParents(abs string) error {
	if abs == "/" {
		return nil
	}
	rel := strings.TrimPrefix(abs, "/")
	if fi, err := c.root.Stat(rel); err == nil {
		if !fi.IsDir() {
			return errdefs.InvalidArgument("%s is not a directory", abs)
		}
		return nil
	}
	if err := c.mkdirParents(path.Dir(abs)); err != nil {
		return err
	}
	if err := c.root.Mkdir(rel, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return c.fsErr("make directory", abs, err)
	}
	return c.setAttrs(abs, rel, Attrs{}, true, true)
}

// WriteFile writes r to the file p. An existing file is overwritten only
// with force, which also creates missing parent directories.
func (c *Content) WriteFile(p string, r io.Reader, a Attrs, force bool) (Entry, error) {
	abs, rel, err := clean(p)
	if err != nil {
		return Entry{}, err
	}
	if err := a.validate(); err != nil {
		return Entry{}, err
	}
	if rel == "." {
		return Entry{}, errdefs.InvalidArgument("write /: is a directory")
	}
	if force {
		if err := c.mkdirParents(path.Dir(abs)); err != nil {
			return Entry{}, err
		}
	}
	_, existed := c.root.Lstat(rel)
	flags := os.O_WRONLY | os.O_CREATE | syscall.O_NONBLOCK
	if !force {
		flags |= os.O_EXCL
	}
	f, err := c.root.OpenFile(rel, flags, 0o600)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return Entry{}, errdefs.Conflict("path %s already exists in volume %q: write with force: true to overwrite it", abs, c.name)
		}
		return Entry{}, c.fsErr("write", abs, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Entry{}, c.fsErr("write", abs, err)
	}
	if !fi.Mode().IsRegular() {
		return Entry{}, errdefs.InvalidArgument("write %s: not a regular file", abs)
	}
	if err := f.Truncate(0); err != nil {
		return Entry{}, c.fsErr("write", abs, err)
	}
	if _, err := io.Copy(f, r); err != nil {
		return Entry{}, c.fsErr("write", abs, err)
	}
	if err := f.Close(); err != nil {
		return Entry{}, c.fsErr("write", abs, err)
	}
	if err := c.setAttrs(abs, rel, a, false, existed != nil); err != nil {
		return Entry{}, err
	}
	return c.stat(abs, rel)
}

// Open opens the regular file p for reading; the caller closes it.
func (c *Content) Open(p string) (*os.File, Entry, error) {
	abs, rel, err := clean(p)
	if err != nil {
		return nil, Entry{}, err
	}
	f, err := c.root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, Entry{}, c.fsErr("read", abs, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, Entry{}, c.fsErr("read", abs, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		if fi.IsDir() {
			return nil, Entry{}, errdefs.InvalidArgument("read %s: is a directory (list it instead)", abs)
		}
		return nil, Entry{}, errdefs.InvalidArgument("read %s: not a regular file", abs)
	}
	return f, entryOf(abs, fi, ""), nil
}

// Remove removes p, a directory with everything in it. A symlink is
// removed, not what it points to.
func (c *Content) Remove(p string) error {
	abs, rel, err := clean(p)
	if err != nil {
		return err
	}
	if rel == "." {
		return errdefs.InvalidArgument("remove /: the volume's root cannot be removed (delete the volume instead)")
	}
	if _, err := c.root.Lstat(rel); err != nil {
		return c.fsErr("remove", abs, err)
	}
	if err := c.root.RemoveAll(rel); err != nil {
		return c.fsErr("remove", abs, err)
	}
	return nil
}

// SetAttrs changes the owner and mode of p.
func (c *Content) SetAttrs(p string, a Attrs) (Entry, error) {
	abs, rel, err := clean(p)
	if err != nil {
		return Entry{}, err
	}
	if err := a.validate(); err != nil {
		return Entry{}, err
	}
	fi, err := c.root.Lstat(rel)
	if err != nil {
		return Entry{}, c.fsErr("update", abs, err)
	}
	if err := c.setAttrs(abs, rel, a, fi.IsDir(), false); err != nil {
		return Entry{}, err
	}
	return c.stat(abs, rel)
}
