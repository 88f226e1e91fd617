package layerstore

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// WriteTar writes dir — a layer in overlay form, or any root filesystem
// directory — to w as an OCI layer tar, in a stable order: overlay
// whiteouts become `.wh.NAME` files and opaque directories get a
// `.wh..wh..opq` entry, hard links are links to the first name of their
// inode, owners, modes, times and the kept extended attributes (user.*,
// security.capability) travel as PAX records. Sockets are left out.
func WriteTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	links := map[uint64]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if isWhiteout(fi) {
			return tw.WriteHeader(&tar.Header{Name: filepath.Join(filepath.Dir(rel), whiteoutPrefix+filepath.Base(rel)),
				Typeflag: tar.TypeReg, Mode: 0o644, ModTime: fi.ModTime(), Format: tar.FormatPAX})
		}
		if fi.Mode()&fs.ModeSocket != 0 {
			return nil
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		hdr.Name, hdr.Uname, hdr.Gname, hdr.Format = rel, "", "", tar.FormatPAX
		hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{} // stable output
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if fi.Mode().IsRegular() && st.Nlink > 1 {
			if first, ok := links[st.Ino]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[st.Ino] = rel
			}
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			if err := addXattrs(hdr, p); err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
		}
		if fi.IsDir() && isOpaque(p) {
			return tw.WriteHeader(&tar.Header{Name: filepath.Join(rel, opaqueMarker), Typeflag: tar.TypeReg,
				Mode: 0o644, ModTime: fi.ModTime(), Format: tar.FormatPAX})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("tar layer %s: %w", dir, err)
	}
	return tw.Close()
}

func isOpaque(p string) bool {
	b := make([]byte, 4)
	n, err := unix.Lgetxattr(p, overlayOpaque, b)
	return err == nil && string(b[:n]) == "y"
}

// addXattrs copies the kept extended attributes of p into hdr.
func addXattrs(hdr *tar.Header, p string) error {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		return nil // no xattrs, or a filesystem without them
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil
	}
	start := 0
	for i := 0; i < sz; i++ {
		if buf[i] != 0 {
			continue
		}
		name := string(buf[start:i])
		start = i + 1
		if !keepXattr(name) {
			continue
		}
		vsz, err := unix.Lgetxattr(p, name, nil)
		if err != nil {
			continue
		}
		v := make([]byte, vsz)
		if vsz, err = unix.Lgetxattr(p, name, v); err != nil {
			continue
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+name] = string(v[:vsz])
	}
	return nil
}
