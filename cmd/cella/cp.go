package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cella-sandbox/cella/internal/client"
	"github.com/cella-sandbox/cella/internal/envd/filesystem"
)

var remoteRe = regexp.MustCompile(`^([a-z0-9]+):(.+)$`)

func newCpCmd() *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files or directories between the host and a sandbox (LOCAL ID:PATH or ID:PATH LOCAL)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient()
			if err != nil {
				return err
			}
			if m := remoteRe.FindStringSubmatch(args[1]); m != nil && !exists(args[1]) {
				return upload(cmd.Context(), c, args[0], m[1], m[2], user)
			}
			if m := remoteRe.FindStringSubmatch(args[0]); m != nil && !exists(args[0]) {
				return download(cmd.Context(), c, m[1], m[2], args[1], user)
			}
			return errors.New("one side must be ID:PATH, e.g. cella cp ./src abc123:/home/user/src")
		},
	}
	cmd.Flags().StringVar(&user, "user", "", "sandbox user that owns written files (default: the template's user)")
	return cmd
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

func upload(ctx context.Context, c *client.Client, local, id, remote, user string) error {
	st, err := os.Stat(local)
	if err != nil {
		return err
	}
	sb, err := c.Sandbox(ctx, id)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		if strings.HasSuffix(remote, "/") {
			remote = path.Join(remote, filepath.Base(local))
		}
		return sb.WriteFile(ctx, remote, user, f)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, local)) }()
	return sb.PutTar(ctx, remote, user, pr)
}

// writeTar archives the contents of dir (not dir itself).
func writeTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func download(ctx context.Context, c *client.Client, id, remote, local, user string) error {
	sb, err := c.Sandbox(ctx, id)
	if err != nil {
		return err
	}
	entry, err := sb.Stat(ctx, remote)
	if err != nil {
		return fmt.Errorf("stat %s:%s: %w", id, remote, err)
	}
	if entry.GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY {
		if st, err := os.Stat(local); err == nil && st.IsDir() {
			local = filepath.Join(local, path.Base(remote))
		}
		r, err := sb.ReadFile(ctx, remote, user)
		if err != nil {
			return err
		}
		defer r.Close()
		f, err := os.OpenFile(local, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	r, err := sb.GetTar(ctx, remote, user)
	if err != nil {
		return err
	}
	defer r.Close()
	return extractTar(r, local)
}

// extractTar unpacks into dir, refusing entries that would land outside it.
func extractTar(r io.Reader, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
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
		name := filepath.Clean(filepath.FromSlash(hdr.Name))
		if name == "." {
			continue
		}
		if !filepath.IsLocal(name) {
			return fmt.Errorf("tar entry %q points outside %s", hdr.Name, dir)
		}
		mode := fs.FileMode(hdr.Mode).Perm()
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, mode|0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := root.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				return err
			}
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := root.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				return err
			}
			_ = root.Remove(name)
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return err
			}
		}
	}
}
