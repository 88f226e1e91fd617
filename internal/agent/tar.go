package agent

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cella-sandbox/cella/internal/agentapi"
)

// GET /cella/tar?path=DIR streams DIR as an uncompressed tar whose names
// are relative to DIR; POST /cella/tar?path=DIR extracts a tar body
// (optionally Content-Encoding: gzip) into DIR. They carry `cella cp` for
// directories, which envd's one-file-per-request /files cannot do well.

func (s *Server) handleTarGet(w http.ResponseWriter, r *http.Request) {
	u, err := s.fileUser(r)
	if err != nil {
		jsonError(w, http.StatusUnauthorized, err)
		return
	}
	dir, err := s.resolve(r.URL.Query().Get("path"), u)
	if err != nil {
		jsonError(w, http.StatusBadRequest, err)
		return
	}
	// The whole walk runs as the user: it lists and reads what the user
	// could, and a symlinked path leads only where the user may go.
	_ = u.do(func() error {
		st, err := os.Stat(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			jsonError(w, http.StatusNotFound, fmt.Errorf("path '%s' does not exist", dir))
			return nil
		case errors.Is(err, fs.ErrPermission):
			jsonError(w, http.StatusForbidden, u.denied("read", dir, err))
			return nil
		case err != nil:
			jsonError(w, http.StatusInternalServerError, err)
			return nil
		case !st.IsDir():
			jsonError(w, http.StatusBadRequest, fmt.Errorf("path '%s' is not a directory", dir))
			return nil
		}
		// Refuse an unreadable directory now, while the status can still
		// say so.
		d, err := os.Open(dir)
		if err != nil {
			jsonError(w, statusFor(err), u.denied("read", dir, err))
			return nil
		}
		d.Close()
		w.Header().Set("Content-Type", "application/x-tar")
		w.WriteHeader(http.StatusOK)
		bw := newBulkResponse(w) // bulk.go
		defer bw.done()
		tw := tar.NewWriter(bw)
		// Once the body started, errors can only end the stream early; the
		// missing tar trailer makes the client's reader fail loudly.
		if err := writeTree(tw, dir); err != nil {
			slog.Warn("tar stream ended early", "dir", dir, "err", err)
			return nil
		}
		_ = tw.Close()
		return nil
	})
}

func writeTree(tw *tar.Writer, root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			return nil // vanished while walking
		}
		if p == root {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		var link string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return nil
			}
		}
		if !fi.Mode().IsRegular() && !fi.IsDir() && fi.Mode()&fs.ModeSymlink == 0 {
			return nil // sockets, fifos, devices
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return nil
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			// O_NONBLOCK: a fifo swapped in since the walk saw a file must
			// not hang the stream.
			f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
			if err != nil {
				return err
			}
			var n int64
			if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
				// Copy exactly the size in the header even if the file grows
				// or shrinks meanwhile, or the archive would be corrupt.
				n, err = copyFilled(tw, io.LimitReader(f, hdr.Size)) // bulk.go
				if err != nil {
					f.Close()
					return err
				}
			}
			f.Close()
			if n < hdr.Size {
				if _, err := io.CopyN(tw, zeroReader{}, hdr.Size-n); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

func (s *Server) handleTarPut(w http.ResponseWriter, r *http.Request) {
	defer r.Body.Close()
	u, err := s.fileUser(r)
	if err != nil {
		jsonError(w, http.StatusUnauthorized, err)
		return
	}
	dir, err := s.resolve(r.URL.Query().Get("path"), u)
	if err != nil {
		jsonError(w, http.StatusBadRequest, err)
		return
	}
	body := io.Reader(r.Body)
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			jsonError(w, http.StatusBadRequest, fmt.Errorf("error decompressing request body: %w", err))
			return
		}
		defer zr.Close()
		body = zr
	}
	// Extracted as the user: what the archive creates is the user's, and
	// it lands only where the user may write.
	n := 0
	err = u.do(func() error {
		if err := ensureDirs(dir); err != nil {
			return fmt.Errorf("create %s: %w", dir, u.denied("create", dir, err))
		}
		var err error
		n, err = extractTar(tar.NewReader(body), dir)
		return u.denied("write into", dir, err)
	})
	if err != nil {
		code := statusFor(err)
		if code == http.StatusInternalServerError && errors.Is(err, errBadArchive) {
			code = http.StatusBadRequest
		}
		jsonError(w, code, err)
		return
	}
	s.audit.emit(agentapi.AuditEvent{Kind: "file.write", Path: dir + " (tar, " + strconv.Itoa(n) + " entries)", User: u.Name})
	writeJSON(w, http.StatusOK, map[string]any{"path": dir, "entries": n})
}

var errBadArchive = errors.New("bad archive")

// beneath resolves below a directory fd without following any symlink or
// magic link and without leaving it: a symlink that an entry (or anyone
// else, meanwhile) put on the way makes the lookup fail instead of leading
// elsewhere.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

func openBeneath(dirFD int, rel string, flags int) (int, error) {
	return unix.Openat2(dirFD, rel, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: beneath})
}

