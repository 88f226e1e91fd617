package rootfs

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/diskimage"
)

// Mount options of a layer's filesystem. noinit_itable: its inode tables
// were left unzeroed by a lazy mkfs (diskimage.Spec.Lazy) and need not be
// zeroed in the background either.
const (
	layerMountFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOATIME
	layerMountData  = "noinit_itable"
	layerMountAttrs = unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOATIME
)

// layerSpec is the filesystem of a writable layer of diskBytes: that much
// space for files, and one inode per 4 KiB like the tmpfs layers before it
// (the inode tables cost no disk until used).
func layerSpec(diskBytes int64) diskimage.Spec {
	return diskimage.Spec{Size: diskBytes, Usable: true, Lazy: true, BytesPerInode: 4096}
}

// newFilesystem formats img (created) as an empty writable layer of
// diskBytes: a root only host root can enter (the sandbox sees the layer
// only through its overlay) holding the overlay's upper and work dirs. It
// is prepared through a detached mount: no mount point to leave behind if
// the daemon dies meanwhile.
func newFilesystem(img string, diskBytes int64) (err error) {
	if err := diskimage.Format(context.Background(), img, layerSpec(diskBytes)); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(img)
		}
	}()
	fs, err := diskimage.MountDetached(img, layerMountAttrs, layerMountData)
	if err != nil {
		return err
	}
	err = prepare(fs.Fd())
	// The last reference: a clean unmount, this filesystem is kept.
	if cerr := fs.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("prepare %s: %w", img, err)
	}
	// Its loop device lets go of the image shortly after: only then is
	// the image quiet, ready to be cloned.
	if l := diskimage.WaitLoopsGone(img, 10*time.Second); len(l) > 0 {
		return fmt.Errorf("prepare %s: %s still attached", img, l[0].Device)
	}
	return nil
}

