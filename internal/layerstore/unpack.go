package layerstore

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/fslock"
	"github.com/cella-sandbox/cella/internal/rootfs/layertar"
)

// Blob is a layer as a registry or an archive serves it.
type Blob struct {
	R io.Reader
	// Digest is the expected digest of R's bytes ("sha256:..."); empty
	// skips the check (the diffID is always checked).
	Digest string
	// Size is R's expected length; negative when unknown.
	Size int64
	// MediaType is informational: the compression is detected from the
	// content (gzip, zstd or a plain tar), as registries mislabel it.
	MediaType string
}

// ErrTooLarge is wrapped by Unpack's error for a layer over the size limit.
var ErrTooLarge = errors.New("layer too large")

// ErrUnsafe is wrapped by Unpack's error for a layer whose tar tries to
// write outside its own directory.
var ErrUnsafe = errors.New("unsafe layer entry")

// Whiteout names of the OCI image layer spec, and the overlayfs attribute
// of an opaque directory (layertar writes them back).
const (
	whiteoutPrefix = layertar.WhiteoutPrefix
	opaqueMarker   = layertar.OpaqueMarker
	overlayOpaque  = layertar.OverlayOpaque
)

// Unpack unpacks the layer whose uncompressed tar has digest diffID from
// b, unless it is already in the store, and returns its Info (cached says
// which). progress, if not nil, is called with the bytes of b read so far.
//
// The tar is treated as hostile. Refused, each with an error naming the
// entry (wrapping ErrUnsafe): absolute names and names or hard-link targets
// with a `..` component; any entry whose path leads through a symlink out
// of the layer (`a -> /etc`, then `a/passwd`); hard links to anything not
// in the layer itself; unknown entry types. Every file is created through
// an os.Root of the layer's directory, so the kernel-checked walk never
// leaves it whatever the tar holds. Character and block devices are not
// created (counted in Info.SkippedDevices), as rootless unpackers do: a
// sandbox gets its devices from its runtime, and its root is mounted nodev
// anyway. setuid/setgid bits are kept as the spec says (images need sudo,
// su, ping); the store is 0700, so only root on the host can reach them,
// and inside a sandbox they elevate only within it (under the namespaces
// runtime not at all: no_new_privs). Of the extended attributes only
// user.* and security.capability are kept: trusted.* is overlayfs's own
// namespace, set here only from whiteouts.
//
// A layer larger than the store's MaxLayerSize (compressed or unpacked,
// tar headers included: a decompression bomb ends there) wraps ErrTooLarge;
// a blob whose digest, size or diffID is not the expected one is refused.
// Nothing is left in the store by a failed Unpack.
func (s *Store) Unpack(ctx context.Context, diffID string, b Blob, progress func(read int64)) (info Info, cached bool, err error) {
	h, err := hexOf(diffID)
	if err != nil {
		return Info{}, false, err
	}
	if in, err := s.Info(diffID); err == nil {
		return in, true, nil
	}
	max := s.maxSize()
	if b.Size > max {
		return Info{}, false, fmt.Errorf("layer %s: blob is %d bytes, over the limit of %s: %w (raise with --max-layer-size)", diffID, b.Size, human(max), ErrTooLarge)
	}
	unlock, err := fslock.Exclusive(ctx, filepath.Join(s.tmpDir(), h+".lock"))
	if err != nil {
		return Info{}, false, fmt.Errorf("layer %s: %w", diffID, err)
	}
	defer unlock()
	// Another process may have unpacked it while we waited for the lock.
	if in, err := s.Info(diffID); err == nil {
		return in, true, nil
	}
	tmp, err := os.MkdirTemp(s.tmpDir(), h+"-")
	if err != nil {
		return Info{}, false, fmt.Errorf("layer %s: %w", diffID, err)
	}
	defer os.RemoveAll(tmp) // after a successful rename there is nothing left
	if err := os.Chmod(tmp, 0o700); err != nil {
		return Info{}, false, err
	}
	fsDir := filepath.Join(tmp, "fs")
	if err := os.Mkdir(fsDir, 0o755); err != nil {
		return Info{}, false, err
	}

	in := Info{DiffID: diffID, Digest: b.Digest, MediaType: b.MediaType, Created: time.Now().UTC().Truncate(time.Second)}
	compressed := &meter{r: b.R, h: sha256.New(), limit: max, progress: progress, what: "its blob is"}
	br := bufio.NewReaderSize(compressed, 64<<10)
	plain, closeDecomp, err := decompress(br)
	if err != nil {
		return Info{}, false, fmt.Errorf("layer %s: %w", diffID, explain(err, compressed))
	}
	defer closeDecomp()
	uncompressed := &meter{r: plain, h: sha256.New(), limit: max, what: "it unpacks to"}
	st, err := extract(ctx, tar.NewReader(uncompressed), fsDir)
	if err == nil {
		// Read what follows the tar's end marker, so that both digests
		// cover the whole blob.
		if _, err = io.Copy(io.Discard, uncompressed); err == nil {
			_, err = io.Copy(io.Discard, compressed)
		}
	}
	if err != nil {
		return Info{}, false, fmt.Errorf("layer %s: %w", diffID, explain(err, uncompressed, compressed))
	}
	if b.Size >= 0 && compressed.n != b.Size {
		return Info{}, false, fmt.Errorf("layer %s: blob is %d bytes, the manifest says %d (truncated or corrupt blob)", diffID, compressed.n, b.Size)
	}
	if got := "sha256:" + hex.EncodeToString(compressed.h.Sum(nil)); b.Digest != "" && got != b.Digest {
		return Info{}, false, fmt.Errorf("layer %s: blob has digest %s, the manifest says %s (corrupt or tampered blob)", diffID, got, b.Digest)
	}
	if got := "sha256:" + hex.EncodeToString(uncompressed.h.Sum(nil)); got != diffID {
		return Info{}, false, fmt.Errorf("layer %s: its uncompressed content has digest %s, not the diffID the image config names (corrupt or tampered layer)", diffID, got)
	}
	in.Size, in.Compressed, in.Entries, in.SkippedDevices = uncompressed.n, compressed.n, st.entries, st.devices
	meta, _ := json.MarshalIndent(in, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "layer.json"), append(meta, '\n'), 0o644); err != nil {
		return Info{}, false, fmt.Errorf("layer %s: %w", diffID, err)
	}
	// A present layer must be a complete one, after a power loss too.
	if err := syncFS(tmp); err != nil {
		return Info{}, false, fmt.Errorf("layer %s: %w", diffID, err)
	}
	if err := os.Rename(tmp, s.entryDir(h)); err != nil {
		return Info{}, false, fmt.Errorf("layer %s: install: %w", diffID, err)
	}
	return in, false, nil
}

