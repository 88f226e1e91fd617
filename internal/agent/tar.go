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
	"time"

	"golang.org/x/sys/unix"
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
	st, err := os.Stat(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			jsonError(w, http.StatusNotFound, fmt.Errorf("path '%s' does not exist", dir))
			return
		}
		jsonError(w, http.StatusInternalServerError, err)
		return
	}
	if !st.IsDir() {
		jsonError(w, http.StatusBadRequest, fmt.Errorf("path '%s' is not a directory", dir))
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	tw := tar.NewWriter(w)
	// Once the body started, errors can only end the stream early; the
	// missing tar trailer makes the client's reader fail loudly.
	if err := writeTree(tw, dir); err != nil {
		slog.Warn("tar stream ended early", "dir", dir, "err", err)
		return
	}
	_ = tw.Close()
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
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			// Copy exactly the size in the header even if the file grows or
			// shrinks meanwhile, or the archive would be corrupt.
			n, err := io.Copy(tw, io.LimitReader(f, hdr.Size))
			f.Close()
			if err != nil {
				return err
			}
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
	if err := ensureDirs(dir, u); err != nil {
		jsonError(w, statusFor(err), fmt.Errorf("create %s: %w", dir, err))
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
	n, err := extractTar(tar.NewReader(body), dir, u)
	if err != nil {
		code := statusFor(err)
		if code == http.StatusInternalServerError && errors.Is(err, errBadArchive) {
			code = http.StatusBadRequest
		}
		jsonError(w, code, err)
		return
	}
	s.audit.emit(AuditEvent{Kind: "file.write", Path: dir + " (tar, " + strconv.Itoa(n) + " entries)", User: u.Name})
	writeJSON(w, http.StatusOK, map[string]any{"path": dir, "entries": n})
}

var errBadArchive = errors.New("bad archive")

// extractTar writes the archive below root, owned by u. Entries may not
// leave root, neither by name (.., absolute) nor through a symlink that an
// earlier entry (or the directory) placed on the way.
func extractTar(tr *tar.Reader, root string, u *sandboxUser) (int, error) {
	type dirTime struct {
		path  string
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
		name := filepath.Clean(filepath.FromSlash(strings.TrimPrefix(hdr.Name, "/")))
		if name == "." {
			continue
		}
		if name == ".." || strings.HasPrefix(name, "../") {
			return n, fmt.Errorf("%w: entry %q leaves the target directory", errBadArchive, hdr.Name)
		}
		target := filepath.Join(root, name)
		if err := checkNoSymlinkParents(root, filepath.Dir(target)); err != nil {
			return n, err
		}
		if err := ensureDirs(filepath.Dir(target), u); err != nil {
			return n, err
		}
		mode := os.FileMode(hdr.Mode).Perm()
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(target, mode); err != nil && !errors.Is(err, fs.ErrExist) {
				return n, fmt.Errorf("create %s: %w", target, err)
			}
			if st, err := os.Lstat(target); err != nil || !st.IsDir() {
				return n, fmt.Errorf("%w: %s exists and is not a directory", errBadArchive, target)
			}
			_ = os.Chmod(target, mode)
			dirs = append(dirs, dirTime{target, hdr.ModTime})
		case tar.TypeReg, tar.TypeRegA:
			// Replace rather than write through whatever is there (it
			// could be a symlink pointing outside).
			if st, err := os.Lstat(target); err == nil && !st.IsDir() {
				_ = os.Remove(target)
			}
			f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, mode)
			if err != nil {
				return n, fmt.Errorf("create %s: %w", target, err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return n, fmt.Errorf("write %s: %w", target, err)
			}
			_ = os.Chmod(target, mode)
			_ = os.Chtimes(target, hdr.ModTime, hdr.ModTime)
		case tar.TypeSymlink:
			_ = os.Remove(target)
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return n, fmt.Errorf("symlink %s: %w", target, err)
			}
		case tar.TypeLink:
			src := filepath.Join(root, filepath.Clean(filepath.FromSlash(strings.TrimPrefix(hdr.Linkname, "/"))))
			if rel, err := filepath.Rel(root, src); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				return n, fmt.Errorf("%w: hard link %q leaves the target directory", errBadArchive, hdr.Linkname)
			}
			_ = os.Remove(target)
			if err := os.Link(src, target); err != nil {
				return n, fmt.Errorf("link %s: %w", target, err)
			}
		default:
			continue // devices, fifos: not for a sandbox copy
		}
		if err := os.Lchown(target, int(u.UID), int(u.GID)); err != nil {
			return n, fmt.Errorf("chown %s: %w", target, err)
		}
		n++
	}
	// Directory times last: writing their contents changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Chtimes(dirs[i].path, dirs[i].mtime, dirs[i].mtime)
	}
	return n, nil
}

// checkNoSymlinkParents fails if any directory between root (exclusive) and
// dir (inclusive) is a symlink.
func checkNoSymlinkParents(root, dir string) error {
	rel, err := filepath.Rel(root, dir)
	if err != nil || rel == "." {
		return nil
	}
	p := root
	for _, c := range strings.Split(rel, string(filepath.Separator)) {
		p = filepath.Join(p, c)
		st, err := os.Lstat(p)
		if err != nil {
			return nil // missing: will be created as a directory
		}
		if st.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%w: %s is a symlink inside the target directory", errBadArchive, p)
		}
	}
	return nil
}