func prepare(root int) error {
	for _, d := range []string{"upper", "work"} {
		if err := unix.Mkdirat(root, d, 0o755); err != nil {
			return err
		}
	}
	fd, err := unix.Openat(root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fchmod(fd, 0o700)
}

// maxBlanks bounds the blank images Layers keeps: one per disk size in use,
// the least recently used dropped first.
const maxBlanks = 8

// Layers makes sandboxes' writable layers, fast:
//
//   - each layer's image is a clone of a blank image of its size
//     (diskimage.Clone: 0.2 ms), formatted the first time that size is asked
//     for and kept in the Layers' directory (a format and a first mount take
//     about 15 ms);
//   - for the sizes Keep names, a few layers wait ready in the background:
//     cloned and mounted detached (diskimage.MountDetached), so a create only
//     renames the image into its sandbox dir and attaches the mount. Attaching
//     a loop device and mounting ext4 cost 1.5-4 ms here, a tmpfs 0.05 ms;
//     taking a ready layer brings a create back to the tmpfs's cost.
//
// The zero Layers formats every image on the spot and keeps nothing.
type Layers struct {
	dir string

	mu     sync.Mutex
	blanks map[int64]*blank
	tick   uint64
	ready  map[int64][]readyLayer // by disk size, for the sizes in keep
	keep   map[int64]int
	seq    int
	closed bool

	kick chan struct{} // wakes the filler
	stop chan struct{} // closed by Close
	done chan struct{} // closed when the filler has stopped
}

type blank struct {
	path string
	done chan struct{} // closed once formatted (or failed: err)
	err  error
	used uint64 // Layers.tick of its last use
}

// readyLayer is a layer's filesystem mounted nowhere yet.
type readyLayer struct {
	img string
	fs  *diskimage.Detached
}

// NewLayers returns Layers keeping its images in dir, which it empties:
// blanks are made again on demand, so a leftover of an older format or of
// a format cut short is never cloned, and ready layers of a daemon that
// crashed were unmounted with its death (detached mounts live only as long
// as their descriptor). Close stops it.
func NewLayers(dir string) (*Layers, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("layers: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("layers: %w", err)
	}
	ls := &Layers{dir: dir, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go ls.fill()
	return ls, nil
}

// Keep keeps n layers of diskBytes ready (0: none).
func (ls *Layers) Keep(diskBytes int64, n int) {
	if ls.dir == "" {
		return
	}
	ls.mu.Lock()
	if ls.keep == nil {
		ls.keep = map[int64]int{}
	}
	ls.keep[diskBytes] = n
	ls.mu.Unlock()
	ls.wake()
}

func (ls *Layers) wake() {
	if ls.dir == "" {
		return
	}
	select {
	case ls.kick <- struct{}{}:
	default:
	}
}

// fill keeps the ready layers at their Keep counts, one at a time.
func (ls *Layers) fill() {
	defer close(ls.done)
	for {
		select {
		case <-ls.stop:
			return
		case <-ls.kick:
		}
		for {
			size, ok := ls.wanted()
			if !ok {
				break
			}
			r, err := ls.makeReady(size)
			if err != nil {
				// Creates fall back to making their own; try again at the
				// next take.
				break
			}
			ls.mu.Lock()
			if ls.closed {
				ls.mu.Unlock()
				r.release()
				return
			}
			ls.ready[size] = append(ls.ready[size], r)
			ls.mu.Unlock()
		}
	}
}

// wanted returns a size below its Keep count.
func (ls *Layers) wanted() (int64, bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return 0, false
	}
	for size, n := range ls.keep {
		if len(ls.ready[size]) < n {
			return size, true
		}
	}
	return 0, false
}

func (ls *Layers) makeReady(diskBytes int64) (readyLayer, error) {
	src, err := ls.blank(diskBytes)
	if err != nil {
		return readyLayer{}, err
	}
	ls.mu.Lock()
	ls.seq++
	img := filepath.Join(ls.dir, fmt.Sprintf("ready-%d.img", ls.seq))
	if ls.ready == nil {
		ls.ready = map[int64][]readyLayer{}
	}
	ls.mu.Unlock()
	if err := diskimage.Clone(src, img); err != nil {
		return readyLayer{}, err
	}
	fs, err := diskimage.MountDetached(img, layerMountAttrs, layerMountData)
	if err != nil {
		os.Remove(img)
		return readyLayer{}, err
	}
	r := readyLayer{img: img, fs: fs}
	if err := warm(fs.Fd()); err != nil {
		r.release()
		return readyLayer{}, err
	}
	return r, nil
}

// warm reads into the page cache what a create's first operations on a
// fresh layer touch (the upper dir's inode, which gets the template root's
// owner and mode; the bitmaps and inode table overlayfs's mount-time checks
// allocate from in the work dir), by doing the same once: the loop device
// does direct I/O, so each of those blocks would otherwise be a disk read
// on the create's path (1-4 ms measured under load).
func warm(root int) error {
	var st unix.Stat_t
	if err := unix.Fstatat(root, "upper", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("warm layer: %w", err)
	}
	if err := unix.Mkdirat(root, "work/warm", 0o700); err != nil {
		return fmt.Errorf("warm layer: %w", err)
	}
	if err := unix.Unlinkat(root, "work/warm", unix.AT_REMOVEDIR); err != nil {
		return fmt.Errorf("warm layer: %w", err)
	}
	return nil
}

func (r readyLayer) release() {
	r.fs.Close()
	os.Remove(r.img)
}

// take puts a ready layer of diskBytes at l (image renamed to l.image,
// filesystem attached at l.layer); false when none is ready.
func (ls *Layers) take(l *Layer, diskBytes int64) bool {
	ls.mu.Lock()
	rs := ls.ready[diskBytes]
	if len(rs) == 0 {
		ls.mu.Unlock()
		return false
	}
	r := rs[len(rs)-1]
	ls.ready[diskBytes] = rs[:len(rs)-1]
	ls.mu.Unlock()
	ls.wake()
	// The loop device follows the rename: its backing file is l.image now.
	if err := os.Rename(r.img, l.image); err != nil {
		r.release()
		return false
	}
	err := r.fs.Attach(l.layer)
	r.fs.Close()
	if err != nil {
		os.Remove(l.image)
		return false
	}
	return true
}

// Close unmounts the ready layers and stops making them. Blank images stay
// (NewLayers clears them); layers already taken are their sandboxes'.
func (ls *Layers) Close() error {
	if ls.dir == "" {
		return nil
	}
	ls.mu.Lock()
	if ls.closed {
		ls.mu.Unlock()
		return nil
	}
	ls.closed = true
	ready := ls.ready
	ls.ready = nil
	ls.mu.Unlock()
	close(ls.stop)
	<-ls.done
	for _, rs := range ready {
		for _, r := range rs {
			r.release()
		}
	}
	return nil
}

// Mount is MountStack with the template as the only lower layer.
func (ls *Layers) Mount(templateRootFS, sandboxDir string, diskBytes int64) (*Layer, error) {
	return ls.MountStack([]string{templateRootFS}, sandboxDir, diskBytes)
}

// mountLayer puts a fresh filesystem of diskBytes at l: a ready one, else a
// clone of the blank, else (the zero Layers) a new one.
func (ls *Layers) mountLayer(l *Layer, diskBytes int64) error {
	if ls.dir == "" {
		if err := newFilesystem(l.image, diskBytes); err != nil {
			return err
		}
	} else if ls.take(l, diskBytes) {
		return nil
	} else {
		src, err := ls.blank(diskBytes)
		if err != nil {
			return err
		}
		if err := diskimage.Clone(src, l.image); err != nil {
			return err
		}
	}
	return diskimage.Mount(l.image, l.layer, layerMountFlags, layerMountData)
}

// blank returns the blank image for diskBytes, formatting it on first use;
// concurrent first uses wait for one format.
func (ls *Layers) blank(diskBytes int64) (string, error) {
	ls.mu.Lock()
	if ls.blanks == nil {
		ls.blanks = map[int64]*blank{}
	}
	ls.tick++
	b, ok := ls.blanks[diskBytes]
	if !ok {
		b = &blank{path: filepath.Join(ls.dir, fmt.Sprintf("blank-%d.img", diskBytes)), done: make(chan struct{})}
		ls.blanks[diskBytes] = b
		ls.evictLocked()
	}
	b.used = ls.tick
	ls.mu.Unlock()
	if !ok {
		tmp := b.path + ".tmp"
		_ = os.Remove(tmp)
		b.err = newFilesystem(tmp, diskBytes)
		if b.err == nil {
			b.err = os.Rename(tmp, b.path)
		}
		if b.err != nil {
			_ = os.Remove(tmp)
			ls.mu.Lock()
			delete(ls.blanks, diskBytes) // the next create tries again
			ls.mu.Unlock()
		}
		close(b.done)
	}
	<-b.done
	if b.err != nil {
		return "", fmt.Errorf("blank layer image of %d MiB: %w", diskBytes>>20, b.err)
	}
	return b.path, nil
}

// evictLocked drops the least recently used blank over maxBlanks. A clone
// reading it keeps its open file; a create wanting it again formats anew.
func (ls *Layers) evictLocked() {
	if len(ls.blanks) <= maxBlanks {
		return
	}
	var oldest int64
	var oldestUse uint64 = math.MaxUint64
	for size, b := range ls.blanks {
		if b.used < oldestUse && ls.keep[size] == 0 {
			oldest, oldestUse = size, b.used
		}
	}
	b, ok := ls.blanks[oldest]
	if !ok {
		return
	}
	delete(ls.blanks, oldest)
	go func() {
		<-b.done
		_ = os.Remove(b.path)
	}()
}