// decompress detects gzip and zstd by their magic numbers; anything else
// is read as a plain tar.
func decompress(br *bufio.Reader) (io.Reader, func(), error) {
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("gzip: %w", err)
		}
		return zr, func() { zr.Close() }, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		// A bounded window: a crafted frame cannot make us allocate more.
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(256<<20))
		if err != nil {
			return nil, nil, fmt.Errorf("zstd: %w", err)
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}

// meter counts, hashes and bounds what is read through it.
type meter struct {
	r        io.Reader
	h        hash.Hash
	n        int64
	limit    int64
	over     bool
	progress func(int64)
	what     string // for errors: "it unpacks to"
}

func (m *meter) Read(p []byte) (int, error) {
	if m.n >= m.limit+1 {
		m.over = true
		return 0, ErrTooLarge
	}
	if rest := m.limit + 1 - m.n; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := m.r.Read(p)
	m.n += int64(n)
	m.h.Write(p[:n])
	if m.progress != nil && n > 0 {
		m.progress(m.n)
	}
	if m.n > m.limit {
		m.over = true
		return n, ErrTooLarge
	}
	return n, err
}

// explain turns a read error into one that names the limit or the
// truncation.
func explain(err error, meters ...*meter) error {
	for _, m := range meters {
		if m.over {
			return fmt.Errorf("%s more than the limit of %s (a decompression bomb? raise the limit with --max-layer-size): %w", m.what, human(m.limit), ErrTooLarge)
		}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("the blob ends early (truncated, or not a tar, gzip or zstd layer): %w", err)
	}
	return err
}

type extractStats struct{ entries, devices int }

type dirTimes struct {
	name  string
	mtime time.Time
}

