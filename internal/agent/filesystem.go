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

	"github.com/cella-sandbox/cella/internal/agentapi"
	"github.com/cella-sandbox/cella/internal/envd/filesystem"
	"github.com/cella-sandbox/cella/internal/envd/filesystem/filesystemconnect"
	"github.com/cella-sandbox/cella/internal/errdefs"
)

// filesystemService implements filesystem.Filesystem. Unlike envd, which
// acts as root and chowns what it creates, every operation runs as the
// request's user (sandboxUser.do): paths resolve against that user's home,
// the kernel checks them as that user, and what it creates is owned by
// that user.
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
	// No syscall takes it (EINVAL, which reads as the agent's failure).
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("path %q contains a NUL byte", p)
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
		return nil, "", errdefs.Wrap(errdefs.KindInvalidArgument, err)
	}
	return u, abs, nil
}

func (fsvc filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (_ *connect.Response[filesystem.StatResponse], err error) {
	defer rpcError(&err)
	u, p, err := fsvc.userAndPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	names := fsvc.s.users.idNames()
	var e *filesystem.EntryInfo
	if err := u.do(func() (err error) { e, err = entryInfo(p, names); return err }); err != nil {
		return nil, fsError(u.denied("stat", p, err))
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

func (fsvc filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (_ *connect.Response[filesystem.MakeDirResponse], err error) {
	defer rpcError(&err)
	u, p, err := fsvc.userAndPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	names := fsvc.s.users.idNames()
	var e *filesystem.EntryInfo
	err = u.do(func() error {
		st, err := os.Stat(p)
		switch {
		case err == nil && st.IsDir():
			return errdefs.Conflict("directory already exists: %s", p)
		case err == nil:
			return errdefs.InvalidArgument("path already exists but it is not a directory: %s", p)
		case errors.Is(err, fs.ErrPermission):
			return fsError(u.denied("create", p, err))
		case !errors.Is(err, fs.ErrNotExist):
			return errdefs.Internal("error getting file info: %w", err)
		}
		if err := ensureDirs(p); err != nil {
			return fsError(u.denied("create", p, err))
		}
		if e, err = entryInfo(p, names); err != nil {
			return fsError(err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	fsvc.s.audit.emit(agentapi.AuditEvent{Kind: "file.mkdir", Path: p, User: u.Name})
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

func (fsvc filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (_ *connect.Response[filesystem.MoveResponse], err error) {
	defer rpcError(&err)
	u, src, err := fsvc.userAndPath(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	_, dst, err := fsvc.userAndPath(req.Header(), req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	names := fsvc.s.users.idNames()
	var e *filesystem.EntryInfo
	err = u.do(func() error {
		if _, err := os.Lstat(src); err != nil {
			return fsError(u.denied("move", src, err))
		}
		if err := ensureDirs(filepath.Dir(dst)); err != nil {
			return fsError(u.denied("create directories for", dst, err))
		}
		if err := os.Rename(src, dst); err != nil {
			return fsError(u.denied("move", src+" to "+dst, fmt.Errorf("rename %s to %s: %w", src, dst, err)))
		}
		if e, err = entryInfo(dst, names); err != nil {
			return fsError(err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	fsvc.s.audit.emit(agentapi.AuditEvent{Kind: "file.move", Path: src + " -> " + dst, User: u.Name})
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

func (fsvc filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (_ *connect.Response[filesystem.ListDirResponse], err error) {
	defer rpcError(&err)
	u, requested, err := fsvc.userAndPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	names := fsvc.s.users.idNames()
	var entries []*filesystem.EntryInfo
	err = u.do(func() (err error) {
		entries, err = listDir(requested, depth, names)
		return err
	})
	if err != nil {
		return nil, fsError(u.denied("list", requested, err))
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: entries}), nil
}

// listDir lists requested down to depth levels.
func listDir(requested string, depth int, names idNames) ([]*filesystem.EntryInfo, error) {
	resolved, err := filepath.EvalSymlinks(requested)
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(resolved)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, errdefs.InvalidArgument("path is not a directory: %s", requested)
	}
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
	return entries, err
}

func (fsvc filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (_ *connect.Response[filesystem.RemoveResponse], err error) {
	defer rpcError(&err)
	u, p, err := fsvc.userAndPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if err := u.do(func() error { return os.RemoveAll(p) }); err != nil {
		return nil, fsError(u.denied("remove", p, err))
	}
	fsvc.s.audit.emit(agentapi.AuditEvent{Kind: "file.remove", Path: p, User: u.Name})
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// entryInfo stats p without following a final symlink.
func entryInfo(p string, names idNames) (*filesystem.EntryInfo, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	return entryFromInfo(p, p, fi, names), nil
}

// entryFromInfo builds an EntryInfo; shown is the path reported, real the
// path on disk (they differ below a symlinked directory).
//
// A symlink is encoded as envd encodes it (every 0.5 and 0.6 version): the
// type and mode of what it finally points at, symlink_target the fully
// resolved path, permissions and size the link's own. A link whose target
// is missing or unreadable has no type (UNSPECIFIED, which the SDKs leave
// out of listings). FILE_TYPE_SYMLINK is never sent: older SDKs fail to
// parse it, newer ones drop the entry, so `files.list('/')` on a Debian
// root (/bin -> usr/bin) would break.
func entryFromInfo(shown, real string, fi fs.FileInfo, names idNames) *filesystem.EntryInfo {
	e := &filesystem.EntryInfo{
		Name:         filepath.Base(shown),
		Path:         shown,
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
		Metadata:     readMetadata(real),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = names.user(st.Uid)
		e.Group = names.group(st.Gid)
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		e.Type = fileType(fi)
		return e
	}
	target, err := filepath.EvalSymlinks(real)
	if err != nil {
		target = real // envd's fallback: the link's own path
	}
	e.SymlinkTarget = &target
	e.Mode = 0
	e.Type = filesystem.FileType_FILE_TYPE_UNSPECIFIED
	if ti, err := os.Stat(target); err == nil {
		e.Type = fileType(ti)
		e.Mode = uint32(ti.Mode().Perm())
	}
	return e
}

// fileType is the EntryInfo type of what fi describes (not a symlink).
func fileType(fi fs.FileInfo) filesystem.FileType {
	if fi.IsDir() {
		return filesystem.FileType_FILE_TYPE_DIRECTORY
	}
	// Devices, fifos and sockets are reported as files rather than
	// UNSPECIFIED, which the SDK would silently drop from listings.
	return filesystem.FileType_FILE_TYPE_FILE
}

// fsError gives a filesystem error its kind (its Connect code: rpcError).
func fsError(err error) error {
	switch {
	case errdefs.HasKind(err):
		return err // already given one
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.Wrap(errdefs.KindNotFound, err)
	case errors.Is(err, fs.ErrPermission):
		return errdefs.Wrap(errdefs.KindForbidden, err)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL):
		return errdefs.Wrap(errdefs.KindInvalidArgument, err)
	case errors.Is(err, syscall.ENOSPC):
		return errdefs.Wrap(errdefs.KindResourceExhausted, err)
	case errors.Is(err, syscall.ELOOP):
		return errdefs.Wrap(errdefs.KindFailedPrecondition, err)
	}
	return errdefs.Wrap(errdefs.KindInternal, err)
}

// ensureDirs creates dir and its missing parents (envd's EnsureDirs). Run
// as the user (sandboxUser.do), the directories it creates are the user's.
func ensureDirs(dir string) error {
	dir = filepath.Clean(dir)
	if st, err := os.Stat(dir); err == nil {
		if !st.IsDir() {
			return fmt.Errorf("path is a file: %s: %w", dir, syscall.ENOTDIR)
		}
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create directory: %w", err)
	}
	return nil
}