// parentBeneath returns an O_PATH fd of rel's parent directory below
// rootFD, creating missing directories on the way, and rel's last element.
func parentBeneath(rootFD int, rel string) (int, string, error) {
	dir, base := filepath.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		fd, err := unix.Dup(rootFD)
		return fd, base, err
	}
	fd, err := openBeneath(rootFD, dir, unix.O_PATH|unix.O_DIRECTORY)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return fd, base, beneathError(dir, err)
	}
	// Create the missing ones, one level at a time.
	fd, err = unix.Dup(rootFD)
	if err != nil {
		return -1, "", err
	}
	for _, c := range strings.Split(dir, "/") {
		if err := unix.Mkdirat(fd, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return -1, "", fmt.Errorf("create %s: %w", dir, err)
		}
		next, err := openBeneath(fd, c, unix.O_PATH|unix.O_DIRECTORY)
		unix.Close(fd)
		if err != nil {
			return -1, "", beneathError(dir, err)
		}
		fd = next
	}
	return fd, base, nil
}

func beneathError(rel string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%w: %s goes through a symlink or leaves the target directory", errBadArchive, rel)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%w: %s: a path element exists and is not a directory", errBadArchive, rel)
	}
	return fmt.Errorf("open %s: %w", rel, err)
}

// entryName turns a tar name into a clean path relative to the target
// directory: absolute names are taken as relative to it, and names that
// climb out of it with .. are refused.
func entryName(name string) (string, error) {
	rel := filepath.Clean(strings.TrimLeft(filepath.FromSlash(name), "/"))
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%w: entry %q leaves the target directory", errBadArchive, name)
	}
	return rel, nil
}

// extractTar writes the archive below root as the calling thread's user.
// Every entry is created relative to a descriptor of root, through
// directories opened with openat2 that never follow a symlink: neither .. nor
// absolute names nor symlinks (from the archive or planted meanwhile) lead
// out of root. Devices, fifos and setuid/setgid/sticky bits are dropped.
func extractTar(tr *tar.Reader, root string) (int, error) {
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(rootFD)
	type dirTime struct {
		rel   string
		mtime time.Time
	}
	var dirs []dirTime
	n := 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, fmt.Errorf("%w: %v", errBadArchive, err)
		}
		rel, err := entryName(hdr.Name)
		if err != nil {
			return n, err
		}
		if rel == "." {
			continue
		}
		switch hdr.Typeflag {
		case tar.TypeDir, tar.TypeReg, tar.TypeRegA, tar.TypeSymlink, tar.TypeLink:
		default:
			continue // devices, fifos: not for a sandbox copy
		}
		if err := extractEntry(rootFD, rel, hdr, tr); err != nil {
			return n, err
		}
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, dirTime{rel, hdr.ModTime})
		}
		n++
	}
	// Directory times last: writing their contents changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		if pfd, base, err := parentBeneath(rootFD, dirs[i].rel); err == nil {
			setTimes(pfd, base, dirs[i].mtime)
			unix.Close(pfd)
		}
	}
	return n, nil
}

func extractEntry(rootFD int, rel string, hdr *tar.Header, r io.Reader) error {
	pfd, base, err := parentBeneath(rootFD, rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	mode := uint32(os.FileMode(hdr.Mode).Perm())
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, mode); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create %s: %w", rel, err)
		}
		fd, err := openBeneath(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return fmt.Errorf("%w: %s exists and is not a directory", errBadArchive, rel)
		}
		_ = unix.Fchmod(fd, mode) // an existing directory of someone else's keeps its mode
		unix.Close(fd)
	case tar.TypeReg, tar.TypeRegA:
		// Replace rather than write through whatever is there (it could
		// be a symlink pointing outside); O_EXCL refuses one planted after
		// the unlink.
		if err := unlinkNonDir(pfd, base, rel); err != nil {
			return err
		}
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		if err != nil {
			return fmt.Errorf("create %s: %w", rel, err)
		}
		f := os.NewFile(uintptr(fd), rel)
		body := &bodyReader{r: r}    // files_http.go
		_, err = copyFilled(f, body) // bulk.go
		if body.err != nil {
			f.Close()
			return fmt.Errorf("%w: %s: %v", errBadArchive, rel, body.err) // the archive ends inside it
		}
		if err == nil {
			err = f.Chmod(os.FileMode(mode)) // the umask took bits away
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", rel, err)
		}
		setTimes(pfd, base, hdr.ModTime)
	case tar.TypeSymlink:
		if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
			return fmt.Errorf("%w: symlink %s has no target", errBadArchive, rel)
		}
		if err := unlinkNonDir(pfd, base, rel); err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("symlink %s: %w", rel, err)
		}
	case tar.TypeLink:
		src, err := entryName(hdr.Linkname)
		if err != nil || src == "." {
			return fmt.Errorf("%w: hard link %q leaves the target directory", errBadArchive, hdr.Linkname)
		}
		spfd, sbase, err := parentBeneath(rootFD, src)
		if err != nil {
			return err
		}
		defer unix.Close(spfd)
		if err := unlinkNonDir(pfd, base, rel); err != nil {
			return err
		}
		// No AT_SYMLINK_FOLLOW: a link to a symlink is another symlink.
		if err := unix.Linkat(spfd, sbase, pfd, base, 0); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("%w: hard link %s: its target %q is neither in the archive before it nor in the directory", errBadArchive, rel, hdr.Linkname)
			}
			return fmt.Errorf("link %s: %w", rel, err)
		}
	}
	return nil
}

// unlinkNonDir removes what is at base unless it is a directory.
func unlinkNonDir(pfd int, base, rel string) error {
	err := unix.Unlinkat(pfd, base, 0)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EISDIR):
		return fmt.Errorf("%w: %s exists and is a directory", errBadArchive, rel)
	}
	return fmt.Errorf("replace %s: %w", rel, err)
}

func setTimes(pfd int, base string, t time.Time) {
	ts := unix.NsecToTimespec(t.UnixNano())
	_ = unix.UtimesNanoAt(pfd, base, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}
