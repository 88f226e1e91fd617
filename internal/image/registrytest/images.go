package registrytest

import (
	"archive/tar"
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cella-sandbox/cella/internal/layerstore"
)

// File is one entry of a test layer: a regular file unless Link (a
// symlink target) or Dir is set.
type File struct {
	Name string
	Body string
	Mode int64
	Link string
	Dir  bool
}

// TarOf is an uncompressed layer tar of files.
func TarOf(t testing.TB, files ...File) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		hdr := &tar.Header{Name: f.Name, Mode: f.Mode, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		switch {
		case f.Dir:
			hdr.Typeflag = tar.TypeDir
		case f.Link != "":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, f.Link
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.Body))
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
			if f.Dir {
				hdr.Mode = 0o755
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f.Body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Compression of a test layer.
type Compression int

// The layer media types cella reads.
const (
	Gzip Compression = iota
	Zstd
	Uncompressed
)

// Layer turns an uncompressed tar into a layer of the given compression.
func Layer(t testing.TB, tarball_ []byte, c Compression) v1.Layer {
	t.Helper()
	if c == Uncompressed {
		return static.NewLayer(tarball_, types.OCIUncompressedLayer)
	}
	opts := []tarball.LayerOption{tarball.WithCompressedCaching}
	if c == Zstd {
		opts = append(opts, tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tarball_)), nil }, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// DirLayer is a layer of the tree at dir (a template's rootfs, say),
// written as it is read.
func DirLayer(t testing.TB, dir string) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(layerstore.WriteTar(pw, dir)) }()
		return pr, nil
	}, tarball.WithCompressionLevel(1))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image is an image of layers (bottom first) with cfg's settings.
func Image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", "amd64", cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return mutate.MediaType(img, types.OCIManifestSchema1)
}
