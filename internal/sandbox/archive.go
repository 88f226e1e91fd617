package sandbox

import (
	"archive/tar"
	"compress/gzip"
	"io"

	"github.com/cella-sandbox/cella/internal/rootfs/layertar"
)

// An archived sandbox is one tar.gz (lifecycle.go says when and where): its
// overlay upper under "upper/" and, for a checkpointed pause, its memory
// checkpoint under "checkpoint/", both in layertar's overlay form (owners,
// modes, whiteout devices, hard links, xattrs), so that a resume finds the
// layer exactly as it was.

// writeArchive writes a gzipped tar of the named directories (prefix in the
// archive -> host dir) to w.
func writeArchive(w io.Writer, dirs [][2]string) error {
	zw, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	for _, d := range dirs {
		if err := layertar.Write(tw, d[1], layertar.Options{Prefix: d[0]}); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// extractArchive unpacks what writeArchive wrote into dests (prefix -> host
// dir, existing).
func extractArchive(r io.Reader, dests map[string]string) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return err
	}
	defer zr.Close()
	return layertar.Extract(tar.NewReader(zr), dests)
}
