package layertar

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Extract unpacks a stream of trees that Write wrote in overlay form, each
// with its Prefix: an entry's first path element picks the host directory
// it goes to (dests; the directories exist), and entries of other prefixes
// are an error. Everything Write keeps is restored: owners, modes, mtimes,
// hard links, symlinks, device nodes (whiteouts among them), fifos and
// extended attributes. It is for cella's own streams (an archived sandbox's
// upper, whose owners and devices it must create): paths are still checked
// never to leave their directory, but the layer store's hostile image
// layers go through layerstore.Unpack instead.
func Extract(tr *tar.Reader, dests map[string]string) error {
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
		if err := beneath(root, rel); err != nil {
			return fmt.Errorf("archive entry %q: %w", hdr.Name, err)
		}
		p := filepath.Join(root, rel)
		mode := uint32(hdr.Mode & 0o7777)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(p, 0o700); err != nil {
				if !errors.Is(err, os.ErrExist) {
					return err
				}
				// Only a directory met again (a prefix's root): chmod and
				// chown below follow what is there.
				if st, err := os.Lstat(p); err != nil || !st.IsDir() {
					return fmt.Errorf("archive entry %q: exists and is not a directory", hdr.Name)
				}
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
			if lp != prefix || !filepath.IsLocal(lrel) || beneath(root, lrel) != nil {
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

// beneath checks that rel's parent directories under root are directories,
// not symlinks: an entry written through a symlink an earlier entry made
// (a/ -> /etc, then a/passwd) would land outside root. Extract is the only
// writer of the tree while it runs, so what Lstat sees stays true.
func beneath(root, rel string) error {
	dir := filepath.Dir(rel)
	if dir == "." {
		return nil
	}
	p := root
	for _, el := range strings.Split(dir, string(filepath.Separator)) {
		p = filepath.Join(p, el)
		st, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("parent %s: %w", el, err)
		}
		if !st.IsDir() {
			return fmt.Errorf("goes through %s, which is not a directory (a symlink?)", el)
		}
	}
	return nil
}