// extract writes the tar's entries under dir; see Unpack for the rules.
func extract(ctx context.Context, tr *tar.Reader, dir string) (extractStats, error) {
	var st extractStats
	root, err := os.OpenRoot(dir)
	if err != nil {
		return st, err
	}
	defer root.Close()
	var dirs []dirTimes
	for {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return st, fmt.Errorf("read tar: %w", err)
		}
		st.entries++
		name, err := cleanName(hdr.Name)
		if err != nil {
			return st, fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		if err := extractOne(root, dir, name, hdr, tr, &st, &dirs); err != nil {
			return st, fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	// Directory times last, deepest first: creating children changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := root.Chtimes(dirs[i].name, dirs[i].mtime, dirs[i].mtime); err != nil {
			return st, fmt.Errorf("entry %q: times: %w", dirs[i].name, err)
		}
	}
	return st, nil
}

func extractOne(root *os.Root, dir, name string, hdr *tar.Header, r io.Reader, st *extractStats, dirs *[]dirTimes) error {
	parent, base := path.Split(name)
	parent = strings.TrimSuffix(parent, "/")
	if parent == "" {
		parent = "."
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		return whiteout(root, parent, base)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		replacedWhiteout, err := prepare(root, name, true)
		if err != nil {
			return err
		}
		if name != "." {
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return unsafeErr(err)
			}
		}
		f, err := root.Open(name)
		if err != nil {
			return unsafeErr(err)
		}
		defer f.Close()
		if err := setAttrs(f, hdr); err != nil {
			return err
		}
		if replacedWhiteout {
			// `.wh.d` then `d/`: the new d hides the lower one's contents.
			if err := unix.Fsetxattr(int(f.Fd()), overlayOpaque, []byte("y"), 0); err != nil {
				return fmt.Errorf("mark opaque: %w", err)
			}
		}
		*dirs = append(*dirs, dirTimes{name, hdr.ModTime})
	case tar.TypeReg:
		if name == "." {
			return fmt.Errorf("a file as the layer root: %w", ErrUnsafe)
		}
		if _, err := prepare(root, name, false); err != nil {
			return err
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return unsafeErr(err)
		}
		defer f.Close()
		n, err := io.Copy(f, r)
		if err != nil {
			return err
		}
		if n != hdr.Size {
			return fmt.Errorf("wrote %d of %d bytes: %w", n, hdr.Size, io.ErrUnexpectedEOF)
		}
		if err := setAttrs(f, hdr); err != nil {
			return err
		}
		ts := []unix.Timeval{unix.NsecToTimeval(hdr.ModTime.UnixNano()), unix.NsecToTimeval(hdr.ModTime.UnixNano())}
		if err := unix.Futimes(int(f.Fd()), ts); err != nil {
			return fmt.Errorf("times: %w", err)
		}
	case tar.TypeSymlink:
		if name == "." || hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
			return fmt.Errorf("invalid symlink to %q: %w", hdr.Linkname, ErrUnsafe)
		}
		if _, err := prepare(root, name, false); err != nil {
			return err
		}
		// The target is stored, never followed here.
		if err := root.Symlink(hdr.Linkname, name); err != nil {
			return unsafeErr(err)
		}
		if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("owner: %w", err)
		}
		return atParent(root, parent, func(fd int) error {
			ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
			return unix.UtimesNanoAt(fd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
		})
	case tar.TypeLink:
		target, err := cleanName(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
		}
		if name == "." || target == "." {
			return fmt.Errorf("hard link to %q: %w", hdr.Linkname, ErrUnsafe)
		}
		if _, err := root.Lstat(target); err != nil {
			return fmt.Errorf("hard link to %q: the target is not in this layer (%v): %w", hdr.Linkname, err, ErrUnsafe)
		}
		if _, err := prepare(root, name, false); err != nil {
			return err
		}
		// os.Root.Link links a symlink itself, never its target.
		if err := root.Link(target, name); err != nil {
			return fmt.Errorf("hard link to %q: %w", hdr.Linkname, unsafeErr(err))
		}
	case tar.TypeFifo:
		if _, err := prepare(root, name, false); err != nil {
			return err
		}
		return atParent(root, parent, func(fd int) error {
			if err := unix.Mknodat(fd, base, unix.S_IFIFO|uint32(hdr.Mode&0o7777), 0); err != nil {
				return err
			}
			return unix.Fchownat(fd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW)
		})
	case tar.TypeChar, tar.TypeBlock:
		st.devices++ // see Unpack: devices come from the runtime
	case tar.TypeXGlobalHeader:
	default:
		return fmt.Errorf("unsupported tar entry type %q: %w", hdr.Typeflag, ErrUnsafe)
	}
	return nil
}

