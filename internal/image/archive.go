package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// defaultMaxBlob bounds an oci-archive's files when Options does not.
const defaultMaxBlob = 8 << 30

// openOCIArchive reads a tar of an OCI layout (skopeo's oci-archive:,
// `buildah push oci-archive:`): it is extracted into a temp dir, regular
// files and directories only, and read as a layout.
func openOCIArchive(p string, o Options) (*Image, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dir, err := os.MkdirTemp(o.TempDir, "oci-archive-")
	if err != nil {
		return nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	max := o.MaxBlobSize
	if max <= 0 {
		max = defaultMaxBlob
	}
	if err := extractLayout(f, dir, max); err != nil {
		cleanup()
		return nil, fmt.Errorf("read oci-archive: %w", err)
	}
	img, err := openLayout(dir, o.platform())
	if err != nil {
		cleanup()
		return nil, err
	}
	img.Ref = OCIArchivePrefix + p
	img.cleanup = cleanup
	return img, nil
}

// extractLayout writes an OCI layout tar's files under dir. An OCI layout
// holds nothing but regular files in directories: links, devices and
// names leaving dir are refused.
func extractLayout(r io.Reader, dir string, maxFile int64) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		name := path.Clean(hdr.Name)
		if strings.HasPrefix(hdr.Name, "/") || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("entry %q: outside the archive", hdr.Name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o700); err != nil {
				return fmt.Errorf("entry %q: %w", hdr.Name, err)
			}
		case tar.TypeReg:
			if hdr.Size > maxFile {
				return fmt.Errorf("entry %q: %d bytes, over the limit of %d (--max-layer-size)", hdr.Name, hdr.Size, maxFile)
			}
			if err := root.MkdirAll(path.Dir(name), 0o700); err != nil {
				return fmt.Errorf("entry %q: %w", hdr.Name, err)
			}
			w, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("entry %q: %w", hdr.Name, err)
			}
			_, err = io.Copy(w, tr)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("entry %q: %w", hdr.Name, err)
			}
		case tar.TypeXGlobalHeader:
		default:
			return fmt.Errorf("entry %q: an OCI archive holds only files and directories, not type %q", hdr.Name, hdr.Typeflag)
		}
	}
}
