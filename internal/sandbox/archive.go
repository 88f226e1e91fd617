package sandbox

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// writeArchive writes a gzipped tar of the named directories (prefix in the
// archive -> host dir) to w. It keeps what an overlay upper needs to come
// back exactly: owners, modes, mtimes, symlinks, hard links, device nodes
// (overlayfs whiteouts are 0:0 character devices) and extended attributes
// (trusted.overlay.opaque and friends, file capabilities).
func writeArchive(w io.Writer, dirs [][2]string) error {
	zw, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	for _, d := range dirs {
		if err := addTree(tw, d[0], d[1]); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

func addTree(tw *tar.Writer, prefix, root string) error {
	links := map[[2]uint64]string{}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		name := prefix
		if rel != "." {
			name = prefix + "/" + filepath.ToSlash(rel)
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		hdr := &tar.Header{
			Name: name, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
			ModTime: time.Unix(st.Mtim.Unix()), Format: tar.FormatPAX,
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
				links[key] = name
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
		if x, err := xattrs(p); err != nil {
			return err
		} else if len(x) > 0 {
			hdr.PAXRecords = map[string]string{}
			for k, v := range x {
				hdr.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("archive %s: %w", p, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return fmt.Errorf("archive %s: %w", p, err)
			}
		}
		return nil
	})
}

func xattrs(p string) (map[string]string, error) {
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
		if k == "" {
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

// extractArchive unpacks what writeArchive wrote: each entry's first path
// element picks the host dir it goes to (dests), entries of other prefixes
// are an error. Paths never leave their dir: the archive is cella's own, but
// it is checked anyway.
func extractArchive(r io.Reader, dests map[string]string) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return err
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	type dirTime struct {
		path string
		t    time.Time
	}
	var dirs []dirTime
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		prefix, rel, _ := strings.Cut(name, "/")
		root, ok := dests[prefix]
		if !ok {
			return fmt.Errorf("archive entry %q: unknown prefix", hdr.Name)
		}
		if rel != "" && (!filepath.IsLocal(rel) || strings.Contains(rel, "\\")) {
			return fmt.Errorf("archive entry %q: not a local path", hdr.Name)
		}
		p := filepath.Join(root, rel)
		mode := uint32(hdr.Mode & 0o7777)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
			dirs = append(dirs, dirTime{p, hdr.ModTime})
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("extract %s: %w", p, err)
			}
		case tar.TypeLink:
			lp, lrel, _ := strings.Cut(hdr.Linkname, "/")
			if lp != prefix || !filepath.IsLocal(lrel) {
				return fmt.Errorf("archive entry %q: bad hard link %q", hdr.Name, hdr.Linkname)
			}
			if err := os.Link(filepath.Join(root, lrel), p); err != nil {
				return err
			}
			continue // owner, mode and xattrs are the first name's
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, p); err != nil {
				return err
			}
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			kind := uint32(unix.S_IFCHR)
			if hdr.Typeflag == tar.TypeBlock {
				kind = unix.S_IFBLK
			} else if hdr.Typeflag == tar.TypeFifo {
				kind = unix.S_IFIFO
			}
			if err := unix.Mknod(p, kind|mode, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))); err != nil {
				return fmt.Errorf("extract %s: %w", p, err)
			}
		default:
			continue
		}
		if err := os.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeSymlink {
			// After chown: chown clears setuid/setgid bits.
			if err := unix.Fchmodat(unix.AT_FDCWD, p, mode, 0); err != nil {
				return fmt.Errorf("chmod %s: %w", p, err)
			}
		}
		for k, v := range hdr.PAXRecords {
			if x, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
				if err := unix.Lsetxattr(p, x, []byte(v), 0); err != nil {
					return fmt.Errorf("set xattr %s on %s: %w", x, p, err)
				}
			}
		}
		if hdr.Typeflag != tar.TypeDir {
			ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
			_ = unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
		}
	}
	// Directory mtimes last: creating their entries changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		ts := []unix.Timespec{unix.NsecToTimespec(dirs[i].t.UnixNano()), unix.NsecToTimespec(dirs[i].t.UnixNano())}
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, dirs[i].path, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}
