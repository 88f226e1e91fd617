package layerstore

import (
	"archive/tar"
	"fmt"
	"io"

	"github.com/cella-sandbox/cella/internal/rootfs/layertar"
)

// WriteTar writes dir — a layer in overlay form, or any root filesystem
// directory — to w as an OCI layer tar (layertar's OCI form), in a stable
// order: overlay whiteouts become `.wh.NAME` files and opaque directories
// get a `.wh..wh..opq` entry, hard links are links to the first name of
// their inode, owners, modes, times and the kept extended attributes
// (user.*, security.capability) travel as PAX records. Sockets are left out.
func WriteTar(w io.Writer, dir string) error { return WriteTarSkipping(w, dir, nil) }

// WriteTarSkipping is WriteTar leaving out the entries skip names (paths
// below dir, slash-separated; a directory with all below it).
func WriteTarSkipping(w io.Writer, dir string, skip func(rel string) bool) error {
	tw := tar.NewWriter(w)
	if err := layertar.Write(tw, dir, layertar.Options{OCI: true, Xattr: keepXattr, Skip: skip}); err != nil {
		return fmt.Errorf("tar layer %s: %w", dir, err)
	}
	return tw.Close()
}