// whiteout applies `.wh.NAME` (NAME is deleted from the layers below) and
// `.wh..wh..opq` (the directory hides the layers below) in overlay form.
func whiteout(root *os.Root, parent, base string) error {
	if base == opaqueMarker {
		if err := root.MkdirAll(parent, 0o755); err != nil {
			return unsafeErr(err)
		}
		f, err := root.Open(parent)
		if err != nil {
			return unsafeErr(err)
		}
		defer f.Close()
		if err := unix.Fsetxattr(int(f.Fd()), overlayOpaque, []byte("y"), 0); err != nil {
			return fmt.Errorf("mark opaque: %w", err)
		}
		return nil
	}
	victim := strings.TrimPrefix(base, whiteoutPrefix)
	if victim == "" || victim == "." || victim == ".." || strings.HasPrefix(victim, whiteoutPrefix) {
		return nil // aufs metadata (.wh..wh.plnk ...): nothing for overlay
	}
	// A whiteout only hides what lies below: an entry this layer itself
	// holds stays.
	if _, err := root.Lstat(path.Join(parent, victim)); err == nil {
		return nil
	}
	if err := root.MkdirAll(parent, 0o755); err != nil {
		return unsafeErr(err)
	}
	return atParent(root, parent, func(fd int) error {
		return unix.Mknodat(fd, victim, unix.S_IFCHR, 0)
	})
}

// prepare makes room for a new entry at name: its parent exists, and
// whatever was there is removed unless both are directories. It reports
// whether the entry replaced an overlay whiteout.
func prepare(root *os.Root, name string, isDir bool) (replacedWhiteout bool, err error) {
	if name == "." {
		return false, nil
	}
	fi, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
			return false, unsafeErr(err)
		}
		return false, nil
	}
	if err != nil {
		return false, unsafeErr(err)
	}
	if fi.IsDir() && isDir {
		return false, nil
	}
	replacedWhiteout = isWhiteout(fi)
	if err := root.RemoveAll(name); err != nil {
		return false, unsafeErr(err)
	}
	return replacedWhiteout, nil
}

func isWhiteout(fi fs.FileInfo) bool { return layertar.IsWhiteout(fi) }

// setAttrs gives an opened file or directory the entry's owner, mode
// (setuid/setgid/sticky included: chown first, it clears them) and kept
// extended attributes.
func setAttrs(f *os.File, hdr *tar.Header) error {
	fd := int(f.Fd())
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("owner: %w", err)
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		return fmt.Errorf("mode: %w", err)
	}
	for k, v := range hdr.PAXRecords {
		attr, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok || !keepXattr(attr) {
			continue
		}
		if err := unix.Fsetxattr(fd, attr, []byte(v), 0); err != nil {
			return fmt.Errorf("xattr %s: %w", attr, err)
		}
	}
	return nil
}

func keepXattr(name string) bool {
	return strings.HasPrefix(name, "user.") || name == "security.capability"
}

// atParent runs fn with a descriptor of dir (inside root), for the *at
// syscalls os.Root has no method for.
func atParent(root *os.Root, dir string, fn func(fd int) error) error {
	f, err := root.Open(dir)
	if err != nil {
		return unsafeErr(err)
	}
	defer f.Close()
	return fn(int(f.Fd()))
}

// cleanName checks a tar entry's name (or hard-link target) and returns it
// relative to the layer root ("." for the root itself).
func cleanName(n string) (string, error) {
	switch {
	case n == "":
		return "", fmt.Errorf("empty name: %w", ErrUnsafe)
	case strings.HasPrefix(n, "/"):
		return "", fmt.Errorf("absolute name: %w", ErrUnsafe)
	case strings.ContainsRune(n, 0):
		return "", fmt.Errorf("NUL in name: %w", ErrUnsafe)
	}
	for _, p := range strings.Split(n, "/") {
		if p == ".." {
			return "", fmt.Errorf("'..' in name: %w", ErrUnsafe)
		}
	}
	return path.Clean(n), nil
}

// unsafeErr marks an os.Root refusal (a path escaping the layer through a
// symlink) as ErrUnsafe.
func unsafeErr(err error) error {
	if err == nil {
		return nil
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes") {
		return fmt.Errorf("%w: the path leads out of the layer through a symlink: %w", err, ErrUnsafe)
	}
	return err
}

func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func human(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
