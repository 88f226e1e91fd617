// Package layertar writes a layer directory (an overlay upper, a layer of
// the layer store, any root filesystem directory) as a tar stream that
// keeps what the layer needs to come back exactly: owners, modes (setuid,
// setgid and sticky included), nanosecond mtimes, symlinks, hard links (to
// the first name of their inode), device nodes, fifos, and extended
// attributes as PAX SCHILY.xattr records. Sockets are left out. Entries
// come in lexical order, so the same tree always gives the same bytes.
//
// A layer's overlayfs whiteouts (0:0 character devices) and opaque
// directories (trusted.overlay.opaque) travel in one of two forms:
//
//   - overlay form (sandbox archives): as they are on disk, restored by
//     Extract into another overlay upper;
//   - OCI form (image layers, layerstore.WriteTar): as the OCI image
//     spec's `.wh.NAME` files and `.wh..wh..opq` markers, which any image
//     tool reads.
package layertar

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The whiteout names of the OCI image layer spec, and the overlayfs
// attribute of an opaque directory.
const (
	WhiteoutPrefix = ".wh."
	OpaqueMarker   = ".wh..wh..opq"
	OverlayOpaque  = "trusted.overlay.opaque"
)

// Options say how Write names and shapes a tree's entries.
type Options struct {
	// Prefix names the tree's root in the stream: "" leaves the root out
	// and names the entries by their path below it (an image layer); "p"
	// writes the root as "p/" and the entries as "p/<path>", so that one
	// stream can carry several trees.
	Prefix string
	// OCI writes whiteouts and opaque directories in OCI form (see the
	// package comment) instead of overlay form.
	OCI bool
	// Xattr says which extended attributes travel; nil: all of them.
	Xattr func(name string) bool
	// Skip leaves out the entry at rel (a path below dir, slash-separated)
	// and, for a directory, everything below it; nil: nothing is left out.
	Skip func(rel string) bool
}

// Write appends dir's tree to tw (which the caller closes).
func Write(tw *tar.Writer, dir string, o Options) error {
	name := func(rel string) string {
		if o.Prefix == "" {
			return filepath.ToSlash(rel)
		}
		if rel == "." {
			return o.Prefix
		}
		return o.Prefix + "/" + filepath.ToSlash(rel)
	}
	links := map[[2]uint64]string{}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel == "." && o.Prefix == "" {
			return nil
		}
		if o.Skip != nil && rel != "." && o.Skip(filepath.ToSlash(rel)) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		mtime := time.Unix(st.Mtim.Unix())
		if o.OCI && isWhiteout(&st) {
			return tw.WriteHeader(&tar.Header{Name: name(filepath.Join(filepath.Dir(rel), WhiteoutPrefix+filepath.Base(rel))),
				Typeflag: tar.TypeReg, Mode: 0o644, ModTime: mtime, Format: tar.FormatPAX})
		}
		hdr := &tar.Header{
			Name: name(rel), Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
			ModTime: mtime, Format: tar.FormatPAX,
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case unix.S_IFREG:
			key := [2]uint64{st.Dev, st.Ino}
			if st.Nlink > 1 {
				if first, ok := links[key]; ok {
					hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
					break
				}
				links[key] = hdr.Name
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		case unix.S_IFCHR, unix.S_IFBLK:
			hdr.Typeflag = tar.TypeChar
			if st.Mode&unix.S_IFMT == unix.S_IFBLK {
				hdr.Typeflag = tar.TypeBlock
			}
			hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		case unix.S_IFIFO:
			hdr.Typeflag = tar.TypeFifo
		default:
			return nil // sockets do not survive anyway
		}
		x, err := xattrs(p, o.Xattr)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		for k, v := range x {
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		}
		if o.OCI && hdr.Typeflag == tar.TypeDir && IsOpaque(p) {
			return tw.WriteHeader(&tar.Header{Name: name(filepath.Join(rel, OpaqueMarker)), Typeflag: tar.TypeReg,
				Mode: 0o644, ModTime: mtime, Format: tar.FormatPAX})
		}
		return nil
	})
}

// IsWhiteout reports whether fi is an overlayfs whiteout: a character
// device 0:0.
func IsWhiteout(fi fs.FileInfo) bool {
	if fi.Mode()&fs.ModeCharDevice == 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Rdev == 0
}

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// IsOpaque reports whether directory p is an overlayfs opaque directory.
func IsOpaque(p string) bool {
	b := make([]byte, 4)
	n, err := unix.Lgetxattr(p, OverlayOpaque, b)
	return err == nil && string(b[:n]) == "y"
}

// xattrs returns p's extended attributes that keep (nil: all) lets
// through. A filesystem without them has none; a value that vanished
// between the list and the read is left out.
func xattrs(p string, keep func(string) bool) (map[string]string, error) {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, err
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, k := range strings.Split(string(buf[:sz]), "\x00") {
		if k == "" || (keep != nil && !keep(k)) {
			continue
		}
		vs, err := unix.Lgetxattr(p, k, nil)
		if err != nil {
			continue
		}
		v := make([]byte, vs)
		vs, err = unix.Lgetxattr(p, k, v)
		if err != nil {
			continue
		}
		out[k] = string(v[:vs])
	}
	return out, nil
}
