package registrytest

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
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

// DirLayer is a gzip layer of the files under dir for which keep returns
// true (paths relative to dir, "." for dir itself); hard links, symlinks,
// owners and modes are kept. Use it to make an image of a template.
func DirLayer(t testing.TB, dir string, keep func(rel string) bool) v1.Layer {
	t.Helper()
	opener := func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeDirTar(pw, dir, keep)) }()
		return pr, nil
	}
	l, err := tarball.LayerFromOpener(opener, tarball.WithCompressionLevel(1))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func writeDirTar(w io.Writer, dir string, keep func(string) bool) error {
	tw := tar.NewWriter(w)
	seen := map[uint64]string{}
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if keep(rel) {
			paths = append(paths, rel)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	for _, rel := range paths {
		p := filepath.Join(dir, rel)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		if !fi.Mode().IsRegular() && !fi.IsDir() && link == "" {
			continue // devices, sockets, fifos
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uname, hdr.Gname, hdr.Format = rel, "", "", tar.FormatPAX
		if fi.IsDir() {
			hdr.Name += "/"
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().IsRegular() && st.Nlink > 1 {
			if first, ok := seen[st.Ino]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				seen[st.Ino] = rel
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return err
			}
		}
	}
	return tw.Close()
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

// Push writes img to ref in r (with r's credentials) and returns its
// manifest digest.
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) v1.Hash {
	t.Helper()
	ref, err := name.ParseReference(r.Ref(repoTag))
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithAuth(r.Auth())); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Auth is the registry's credentials (anonymous without auth).
func (r *Registry) Auth() authn.Authenticator {
	if r.User == "" {
		return authn.Anonymous
	}
	return authn.FromConfig(authn.AuthConfig{Username: r.User, Password: r.Password})
}
