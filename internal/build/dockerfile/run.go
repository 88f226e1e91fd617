package dockerfile

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cella-sandbox/cella/internal/build"
	"github.com/cella-sandbox/cella/internal/rootfs/layertar"
)

// Runner runs a plan's builds: the daemon's engine (build.Engine through
// EngineRunner) or E2B's build API (the CLI).
type Runner interface {
	// Build builds spec (spec.Name) with files for its COPY steps.
	Build(ctx context.Context, spec build.Spec, files build.Files) error
	// Export is a tar of path in a sandbox of template, its entries named
	// path's base name and below.
	Export(ctx context.Context, template, path string) (io.ReadCloser, error)
	// Remove removes an intermediate stage's template.
	Remove(ctx context.Context, template string) error
}

// MaxArchive bounds the files of one COPY (held in memory).
const MaxArchive = 1 << 30

// Archives are the files of a plan's COPY steps by their hash.
type Archives map[string][]byte

// Open implements build.Files.
func (a Archives) Open(_ context.Context, hash string) (io.ReadCloser, error) {
	b, ok := a[hash]
	if !ok {
		return nil, fmt.Errorf("files %s were not prepared", hash)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (a Archives) put(b []byte) string {
	h := sha256.Sum256(b)
	k := hex.EncodeToString(h[:])
	a[k] = b
	return k
}

// Run builds the plan's stages in order with files from contextDir, then
// removes the intermediate stages' templates (their layers stay cached).
func (p *Plan) Run(ctx context.Context, r Runner, contextDir string) (err error) {
	var made []string
	defer func() {
		for _, n := range made {
			if rerr := r.Remove(context.WithoutCancel(ctx), n); rerr != nil && err == nil {
				err = fmt.Errorf("remove stage template %s: %w", n, rerr)
			}
		}
	}()
	for si, st := range p.Stages {
		files := Archives{}
		spec := st.Spec
		spec.Steps = slices.Clone(spec.Steps)
		for i, src := range st.Sources {
			var b []byte
			if src.Stage >= 0 {
				b, err = exportArchive(ctx, r, p.Stages[src.Stage].Name, src.Paths[0])
			} else {
				b, err = ContextArchive(contextDir, src.Paths)
			}
			if err != nil {
				return &build.StepError{Step: fmt.Sprint(i + 1), Message: err.Error(), Err: err}
			}
			spec.Steps[i].FilesHash = files.put(b)
		}
		if err := r.Build(ctx, spec, files); err != nil {
			return err
		}
		if si < len(p.Stages)-1 {
			made = append(made, st.Name)
		}
	}
	return nil
}

func exportArchive(ctx context.Context, r Runner, template, path string) ([]byte, error) {
	rc, err := r.Export(ctx, template, path)
	if err != nil {
		return nil, fmt.Errorf("COPY --from %s: %w", path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MaxArchive+1))
	if err == nil && len(b) > MaxArchive {
		err = fmt.Errorf("more than %d MiB", MaxArchive>>20)
	}
	if err != nil {
		return nil, fmt.Errorf("COPY --from %s: %w", path, err)
	}
	return b, nil
}

// ContextArchive is a tar of the context paths (relative; globs allowed)
// and, for directories, everything below them, named by their path in
// the context (E2B's archive, §4.2). Symlinks are stored as links; a path
// may not leave the context.
func ContextArchive(contextDir string, paths []string) ([]byte, error) {
	root, err := filepath.Abs(contextDir)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	for _, p := range paths {
		matches, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(p)))
		if err != nil {
			return nil, fmt.Errorf("COPY %s: %w", p, err)
		}
		if len(matches) == 0 {
			return nil, fmt.Errorf("COPY %s: no files found in the build context %s", p, contextDir)
		}
		for _, m := range matches {
			rel, err := filepath.Rel(root, m)
			if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				return nil, fmt.Errorf("COPY %s: outside the build context", p)
			}
			if err := addTree(tw, root, rel, seen); err != nil {
				return nil, fmt.Errorf("COPY %s: %w", p, err)
			}
			if buf.Len() > MaxArchive {
				return nil, fmt.Errorf("COPY %s: more than %d MiB", p, MaxArchive>>20)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// addTree adds rel (below root) and, if a directory, its tree: parents of
// rel first, so that the archive holds the source prefix as written.
func addTree(tw *tar.Writer, root, rel string, seen map[string]bool) error {
	if rel == "." {
		return layertar.Write(tw, root, layertar.Options{Xattr: noXattr})
	}
	parts := strings.Split(filepath.ToSlash(rel), "/")
	for i := 1; i < len(parts); i++ {
		dir := strings.Join(parts[:i], "/")
		if seen[dir] {
			continue
		}
		seen[dir] = true
		fi, err := os.Lstat(filepath.Join(root, dir))
		if err != nil {
			return err
		}
		hdr, _ := tar.FileInfoHeader(fi, "")
		hdr.Name = dir + "/"
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
	}
	fi, err := os.Lstat(filepath.Join(root, rel))
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeType == 0 || fi.Mode()&fs.ModeSymlink != 0 {
		name := filepath.ToSlash(rel)
		if seen[name] {
			return nil
		}
		seen[name] = true
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(filepath.Join(root, rel)); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = name
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(filepath.Join(root, rel))
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	}
	if !fi.IsDir() {
		return nil // fifos, sockets, devices: not build context
	}
	seen[filepath.ToSlash(rel)] = true
	return layertar.Write(tw, filepath.Join(root, rel), layertar.Options{Prefix: filepath.ToSlash(rel), Xattr: noXattr})
}

// noXattr: a build context's extended attributes do not travel.
func noXattr(string) bool { return false }
