package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cella-sandbox/cella/internal/envd/filesystem"
	"github.com/cella-sandbox/cella/internal/envd/filesystem/filesystemconnect"
)

// filesystemService implements filesystem.Filesystem. Like envd it acts as
// root on behalf of the request's user: paths resolve against that user's
// home and what it creates is owned by that user.
type filesystemService struct{ s *Server }

var _ filesystemconnect.FilesystemHandler = filesystemService{}

// resolve turns a request path into an absolute one for user u.
func (s *Server) resolve(p string, u *sandboxUser) (string, error) {
	if p == "" {
		p = s.config().DefaultWorkdir
	}
	if p == "" {
		p = u.Home
	}
	return expandPath(p, u.Home)
}

func (fsvc filesystemService) userAndPath(h http.Header, p string) (*sandboxUser, string, error) {
	u, err := fsvc.s.requestUser(h)
	if err != nil {
		return nil, "", err
	}
	abs, err := fsvc.s.resolve(p, u)
	if err != nil {
		return nil, "", connect.NewError(connect.CodeInvalidArgument, err)
	}
	return u, abs, nil
}

func (fsvc filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	_, p, err := fsvc.userAndPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := fsvc.s.entryInfo(p, fsvc.s.users.idNames())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

func (fsvc filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	u, p, err := fsvc.userAndPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(p)
	switch {
	case err == nil && st.IsDir():
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory already exists: %s", p))
	case err == nil:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path already exists but it is not a directory: %s", p))
	case !errors.Is(err, fs.ErrNotExist):
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("error getting file info: %w", err))
	}
	if err := ensureDirs(p, u); err != nil {
		return nil, fsError(err)
	}
	fsvc.s.audit.emit(AuditEvent{Kind: "file.mkdir", Path: p, User: u.Name})
	e, err := fsvc.s.entryInfo(p, fsvc.s.users.idNames())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

func (fsvc filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	u, src, err := fsvc.userAndPath(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	_, dst, err := fsvc.userAndPath(req.Header(), req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, fsError(err)
	}
	if err := ensureDirs(filepath.Dir(dst), u); err != nil {
		return nil, fsError(err)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, fsError(fmt.Errorf("rename %s to %s: %w", src, dst, err))
	}
	fsvc.s.audit.emit(AuditEvent{Kind: "file.move", Path: src + " -> " + dst, User: u.Name})
	e, err := fsvc.s.entryInfo(dst, fsvc.s.users.idNames())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

func (fsvc filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	_, requested, err := fsvc.userAndPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	resolved, err := filepath.EvalSymlinks(requested)
	if err != nil {
		return nil, fsError(err)
	}
	st, err := os.Stat(resolved)
	if err != nil {
		return nil, fsError(err)
	}
	if !st.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path is not a directory: %s", requested))
	}
	names := fsvc.s.users.idNames()
	var entries []*filesystem.EntryInfo
	err = filepath.WalkDir(resolved, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == resolved {
				return err
			}
			return nil // vanished or unreadable below the root: skip it
		}
		if p == resolved {
			return nil
		}
		rel, _ := filepath.Rel(resolved, p)
		if strings.Count(rel, string(filepath.Separator))+1 > depth {
			return filepath.SkipDir
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		// Paths are built from the requested path: symlinks in it are not
		// resolved in the answer.
		entries = append(entries, entryFromInfo(filepath.Join(requested, rel), p, fi, names))
		return nil
	})
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: entries}), nil
}

func (fsvc filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	u, p, err := fsvc.userAndPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(p); err != nil {
		return nil, fsError(err)
	}
	fsvc.s.audit.emit(AuditEvent{Kind: "file.remove", Path: p, User: u.Name})
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// entryInfo stats p without following a final symlink.
func (s *Server) entryInfo(p string, names idNames) (*filesystem.EntryInfo, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, fsError(err)
	}
	return entryFromInfo(p, p, fi, names), nil
}

// entryFromInfo builds an EntryInfo; shown is the path reported, real the
// path on disk (they differ below a symlinked directory).
func entryFromInfo(shown, real string, fi fs.FileInfo, names idNames) *filesystem.EntryInfo {
	e := &filesystem.EntryInfo{
		Name:         filepath.Base(shown),
		Path:         shown,
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = names.user(st.Uid)
		e.Group = names.group(st.Gid)
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = filesystem.FileType_FILE_TYPE_SYMLINK
		if target, err := filepath.EvalSymlinks(real); err == nil {
			e.SymlinkTarget = &target
		} else if target, err := os.Readlink(real); err == nil {
			e.SymlinkTarget = &target
		}
	case fi.IsDir():
		e.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
	default:
		// Devices, fifos and sockets are reported as files rather than
		// UNSPECIFIED, which the SDK would silently drop from listings.
		e.Type = filesystem.FileType_FILE_TYPE_FILE
	}
	return e
}

// fsError maps filesystem errors to Connect codes.
func fsError(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, fs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, syscall.ENOSPC):
		return connect.NewError(connect.CodeResourceExhausted, err)
	case errors.Is(err, syscall.ELOOP):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// ensureDirs creates dir and its missing parents, owned by u (envd's
// EnsureDirs): only the directories it creates are chowned.
func ensureDirs(dir string, u *sandboxUser) error {
	dir = filepath.Clean(dir)
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err == nil {
			if !st.IsDir() {
				return fmt.Errorf("path is a file: %s: %w", d, syscall.ENOTDIR)
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("stat %s: %w", d, err)
		}
		missing = append(missing, d)
		if d == "/" || d == "." {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create directory: %w", err)
		}
		if err := os.Lchown(missing[i], int(u.UID), int(u.GID)); err != nil {
			return fmt.Errorf("chown directory %s: %w", missing[i], err)
		}
	}
	return nil
}
